"""The engine client and offline mode against the fake engine (fault injection only): the global
cap, overload backoff (Retry-After, give-up), per-line isolation and input order of run-batch."""

import asyncio
import io
import json
import random

import pytest

from gpu_worker.config import WorkerConfig
from gpu_worker.engine import EngineClient, EngineDown, RetryPolicy
from gpu_worker.offline import run_file
from infra import batchctl
from tests.fakes.engine import FakeEngine, chat_answer, content


@pytest.fixture
def fake():
    engine = FakeEngine().start()
    yield engine
    engine.stop()


def client(url, cap=4, **policy):
    return EngineClient(url, max_in_flight=cap, request_timeout=5, policy=RetryPolicy(
        **{"backoff_base_seconds": 0.01, "backoff_max_seconds": 0.1, **policy}))


def chat_line(i, url="/v1/chat/completions", **body):
    return json.dumps({"custom_id": f"req-{i}", "method": "POST", "url": url,
                       "body": {"model": "m", "messages": [{"role": "user", "content": f"hi {i}"}], **body}})


def test_config_from_env_and_the_default_cap():
    config = WorkerConfig.from_env({"WORKER_MODEL": "m", "WORKER_MAX_IN_FLIGHT": "", "WORKER_DRAIN_SECONDS": "5"})
    assert config.model == "m" and config.drain_seconds == 5 and config.in_flight_cap() == 512
    assert WorkerConfig(engine_max_num_seqs=128).in_flight_cap() == 256
    assert WorkerConfig(engine_max_num_seqs=128, max_in_flight=10).in_flight_cap() == 10
    assert WorkerConfig(max_in_flight=250).open_chunk_cap(100) == 5
    assert WorkerConfig(visibility_seconds=90).heartbeat_interval() == 30


def test_the_cap_holds_however_many_requests_wait(fake):
    async def respond(path, body, seen):
        await asyncio.sleep(0.05)
        return 200, chat_answer(body)

    fake.respond = respond

    async def go():
        async with client(fake.url, cap=5) as engine:
            replies = await asyncio.gather(*(engine.post("/v1/chat/completions", {"messages": [{"content": str(i)}]}) for i in range(40)))
        return replies

    replies = asyncio.run(go())
    assert all(r.status == 200 for r in replies) and fake.max_concurrent == 5


def test_retry_after_pauses_every_request(fake):
    calls = {"n": 0}

    def respond(path, body, seen):
        calls["n"] += 1
        if calls["n"] == 1:
            return 429, {"error": {"message": "slow down"}}, {"Retry-After": "0.3"}
        return 200, chat_answer(body)

    fake.respond = respond

    async def go():
        async with client(fake.url, cap=1, backoff_max_seconds=1.0) as engine:  # Retry-After is capped by it
            loop = asyncio.get_running_loop()
            start = loop.time()
            first = await engine.post("/v1/chat/completions", {"messages": [{"content": "a"}]})
            second = await engine.post("/v1/chat/completions", {"messages": [{"content": "b"}]})
            return first, second, loop.time() - start, engine.stats

    first, second, elapsed, stats = asyncio.run(go())
    assert first.status == second.status == 200 and first.attempts == 2
    assert elapsed >= 0.3 and stats.overloaded == 1


def test_an_overload_that_never_ends_gives_the_line_its_last_answer(fake):
    fake.respond = lambda path, body, seen: (503, {"error": {"message": "busy", "code": 503}})

    async def go():
        async with client(fake.url, overload_max_seconds=0.3) as engine:
            return await engine.post("/v1/chat/completions", {"messages": [{"content": "a"}]})

    reply = asyncio.run(go())
    assert reply.status == 503 and reply.body["error"]["message"] == "busy" and reply.attempts > 1


def test_an_engine_that_never_becomes_healthy(fake):
    fake.health_status = 503

    async def go():
        async with client(fake.url) as engine:
            await engine.wait_healthy(0.3, interval=0.05)

    with pytest.raises(EngineDown):
        asyncio.run(go())


def test_a_non_json_error_body_is_kept_as_a_message(fake):
    fake.respond = lambda path, body, seen: (502, "<html>bad gateway</html>")

    async def go():
        async with client(fake.url) as engine:
            src, out = io.BytesIO((chat_line(0) + "\n").encode()), io.BytesIO()
            return await run_file(engine, src, out), out.getvalue()

    summary, data = asyncio.run(go())
    line = json.loads(data)
    assert summary.failed == 1 and line["response"]["status_code"] == 502
    assert line["response"]["body"]["error"]["message"] == "<html>bad gateway</html>"


