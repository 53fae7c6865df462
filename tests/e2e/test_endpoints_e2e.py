"""Every endpoint the engine serves, through the official openai SDK with the real engine
(docs/engine.md, "Endpoints"): ``/v1/responses`` batches (results validated as the SDK's
``Response``, usage as OpenAI's), cached tokens from vLLM's prefix caching on lines that share a
long system prompt, ``/v1/score`` and ``/v1/rerank`` batches on the local embeddings model, and an
endpoint no model of the deployment serves refused with the served ones named.

The SDK's ``batches.create`` types ``endpoint`` as a Literal of OpenAI's endpoints, which has
``/v1/responses`` but not vLLM's ``/v1/score`` and ``/v1/rerank``: the SDK sends any string (the
Literal is for type checkers only), so those tests pass the string as it is.

Greedy text differs between runs: assert structure, counts and usage, never text."""

import json
import uuid

import openai
import pytest
from openai import OpenAI
from openai.types.chat import ChatCompletion
from openai.types.responses import Response

from functions.core.wire import BatchOutputLine
from infra import names

from .test_batches_e2e import lines, sdk, submit, wait

pytestmark = [pytest.mark.e2e, pytest.mark.engine, pytest.mark.slow]

CHAT, EMBED = names.LOCAL_CHAT_MODEL, names.LOCAL_EMBED_MODEL
#: Lines per batch: all share one long system prompt.
LINES = 8


def long_system_prompt() -> str:
    """About 700 tokens (SmolLM2's tokenizer), new per call so that only the lines of one batch can
    have cached it (vLLM caches whole 16-token blocks of a shared prefix)."""
    return f"Session {uuid.uuid4()}. " + "You are a careful assistant who answers briefly and politely. " * 60


def body_of(line: BatchOutputLine) -> dict:
    assert line.error is None and line.response is not None and line.response.status_code == 200, line
    return line.response.body


def test_a_responses_batch_has_openais_shapes_and_cached_tokens(sdk: OpenAI, chat_model: str):
    system = long_system_prompt()
    rows = [
        {
            "custom_id": f"resp-{i}",
            "method": "POST",
            "url": "/v1/responses",
            "body": {
                "model": chat_model,
                "instructions": system,
                "input": f"Question {i}: name a colour.",
                "max_output_tokens": 8,
                "temperature": 0,
            },
        }
        for i in range(LINES)
    ]
    batch = wait(sdk, submit(sdk, rows, endpoint="/v1/responses").id, timeout=120)
    assert batch.status == "completed" and batch.endpoint == "/v1/responses", batch
    assert (batch.request_counts.total, batch.request_counts.completed, batch.request_counts.failed) == (
        LINES,
        LINES,
        0,
    )
    results = lines(sdk, batch.output_file_id)
    assert sorted(r.custom_id for r in results) == sorted(r["custom_id"] for r in rows)
    responses = [Response.model_validate(body_of(r)) for r in results]  # the SDK's own type
    for response in responses:
        assert response.object == "response" and response.model == chat_model
        assert response.output and response.output[0].type == "message" and response.output_text
        assert response.usage.input_tokens > 600 and 0 < response.usage.output_tokens <= 8
    # The batch's usage is the sum of its lines' (input_tokens/output_tokens: the Responses shape).
    assert batch.usage.input_tokens == sum(r.usage.input_tokens for r in responses)
    assert batch.usage.output_tokens == sum(r.usage.output_tokens for r in responses)
    cached = sum(r.usage.input_tokens_details.cached_tokens for r in responses)
    assert batch.usage.input_tokens_details.cached_tokens == cached > 0
    assert batch.usage.output_tokens_details.reasoning_tokens == sum(
        r.usage.output_tokens_details.reasoning_tokens for r in responses
    )


