"""Every endpoint the engine serves (docs/engine.md, "Endpoints"): which endpoints a deployment
serves (per model), the refusal naming them, each endpoint's body shape accepted, a line sent to
the engine at its own endpoint with its usage counted in either shape, and model ids with ``/``.
The real engine's answers are in tests/e2e/test_endpoints_e2e.py."""

import asyncio
import json

import pytest

from functions.api import batches, files, models
from functions.api.protocol import CreateBatchBody
from functions.core.chunk_lifecycle import Usage
from functions.core.errors import InvalidRequest, NotFound
from functions.core.lines import LineError, RawLine, check_request
from functions.core.settings import ModelRoute, Settings
from gpu_worker.line_runner import run_line
from tests.fakes.aws import fake_stores
from tests.fakes.engine import InProcessEngine
from tests.unit.test_entrypoint import run, started_and_stopped

NOW = 1_700_000_000
CHAT, COMPLETIONS, EMBEDDINGS = "/v1/chat/completions", "/v1/completions", "/v1/embeddings"
RESPONSES, SCORE, RERANK = "/v1/responses", "/v1/score", "/v1/rerank"

#: A deployment whose chat model serves responses and whose embeddings model serves score only.
SETTINGS = Settings(
    table_name="t",
    bucket_name="b",
    models={
        "Qwen/Qwen2.5-7B-Instruct": ModelRoute(endpoints=(CHAT, COMPLETIONS, RESPONSES)),
        "embed": ModelRoute(endpoints=(EMBEDDINGS, SCORE)),
    },
)


# --- which endpoints a deployment serves --------------------------------------------------------
def test_the_code_knows_openais_endpoints_vllms_score_and_rerank_and_the_audio_ones():
    assert Settings(table_name="t", bucket_name="b").allowed_endpoints == (
        CHAT,
        COMPLETIONS,
        EMBEDDINGS,
        RESPONSES,
        SCORE,
        RERANK,
        "/v1/audio/transcriptions",
        "/v1/audio/translations",
    )


def test_a_deployment_serves_the_allowed_endpoints_its_models_answer():
    assert SETTINGS.served_endpoints() == (CHAT, COMPLETIONS, EMBEDDINGS, RESPONSES, SCORE)  # no model: no rerank
    narrowed = SETTINGS.model_copy(update={"allowed_endpoints": (SCORE, CHAT)})
    assert narrowed.served_endpoints() == (SCORE, CHAT)  # allowed_endpoints' order; responses not allowed
    assert Settings(table_name="t", bucket_name="b").served_endpoints() == ()


def create(stores, endpoint: str):
    f = files.create_file(
        stores, SETTINGS, "acme", filename="in.jsonl", content=b"{}\n", purpose="batch", expires_after=None, now=NOW
    )
    body = CreateBatchBody(input_file_id=f.id, endpoint=endpoint, completion_window="24h")
    return batches.create_batch(stores, SETTINGS, "acme", body, now=NOW)


def test_a_batch_for_an_endpoint_no_model_serves_is_refused_naming_the_served_ones():
    stores = fake_stores()
    with pytest.raises(InvalidRequest) as refused:
        create(stores, RERANK)  # allowed by default, but no model of this deployment answers it
    assert refused.value.param == "endpoint" and refused.value.code == "invalid_value"
    assert refused.value.message == (
        "Invalid value for 'endpoint': '/v1/rerank'. Supported values are: '/v1/chat/completions', "
        "'/v1/completions', '/v1/embeddings', '/v1/responses', '/v1/score'."
    )


@pytest.mark.parametrize("endpoint", [RESPONSES, SCORE])
def test_a_batch_for_a_served_endpoint_is_created(endpoint):
    batch = create(fake_stores(), endpoint)
    assert batch.endpoint == endpoint and batch.status == "validating"


# --- each endpoint's body shape -----------------------------------------------------------------
BODIES = {
    CHAT: {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4},
    COMPLETIONS: {"prompt": "Once", "max_tokens": 4},
    EMBEDDINGS: {"input": ["a", "b"]},
    RESPONSES: {"instructions": "Be brief.", "input": [{"role": "user", "content": "hi"}], "max_output_tokens": 4},
    SCORE: {"text_1": "What is the capital of France?", "text_2": ["Paris.", "Bananas."]},
    RERANK: {"query": "What is the capital of France?", "documents": ["Paris.", "Bananas."], "top_n": 1},
}


@pytest.mark.parametrize("endpoint", sorted(BODIES))
def test_each_endpoints_body_shape_is_accepted(endpoint):
    line = {"custom_id": "c1", "method": "POST", "url": endpoint, "body": {"model": "org/m", **BODIES[endpoint]}}
    assert check_request(line, endpoint=endpoint) == ("c1", "org/m")


def test_a_line_whose_url_is_not_the_batchs_endpoint_names_it():
    line = {"custom_id": "c1", "method": "POST", "url": SCORE, "body": {"model": "m", **BODIES[SCORE]}}
    with pytest.raises(LineError) as wrong:
        check_request(line, endpoint=RESPONSES)
    assert wrong.value.code == "invalid_url" and wrong.value.param == "url"
    assert "'/v1/score'" in wrong.value.message and "'/v1/responses'" in wrong.value.message