def test_run_batch_keeps_input_order_and_isolates_bad_lines(fake, tmp_path):
    async def respond(path, body, seen):
        await asyncio.sleep(random.uniform(0, 0.05))
        if content(body) == "hi 7":
            return 400, {"error": {"message": "too long", "type": "BadRequestError", "param": None, "code": 400}}
        return 200, chat_answer(body)

    fake.respond = respond
    lines = [chat_line(i) for i in range(30)]
    lines[3] = "{not json"
    lines[5] = chat_line(5, url="/v1/images/generations")
    lines[9] = chat_line(9, stream=True)
    lines.insert(12, "")  # blank lines are skipped
    (tmp_path / "in.jsonl").write_text("\n".join(lines) + "\n")
    code = batchctl.main([
        "run-batch", "-i", str(tmp_path / "in.jsonl"), "-o", str(tmp_path / "out.jsonl"),
        "--errors", str(tmp_path / "err.jsonl"), "--engine-url", fake.url, "--max-in-flight", "6",
    ], env={}, out=io.StringIO(), err=(err := io.StringIO()))
    assert code == 0, err.getvalue()
    out = [json.loads(l) for l in (tmp_path / "out.jsonl").read_text().splitlines()]
    errs = [json.loads(l) for l in (tmp_path / "err.jsonl").read_text().splitlines()]
    assert [l["custom_id"] for l in out] == [f"req-{i}" for i in range(30) if i not in (3, 5, 7, 9)]
    assert [(l["custom_id"], (l["error"] or {}).get("code")) for l in errs] == [
        ("line-4", "invalid_json_line"), ("req-5", "invalid_url"), ("req-7", None), ("req-9", "invalid_value"),
    ]
    assert errs[2]["response"]["status_code"] == 400 and errs[2]["response"]["body"]["error"]["message"] == "too long"
    assert fake.max_concurrent <= 6 and len(fake.requests) == 27
    assert "26 completed, 4 failed" in err.getvalue()


def test_run_batch_without_an_errors_file_writes_everything_in_input_order(fake, tmp_path):
    fake.respond = lambda path, body, seen: (500, {"error": {"message": "x"}}) if content(body) == "hi 1" else (200, chat_answer(body))
    (tmp_path / "in.jsonl").write_text("".join(chat_line(i) + "\n" for i in range(3)))
    code = batchctl.main(["run-batch", "-i", str(tmp_path / "in.jsonl"), "-o", str(tmp_path / "out.jsonl"),
                          "--engine-url", fake.url], env={}, out=io.StringIO(), err=io.StringIO())
    assert code == 0
    out = [json.loads(l) for l in (tmp_path / "out.jsonl").read_text().splitlines()]
    assert [(l["custom_id"], l["response"]["status_code"]) for l in out] == [("req-0", 200), ("req-1", 500), ("req-2", 200)]


def test_run_batch_memory_is_bounded_by_its_window(fake):
    """Lines are started at most `window` ahead of the oldest unfinished one."""
    started = []

    async def respond(path, body, seen):
        started.append(int(content(body).split()[-1]))
        if content(body) == "hi 0":
            await asyncio.sleep(0.3)  # the head of the line is slow
        return 200, chat_answer(body)

    fake.respond = respond

    async def go():
        async with client(fake.url, cap=4) as engine:
            src = io.BytesIO("".join(chat_line(i) + "\n" for i in range(50)).encode())
            return await run_file(engine, src, io.BytesIO(), window=8)

    assert asyncio.run(go()).completed == 50
    assert max(started[:8]) <= 7 and len(started) == 50


def test_run_batch_with_no_engine_fails_clearly(tmp_path):
    (tmp_path / "in.jsonl").write_text(chat_line(0) + "\n")
    err = io.StringIO()
    code = batchctl.main(["run-batch", "-i", str(tmp_path / "in.jsonl"), "-o", str(tmp_path / "o.jsonl"),
                          "--engine-url", "http://127.0.0.1:9", "--health-timeout", "0.5"], env={}, out=io.StringIO(), err=err)
    assert code == 1 and "not healthy" in err.getvalue()
