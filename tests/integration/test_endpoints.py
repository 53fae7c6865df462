"""Every endpoint the engine serves, through the official openai SDK, the local front (API
Gateway's rules) and the real handlers on moto (docs/engine.md, "Endpoints"): a ``/v1/responses``
batch and a ``/v1/score`` batch are accepted and routed to the model that serves them; an endpoint
no model of the deployment serves is refused naming the served ones; a model id with ``/`` is
retrieved as the SDK sends it (``%2F``) and with a literal slash. The engine's own answers on these
endpoints are in tests/e2e/test_endpoints_e2e.py (real vLLM)."""

import json

import openai
import pytest

from functions.core.settings import ModelRoute
from tests.integration.batch_helpers import run_ingest, submit, take_work

QWEN = "Qwen/Qwen2.5-7B-Instruct"
MODELS = {
    QWEN: ModelRoute(endpoints=("/v1/chat/completions", "/v1/completions", "/v1/responses")),
    "BAAI/bge-reranker-base": ModelRoute(endpoints=("/v1/score",)),
}
per_deployment = pytest.mark.settings(models=MODELS)


def request_line(i: int, url: str, model: str, **body) -> str:
    return json.dumps({"custom_id": f"req-{i}", "method": "POST", "url": url, "body": {"model": model, **body}})


@per_deployment
def test_a_responses_batch_and_a_score_batch_go_to_the_models_that_serve_them(client, deployed):
    responses = "\n".join(
        request_line(i, "/v1/responses", QWEN, input=f"hi {i}", instructions="Be brief.") for i in range(3)
    )
    score = request_line(0, "/v1/score", "BAAI/bge-reranker-base", text_1="q", text_2=["a", "b"])
    first = submit(client, (responses + "\n").encode(), endpoint="/v1/responses")
    second = submit(client, (score + "\n").encode(), endpoint="/v1/score")  # not in the SDK's Literal: sent as is
    assert (first.endpoint, second.endpoint) == ("/v1/responses", "/v1/score")
    assert run_ingest() == 2
    for batch, model, total in ((first, QWEN, 3), (second, "BAAI/bge-reranker-base", 1)):
        current = client.batches.retrieve(batch.id)
        assert current.status == "in_progress" and current.model == model and current.request_counts.total == total
        (work,) = take_work(deployed, model)
        assert work.batch_id == batch.id and work.endpoint == batch.endpoint and work.line_count == total


@per_deployment
def test_an_endpoint_no_model_serves_is_refused_naming_the_served_ones(client):
    f = client.files.create(file=("in.jsonl", (request_line(0, "/v1/rerank", QWEN) + "\n").encode()), purpose="batch")
    for endpoint in ("/v1/rerank", "/v1/embeddings", "/v1/moderations"):
        with pytest.raises(openai.BadRequestError) as refused:
            client.batches.create(input_file_id=f.id, endpoint=endpoint, completion_window="24h")
        assert refused.value.body["param"] == "endpoint"
        assert refused.value.body["message"] == (
            f"Invalid value for 'endpoint': {endpoint!r}. Supported values are: '/v1/chat/completions', "
            "'/v1/completions', '/v1/responses', '/v1/score'."
        )


@per_deployment
def test_a_model_id_with_a_slash_is_retrieved_as_the_sdk_sends_it(client, raw):
    model = client.models.retrieve(QWEN)  # the SDK sends /v1/models/Qwen%2FQwen2.5-7B-Instruct
    assert model.id == QWEN and model.object == "model"
    assert sorted(m.id for m in client.models.list()) == sorted(MODELS)
    literal = raw.get("/models/" + QWEN)  # a client that does not encode the slash
    assert literal.status_code == 200 and literal.json()["id"] == QWEN
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("Qwen/Qwen2.5-72B-Instruct")
    for missing in ("/models/Qwen", "/models/" + QWEN + "/extra"):
        response = raw.get(missing)
        assert response.status_code == 404 and response.json()["error"]["param"] == "model", missing