# --- a line through the engine ------------------------------------------------------------------
#: What vLLM answers on /v1/responses (trimmed): usage in the Responses shape.
RESPONSE_BODY = {
    "id": "resp_1",
    "object": "response",
    "created_at": 1,
    "model": "m",
    "status": "completed",
    "output": [
        {
            "id": "msg_1",
            "type": "message",
            "role": "assistant",
            "status": "completed",
            "content": [{"type": "output_text", "text": "Hi", "annotations": []}],
        }
    ],
    "parallel_tool_calls": True,
    "tool_choice": "none",
    "tools": [],
    "usage": {
        "input_tokens": 739,
        "input_tokens_details": {"cached_tokens": 640},
        "output_tokens": 8,
        "output_tokens_details": {"reasoning_tokens": 5},
        "total_tokens": 747,
    },
}
#: What vLLM answers on /v1/score and /v1/rerank (usage in the chat shape, no completion).
SCORE_BODY = {
    "id": "score-1",
    "object": "list",
    "model": "m",
    "data": [{"index": 0, "object": "score", "score": 0.9}],
    "usage": {"prompt_tokens": 24, "total_tokens": 24, "completion_tokens": 0},
}
RERANK_BODY = {
    "id": "score-2",
    "model": "m",
    "results": [{"index": 0, "relevance_score": 0.9}],
    "usage": {"prompt_tokens": 12, "total_tokens": 12},
}


def test_each_line_goes_to_the_engine_at_its_endpoint_and_its_usage_counts_in_either_shape():
    answers = {RESPONSES: RESPONSE_BODY, SCORE: SCORE_BODY, RERANK: RERANK_BODY}
    engine = InProcessEngine(lambda path, body, seen: (200, answers[path]))
    usage = Usage()
    for number, endpoint in enumerate((RESPONSES, SCORE, RERANK), 1):
        obj = {"custom_id": f"c{number}", "method": "POST", "url": endpoint, "body": {"model": "m", **BODIES[endpoint]}}
        text = json.dumps(obj).encode()
        result = asyncio.run(run_line(engine, RawLine(number, 0, len(text) + 1, text), endpoint=endpoint))
        assert result.succeeded and result.line.response.body == answers[endpoint]
        usage.add_response(result.usage)
    assert [path for path, _ in engine.requests] == [RESPONSES, SCORE, RERANK]
    assert [body for _, body in engine.requests] == [{"model": "m", **BODIES[e]} for e in (RESPONSES, SCORE, RERANK)]
    assert usage.model_dump() == {
        "input_tokens": 739 + 24 + 12,
        "cached_tokens": 640,
        "output_tokens": 8,
        "reasoning_tokens": 5,
    }


@pytest.mark.parametrize("stream", [True, "True", 1, "yes"])
@pytest.mark.parametrize("endpoint", [CHAT, None])  # a batch's line, and run-batch's (offline: the line's own url)
def test_a_streaming_line_is_an_error_line_and_never_reaches_the_engine(stream, endpoint):
    engine = InProcessEngine(lambda path, body, seen: (200, {"usage": {}}))
    obj = {"custom_id": "c1", "method": "POST", "url": CHAT, "body": {"model": "m", **BODIES[CHAT], "stream": stream}}
    text = json.dumps(obj).encode()
    result = asyncio.run(run_line(engine, RawLine(1, 0, len(text) + 1, text), endpoint=endpoint, endpoints=(CHAT,)))
    assert not result.succeeded and engine.requests == []
    assert result.line.response is None and result.line.error.code == (
        "invalid_value" if stream is True else "invalid_type"
    )
    assert "body.stream" in result.line.error.message


# --- model ids with "/" -------------------------------------------------------------------------
@pytest.mark.parametrize(
    "path",
    [
        "/v1/models/Qwen%2FQwen2.5-7B-Instruct",  # what the openai SDK sends
        "/v1/models/Qwen/Qwen2.5-7B-Instruct",  # the slash decoded (API Gateway) or never encoded
        "/v1/models/Qwen%2fQwen2.5-7B-Instruct",  # lower-case hex
    ],
)
def test_a_model_id_with_a_slash_is_read_from_the_whole_path(path):
    assert models.model_id_from_path(path) == "Qwen/Qwen2.5-7B-Instruct"
    assert models.get_model(SETTINGS, models.model_id_from_path(path), created=1).id == "Qwen/Qwen2.5-7B-Instruct"


def test_a_model_id_that_is_only_a_prefix_of_a_served_one_is_404():
    for path in ("/v1/models/Qwen", "/v1/models/Qwen%2F", "/v1/models/Qwen/Qwen2.5-7B-Instruct/extra"):
        with pytest.raises(NotFound):
            models.get_model(SETTINGS, models.model_id_from_path(path), created=1)


# --- the GPU image asks vLLM for cached tokens ----------------------------------------------------
def test_the_engine_gets_prompt_token_details_once_even_when_engine_args_has_it(run):
    engine_argv = started_and_stopped(run, ENGINE_ARGS="--enable-prompt-tokens-details --max-model-len 4096")[0].split()
    assert engine_argv.count("--enable-prompt-tokens-details") == 1 and "--max-model-len" in engine_argv
