"""The engine client and offline mode against the fake engine (fault injection only): the global
cap, overload backoff (Retry-After, give-up), connection failures, the /health fallback, usage
totals, per-line isolation and input order of run-batch. Time is an injected clock and sleep:
no assertion depends on how fast this machine is."""

import asyncio
import io
import json
import random
import socket

import pytest

import batchctl
from functions.core.chunk_lifecycle import Usage
from gpu_worker.config import WorkerConfig
from gpu_worker.engine_client import EngineClient, EngineDown, RetryPolicy
from gpu_worker.offline import run_file
from tests.fakes.engine import DROP, FakeEngine, Streamed, chat_answer, content

#: Generous upper bound for a test's fake engine to reach a state; never reached when it passes.
PATIENCE = 10.0


@pytest.fixture
def fake():
    engine = FakeEngine().start()
    yield engine
    engine.stop()


class Clock:
    """An injected clock and sleep: a sleep is recorded and moves the clock on at once."""

    def __init__(self) -> None:
        self.now = 0.0
        self.sleeps: list[float] = []

    def __call__(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        target = self.now + seconds
        await asyncio.sleep(0)
        self.now = max(self.now, target)


def client(url, cap=4, clock=None, max_response_bytes=8 * 1024 * 1024, **policy):
    timing = {"clock": clock, "sleep": clock.sleep} if clock else {}
    return EngineClient(
        url,
        max_in_flight=cap,
        request_timeout=PATIENCE,
        max_response_bytes=max_response_bytes,
        policy=RetryPolicy(**{"backoff_base_seconds": 0.01, "backoff_max_seconds": 0.1, **policy}),
        **timing,
    )


def chat_line(i, url="/v1/chat/completions", **body):
    return json.dumps(
        {
            "custom_id": f"req-{i}",
            "method": "POST",
            "url": url,
            "body": {"model": "m", "messages": [{"role": "user", "content": f"hi {i}"}], **body},
        }
    )


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def until(predicate, what):
    """Wait (in the fake engine's loop) until predicate() holds; fails the test after PATIENCE."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + PATIENCE
    while not predicate():
        if loop.time() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.001)


# --- configuration: spec values -----------------------------------------------------------------
def test_config_from_env_and_the_default_cap():
    config = WorkerConfig.from_env({"WORKER_MODEL": "m", "WORKER_MAX_IN_FLIGHT": "", "WORKER_DRAIN_SECONDS": "5"})
    # the default cap is 2 x vLLM's default max_num_seqs (256)
    assert config.model == "m" and config.drain_seconds == 5 and config.in_flight_cap() == 512
    assert WorkerConfig(engine_max_num_seqs=256).in_flight_cap() == 512
    assert WorkerConfig(engine_max_num_seqs=128).in_flight_cap() == 256
    assert WorkerConfig(engine_max_num_seqs=128, max_in_flight=10).in_flight_cap() == 10
    # enough chunks to fill the cap (250 lines in chunks of 100: 3), plus two
    assert WorkerConfig(max_in_flight=250).open_chunk_cap(100) == 5
    assert WorkerConfig(visibility_seconds=90).heartbeat_interval() == 30  # a third of the visibility
    assert WorkerConfig(visibility_seconds=90, heartbeat_seconds=7).heartbeat_interval() == 7


def test_the_client_built_from_config_takes_its_cap_and_policy():
    engine = EngineClient.from_config(
        WorkerConfig(
            engine_max_num_seqs=256,
            max_attempts=3,
            backoff_base_seconds=2,
            backoff_max_seconds=9,
            overload_max_seconds=60,
        )
    )
    assert engine.max_in_flight == 512
    assert engine.policy == RetryPolicy(
        max_attempts=3, backoff_base_seconds=2, backoff_max_seconds=9, overload_max_seconds=60
    )


def test_backoff_is_exponential_jittered_and_capped():
    policy = RetryPolicy(backoff_base_seconds=1.0, backoff_max_seconds=30.0)
    random.seed(7)
    for attempt, full in ((1, 1.0), (2, 2.0), (3, 4.0), (4, 8.0), (6, 30.0), (20, 30.0)):
        for _ in range(50):
            assert full / 2 <= policy.delay(attempt) <= full  # jitter: between half and all of it


# --- the global cap ---------------------------------------------------------------------------
def test_the_cap_holds_however_many_requests_wait(fake):
    clients = []

    async def respond(path, body, seen):
        # The first requests are answered only once every one of the 40 is either open here or
        # waiting for a slot in the client: the client has sent all it will send at once,
        # whatever this machine's speed. The rest are answered at once.
        await until(lambda: not clients or fake.open + clients[0].waiting >= 40, "every request sent or waiting")
        clients.clear()
        return 200, chat_answer(body)

    fake.respond = respond

    async def go():
        async with client(fake.url, cap=5) as engine:
            clients.append(engine)
            return await asyncio.gather(
                *(engine.post("/v1/chat/completions", {"messages": [{"content": str(i)}]}) for i in range(40))
            )

    replies = asyncio.run(go())
    assert all(r.status == 200 for r in replies) and fake.max_concurrent == 5 and len(fake.requests) == 40


# --- overload: 429 / 503 ----------------------------------------------------------------------
def test_retry_after_pauses_the_line_for_that_long(fake):
    def respond(path, body, seen):
        if seen == 0 and content(body) == "a":
            return 429, {"error": {"message": "slow down"}}, {"Retry-After": "0.3"}
        return 200, chat_answer(body)

    fake.respond = respond
    clock = Clock()

    async def go():
        async with client(fake.url, cap=1, clock=clock, backoff_max_seconds=1.0) as engine:
            first = await engine.post("/v1/chat/completions", {"messages": [{"content": "a"}]})
            second = await engine.post("/v1/chat/completions", {"messages": [{"content": "b"}]})
            return first, second, engine.stats

    first, second, stats = asyncio.run(go())
    assert first.status == second.status == 200 and first.attempts == 2 and second.attempts == 1
    assert clock.sleeps == [0.3]  # the Retry-After pause, once; the later request waits no more
    assert stats.overloaded == 1 and stats.overload_wait_seconds == pytest.approx(0.3)


def test_retry_after_pauses_every_request_sent_while_it_lasts(fake):
    def respond(path, body, seen):
        if seen == 0 and content(body) == "a":
            return 503, {"error": {"message": "busy"}}, {"Retry-After": "5"}
        return 200, chat_answer(body)

    fake.respond = respond
    clock = Clock()
    later: list[asyncio.Future] = []

    async def go():
        async with client(fake.url, cap=2, clock=clock, backoff_max_seconds=30.0) as engine:
            real_sleep = clock.sleep

            async def sleep(seconds):
                if not later:  # "a" is paused: another line arrives meanwhile
                    later.append(
                        asyncio.ensure_future(engine.post("/v1/chat/completions", {"messages": [{"content": "c"}]}))
                    )
                    while not clock.sleeps and not later[0].done():  # until "c" is at the gate (or sent)
                        await asyncio.sleep(0)
                await real_sleep(seconds)

            engine._sleep = sleep
            a = await engine.post("/v1/chat/completions", {"messages": [{"content": "a"}]})
            return a, await later[0]

    a, c = asyncio.run(go())
    assert a.status == c.status == 200 and a.attempts == 2 and c.attempts == 1
    assert sorted(clock.sleeps) == [5.0, 5.0]  # "c" was held at the gate as long as "a"
    assert sorted(fake.contents()) == ["a", "a", "c"]


def test_retry_after_is_capped_by_the_longest_backoff(fake):
    fake.respond = lambda path, body, seen: (429, {}, {"Retry-After": "120"}) if seen == 0 else (200, chat_answer(body))
    clock = Clock()

    async def go():
        async with client(fake.url, clock=clock, backoff_max_seconds=30.0) as engine:
            return await engine.post("/v1/chat/completions", {"messages": [{"content": "a"}]})

    assert asyncio.run(go()).status == 200 and clock.sleeps == [30.0]


@pytest.mark.parametrize("retry_after", ["Wed, 21 Oct 2015 07:28:00 GMT", "soon", "-", None])
def test_a_retry_after_that_is_not_seconds_falls_back_to_backoff(fake, retry_after):
    headers = {"Retry-After": retry_after} if retry_after is not None else {}
    fake.respond = lambda path, body, seen: (429, {}, headers) if seen < 2 else (200, chat_answer(body))
    clock = Clock()

    async def go():
        async with client(fake.url, clock=clock, backoff_base_seconds=1.0, backoff_max_seconds=30.0) as engine:
            return await engine.post("/v1/chat/completions", {"messages": [{"content": "a"}]})

    reply = asyncio.run(go())
    assert reply.status == 200 and reply.attempts == 3
    first, second = clock.sleeps  # the backoff of 1, then 2 overload answers in a row, jittered
    assert 0.5 <= first <= 1.0 and 1.0 <= second <= 2.0


def test_an_overload_that_never_ends_gives_the_line_its_last_answer(fake):
    fake.respond = lambda path, body, seen: (503, {"error": {"message": "busy", "code": 503}}, {"Retry-After": "1"})
    clock = Clock()

    async def go():
        async with client(fake.url, clock=clock, overload_max_seconds=10, backoff_max_seconds=30) as engine:
            return await engine.post("/v1/chat/completions", {"messages": [{"content": "a"}]})

    reply = asyncio.run(go())
    assert reply.status == 503 and reply.body["error"]["message"] == "busy"
    assert clock.sleeps == [1.0] * 10 and reply.attempts == 11  # retried for 10 s, then its answer


# --- connection failures and health -----------------------------------------------------------
def test_dropped_connections_are_retried_with_backoff_then_become_an_error_line(fake):
    fake.respond = lambda path, body, seen: DROP
    clock = Clock()

    async def go():
        async with client(
            fake.url, clock=clock, max_attempts=3, backoff_base_seconds=1.0, backoff_max_seconds=30.0
        ) as engine:
            src, out = io.BytesIO((chat_line(0) + "\n").encode()), io.BytesIO()
            return await run_file(engine, src, out), out.getvalue(), engine.stats

    summary, data, stats = asyncio.run(go())
    line = json.loads(data)
    assert summary.failed == 1 and line["response"] is None
    assert line["error"]["code"] == "engine_connection_error" and "3 attempts" in line["error"]["message"]
    assert len(fake.requests) == 3 and stats.connection_errors == 3 and stats.retries == 2
    first, second = clock.sleeps
    assert 0.5 <= first <= 1.0 and 1.0 <= second <= 2.0
    assert fake.probes == ["/health"]  # the engine still answers: the request is the problem


def test_a_refused_connection_with_no_health_is_engine_down():
    clock = Clock()

    stats = []

    async def go():
        async with client(f"http://127.0.0.1:{closed_port()}", clock=clock, max_attempts=4) as engine:
            stats.append(engine.stats)
            await engine.post("/v1/chat/completions", {"messages": [{"content": "a"}]})

    with pytest.raises(EngineDown, match="/health does not answer"):
        asyncio.run(go())
    assert stats[0].connection_errors == 4 and len(clock.sleeps) == 3  # 4 attempts, then the verdict


def test_an_engine_that_never_becomes_healthy(fake):
    fake.health_status = 503
    clock = Clock()

    async def go():
        async with client(fake.url, clock=clock) as engine:
            await engine.wait_healthy(3, interval=1)

    with pytest.raises(EngineDown, match="not healthy within 3 s"):
        asyncio.run(go())
    assert clock.sleeps == [1, 1, 1] and fake.probes == ["/health"] * 4


def test_wait_healthy_returns_the_time_waited(fake):
    fake.health_status = 503
    clock = Clock()

    async def go():
        async with client(fake.url, clock=clock) as engine:
            real_sleep = clock.sleep

            async def sleep(seconds):
                await real_sleep(seconds)
                if len(clock.sleeps) == 2:
                    fake.health_status = 200

            engine._sleep = sleep
            return await engine.wait_healthy(60, interval=5)

    assert asyncio.run(go()) == 10


def test_an_engine_without_health_counts_as_healthy_if_it_lists_models(fake):
    async def healthy():
        async with client(fake.url) as engine:
            return await engine.healthy()

    fake.health_status = 404
    assert asyncio.run(healthy()) is True
    assert fake.probes == ["/health", "/v1/models"]
    fake.models_status = 500
    assert asyncio.run(healthy()) is False
    fake.health_status = 500  # a /health that exists but fails: no fallback
    fake.models_status = 200
    fake.probes.clear()
    assert asyncio.run(healthy()) is False and fake.probes == ["/health"]


# --- results ----------------------------------------------------------------------------------
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


def _run_lines(fake, n, **client_args):
    async def go():
        async with client(fake.url, **client_args) as engine:
            src, out = io.BytesIO("".join(chat_line(i) + "\n" for i in range(n)).encode()), io.BytesIO()
            summary = await run_file(engine, src, out)
            return summary, [json.loads(x) for x in out.getvalue().splitlines()], engine.stats

    return asyncio.run(go())


def test_the_default_response_bound_is_8_mib():
    assert EngineClient("http://127.0.0.1:1", max_in_flight=1).max_response_bytes == 8 * 1024 * 1024


@pytest.mark.parametrize("streamed", [False, True], ids=["content-length", "chunked"])
def test_an_answer_over_the_bound_is_an_error_line_and_is_not_retried(fake, streamed):
    """An answer over a 256 KiB bound: 1 MiB declared (Content-Length), or 64 MiB chunked with no
    length (the reader stops: far less than 64 MiB is ever sent)."""
    bound = 256 * 1024
    huge = Streamed(pieces=1024) if streamed else "x" * (1024 * 1024)
    fake.respond = lambda path, body, seen: (200, huge) if content(body) == "hi 1" else (200, chat_answer(body))
    summary, lines, stats = _run_lines(fake, 3, max_response_bytes=bound)
    assert (summary.completed, summary.failed) == (2, 1)
    big = lines[1]
    assert big["custom_id"] == "req-1" and big["response"] is None
    assert big["error"]["code"] == "response_too_large" and str(bound) in big["error"]["message"]
    assert [line["response"]["status_code"] for line in (lines[0], lines[2])] == [200, 200]
    assert fake.contents().count("hi 1") == 1 and stats.too_large == 1 and stats.retries == 0
    if streamed:
        assert huge.sent < huge.pieces  # the reader stopped; the rest was never sent


def test_an_answer_exactly_at_the_bound_is_read(fake):
    bound = 64 * 1024
    fake.respond = lambda path, body, seen: (500, "y" * bound)
    summary, lines, stats = _run_lines(fake, 1, max_response_bytes=bound)
    assert summary.failed == 1 and lines[0]["response"]["status_code"] == 500
    assert lines[0]["response"]["body"]["error"]["message"] == "y" * bound and stats.too_large == 0


def test_usage_totals_include_cached_and_reasoning_tokens(fake):
    def respond(path, body, seen):
        if content(body) == "hi 2":  # a rejected line's usage (if any) is not counted
            return 400, {"error": {"message": "no"}, "usage": {"prompt_tokens": 1000, "completion_tokens": 1000}}
        answer = chat_answer(body, completion_tokens=5, prompt_tokens=20)
        answer["usage"]["prompt_tokens_details"] = {"cached_tokens": 16}
        answer["usage"]["completion_tokens_details"] = {"reasoning_tokens": 3}
        return 200, answer

    fake.respond = respond

    async def go():
        async with client(fake.url) as engine:
            src = io.BytesIO("".join(chat_line(i) + "\n" for i in range(4)).encode())
            return await run_file(engine, src, io.BytesIO())

    summary = asyncio.run(go())
    assert (summary.completed, summary.failed) == (3, 1)
    assert summary.usage == Usage(input_tokens=60, cached_tokens=48, output_tokens=15, reasoning_tokens=9)


def test_run_batch_keeps_input_order_and_isolates_bad_lines(fake, tmp_path):
    async def respond(path, body, seen):
        await asyncio.sleep(random.uniform(0, 0.05))  # answers arrive out of order
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
    code = batchctl.main(
        [
            "run-batch",
            "-i",
            str(tmp_path / "in.jsonl"),
            "-o",
            str(tmp_path / "out.jsonl"),
            "--errors",
            str(tmp_path / "err.jsonl"),
            "--engine-url",
            fake.url,
            "--max-in-flight",
            "6",
        ],
        env={},
        out=io.StringIO(),
        err=(err := io.StringIO()),
    )
    assert code == 0, err.getvalue()
    out = [json.loads(l) for l in (tmp_path / "out.jsonl").read_text().splitlines()]
    errs = [json.loads(l) for l in (tmp_path / "err.jsonl").read_text().splitlines()]
    assert [l["custom_id"] for l in out] == [f"req-{i}" for i in range(30) if i not in (3, 5, 7, 9)]
    assert [(l["custom_id"], (l["error"] or {}).get("code")) for l in errs] == [
        ("line-4", "invalid_json_line"),
        ("req-5", "invalid_url"),
        ("req-7", None),
        ("req-9", "invalid_value"),
    ]
    assert errs[2]["response"]["status_code"] == 400 and errs[2]["response"]["body"]["error"]["message"] == "too long"
    assert fake.max_concurrent <= 6 and len(fake.requests) == 27
    assert "26 completed, 4 failed" in err.getvalue()


def test_run_batch_without_an_errors_file_writes_everything_in_input_order(fake, tmp_path):
    fake.respond = lambda path, body, seen: (
        (500, {"error": {"message": "x"}}) if content(body) == "hi 1" else (200, chat_answer(body))
    )
    (tmp_path / "in.jsonl").write_text("".join(chat_line(i) + "\n" for i in range(3)))
    code = batchctl.main(
        ["run-batch", "-i", str(tmp_path / "in.jsonl"), "-o", str(tmp_path / "out.jsonl"), "--engine-url", fake.url],
        env={},
        out=io.StringIO(),
        err=io.StringIO(),
    )
    assert code == 0
    out = [json.loads(l) for l in (tmp_path / "out.jsonl").read_text().splitlines()]
    assert [(l["custom_id"], l["response"]["status_code"]) for l in out] == [
        ("req-0", 200),
        ("req-1", 500),
        ("req-2", 200),
    ]


def test_run_batch_memory_is_bounded_by_its_window(fake):
    """With a cap of 8 and a window of 8, no line past the window (line 8 on) is handed to the
    engine before the slow head of the line (line 0) is answered, however fast the others are."""
    events: list[tuple[str, int]] = []

    class Recording:
        """The real client, with every hand-over and answer recorded (client side)."""

        def __init__(self, engine):
            self.engine, self.max_in_flight = engine, engine.max_in_flight

        async def post(self, path, body):
            i = int(content(body).split()[-1])
            events.append(("start", i))
            reply = await self.engine.post(path, body)
            events.append(("end", i))
            return reply

    async def respond(path, body, seen):
        if content(body) == "hi 0":  # the head of the line answers only once lines 1-7 have
            await until(lambda: len(fake.requests) >= 8 and fake.open == 1, "lines 1-7 answered")
        return 200, chat_answer(body)

    fake.respond = respond

    async def go():
        async with client(fake.url, cap=8) as engine:
            src = io.BytesIO("".join(chat_line(i) + "\n" for i in range(50)).encode())
            return await run_file(Recording(engine), src, io.BytesIO(), window=8)

    assert asyncio.run(go()).completed == 50
    head_done = events.index(("end", 0))
    assert {i for kind, i in events[:head_done] if kind == "start"} == set(range(8))
    assert sorted(i for kind, i in events if kind == "start") == list(range(50))


def test_run_batch_with_no_engine_fails_clearly(tmp_path):
    (tmp_path / "in.jsonl").write_text(chat_line(0) + "\n")
    err = io.StringIO()
    code = batchctl.main(
        [
            "run-batch",
            "-i",
            str(tmp_path / "in.jsonl"),
            "-o",
            str(tmp_path / "o.jsonl"),
            "--engine-url",
            f"http://127.0.0.1:{closed_port()}",
            "--health-timeout",
            "0.5",
        ],
        env={},
        out=io.StringIO(),
        err=err,
    )
    assert code == 1 and "not healthy" in err.getvalue()


def test_the_client_is_the_engine_port():
    """gpu_worker.engine_client.EngineClient provides functions.core.ports.Engine (what the chunk path
    is typed against), and its Reply everything ports.EngineReply names."""
    import inspect

    from functions.core.ports import Engine, EngineReply
    from gpu_worker.engine_client import Reply

    for name in ("healthy", "wait_healthy", "post"):
        port, impl = getattr(Engine, name), getattr(EngineClient, name)
        assert inspect.iscoroutinefunction(impl), name
        assert list(inspect.signature(impl).parameters) == list(inspect.signature(port).parameters), name
    reply = Reply(200, {}, "req_1")
    assert all(hasattr(reply, field) for field in EngineReply.__annotations__)


def test_run_batch_of_an_empty_file_writes_an_empty_output(fake, tmp_path):
    """vLLM's ``test_empty_file``: exit 0, nothing in the output, nothing sent to the engine."""
    (tmp_path / "in.jsonl").write_text("")
    argv = ["run-batch", "-i", str(tmp_path / "in.jsonl"), "-o", str(tmp_path / "out.jsonl"), "--engine-url", fake.url]
    code = batchctl.main(argv, env={}, out=io.StringIO(), err=(err := io.StringIO()))
    assert code == 0, err.getvalue()
    assert (tmp_path / "out.jsonl").read_text() == "" and fake.requests == []
    assert "0 completed, 0 failed" in err.getvalue()