def test_a_chat_batch_sharing_a_system_prompt_reports_cached_tokens(sdk: OpenAI, chat_model: str):
    system = long_system_prompt()
    rows = [
        {
            "custom_id": f"chat-{i}",
            "method": "POST",
            "url": "/v1/chat/completions",
            "body": {
                "model": chat_model,
                "max_tokens": 4,
                "temperature": 0,
                "messages": [{"role": "system", "content": system}, {"role": "user", "content": f"Number {i}?"}],
            },
        }
        for i in range(LINES)
    ]
    batch = wait(sdk, submit(sdk, rows).id, timeout=120)
    assert batch.status == "completed" and batch.request_counts.completed == LINES, batch
    completions = [ChatCompletion.model_validate(body_of(r)) for r in lines(sdk, batch.output_file_id)]
    cached = sum(c.usage.prompt_tokens_details.cached_tokens for c in completions)
    assert batch.usage.input_tokens_details.cached_tokens == cached > 0
    assert batch.usage.input_tokens == sum(c.usage.prompt_tokens for c in completions)


@pytest.mark.local_only("the local embeddings model serves score and rerank; a stack's models may not")
def test_score_and_rerank_batches_on_the_embeddings_model(sdk: OpenAI):
    query = "What is the capital of France?"
    related, unrelated = "Paris is the capital of France.", "Bananas are yellow and curved."
    score_rows = [
        {
            "custom_id": "score-0",
            "method": "POST",
            "url": "/v1/score",
            "body": {"model": EMBED, "text_1": query, "text_2": [unrelated, related]},
        },
        {
            "custom_id": "score-1",
            "method": "POST",
            "url": "/v1/score",
            "body": {"model": EMBED, "text_1": "A cat sat on the mat.", "text_2": "A kitten rested on a rug."},
        },
    ]
    rerank_rows = [
        {
            "custom_id": "rerank-0",
            "method": "POST",
            "url": "/v1/rerank",
            "body": {"model": EMBED, "query": query, "documents": [unrelated, related, "France is in Europe."]},
        },
    ]
    score_id = submit(sdk, score_rows, endpoint="/v1/score").id  # not in the SDK's Literal: sent as is
    rerank_id = submit(sdk, rerank_rows, endpoint="/v1/rerank").id
    score_batch, rerank_batch = wait(sdk, score_id, timeout=120), wait(sdk, rerank_id, timeout=120)
    assert score_batch.status == rerank_batch.status == "completed", (score_batch, rerank_batch)
    assert score_batch.request_counts.completed == 2 and rerank_batch.request_counts.completed == 1
    scores = {r.custom_id: body_of(r) for r in lines(sdk, score_batch.output_file_id)}
    first = scores["score-0"]
    assert first["object"] == "list" and [d["index"] for d in first["data"]] == [0, 1]
    assert first["data"][1]["score"] > first["data"][0]["score"]  # related above unrelated
    assert len(scores["score-1"]["data"]) == 1 and -1.0 <= scores["score-1"]["data"][0]["score"] <= 1.0
    assert score_batch.usage.input_tokens == sum(b["usage"]["prompt_tokens"] for b in scores.values()) > 0
    (rerank,) = [body_of(r) for r in lines(sdk, rerank_batch.output_file_id)]
    relevance = [r["relevance_score"] for r in rerank["results"]]
    assert sorted(r["index"] for r in rerank["results"]) == [0, 1, 2] and relevance == sorted(relevance, reverse=True)
    assert rerank["results"][-1]["index"] == 0  # the unrelated document is last
    assert rerank_batch.usage.input_tokens == rerank["usage"]["prompt_tokens"] > 0


@pytest.mark.local_only("names the endpoints the local deployment's models serve")
def test_an_endpoint_no_model_serves_is_refused_naming_the_served_ones(sdk: OpenAI):
    f = sdk.files.create(file=("in.jsonl", json.dumps({"custom_id": "a"}).encode() + b"\n"), purpose="batch")
    with pytest.raises(openai.BadRequestError) as refused:
        sdk.batches.create(input_file_id=f.id, endpoint="/v1/moderations", completion_window="24h")
    message = refused.value.body["message"]
    assert refused.value.body["param"] == "endpoint" and "'/v1/moderations'" in message
    for served in (
        "/v1/chat/completions",
        "/v1/completions",
        "/v1/embeddings",
        "/v1/responses",
        "/v1/score",
        "/v1/rerank",
        "/v1/audio/transcriptions",
        "/v1/audio/translations",
    ):
        assert f"'{served}'" in message
