"""The worker loop (``gpu_worker.loop.Worker``) against in-memory fakes: the queue and stores of
tests/fakes/aws.py and an in-process engine. What becomes of a malformed message, a chunk that
fails, a running chunk's visibility (the heartbeat, on an injected sleep), a lost receipt; the
media allowlist the worker is built with (from the settings too) reaching its chunks' lines; and
the process's exit codes. Nothing here waits on wall-clock time for its verdict."""

import asyncio
import base64
import dataclasses
import json
import os
import socket
import sys
import threading

import pytest

from functions.core import schema
from functions.core.messages import WorkMessage
from functions.core.wire import BatchOutputLine
from gpu_worker import __main__ as worker_main
from gpu_worker.__main__ import build_worker, main
from gpu_worker.config import WorkerConfig
from gpu_worker.loop import Worker
from gpu_worker.metrics import WorkerMetrics
from tests.builders import cut, running_batch
from tests.chunks import part_bytes
from tests.conftest import TEST_SETTINGS
from tests.fakes.aws import FakeQueue, fake_stores
from tests.fakes.engine import InProcessEngine, chat_answer

CHAT = "/v1/chat/completions"
NOW = 1_800_000_000
#: Upper bound for a condition a test waits for; never reached when the test passes.
PATIENCE = 20.0
#: Distinct from every default, so an assertion on it cannot pass by accident.
RETRY_AFTER_FAILURE = 37


def line(i: int) -> str:
    return json.dumps(
        {
            "custom_id": f"req-{i}",
            "method": "POST",
            "url": CHAT,
            "body": {"model": "test-chat", "messages": [{"role": "user", "content": f"hi {i}"}]},
        }
    )


def seed(stores, n: int, per_chunk: int) -> list[WorkMessage]:
    """An in_progress batch of n chat lines and the work messages of its chunks."""
    lines = [(line(i) + "\n").encode() for i in range(n)]
    key = schema.batch_input_key("acme", "batch_1")
    stores.objects.put(key, b"".join(lines))
    chunks = cut(lines, per_chunk)
    batch = running_batch(created_at=NOW, total=n, chunk_count=len(chunks), model="test-chat")
    stores.batches.put(batch)
    return [batch.work_message(chunk) for chunk in chunks]


class RecordingQueue(FakeQueue):
    """The fake queue, with every release recorded (receipt, visible after seconds). A message
    released with a delay stays invisible (no test here waits out a delay), as SQS keeps it."""

    def __init__(self, faults):
        super().__init__(faults, "fake://work-queue")
        self.releases: list[tuple[str, int]] = []
        self.asked: list[int] = []  # max_messages of each receive

    def receive(self, max_messages: int, wait_seconds: int, visibility_seconds: int):
        self.asked.append(max_messages)
        return super().receive(max_messages, wait_seconds, visibility_seconds)

    def release(self, receipt: str, after_seconds: int = 0) -> bool:
        self.releases.append((receipt, after_seconds))
        if after_seconds == 0:
            return super().release(receipt, after_seconds)
        self._op("release")
        m = self._by_receipt(receipt)
        if m is None:
            return False
        m.released_after = after_seconds
        return True


class RecordingLogger:
    """Stands in for the powertools Logger: records (level, message, extra)."""

    def __init__(self) -> None:
        self.records: list[tuple[str, str, dict]] = []

    def _record(self, level, message, *args, extra=None, **kwargs):
        self.records.append((level, message, extra or {}))

    def info(self, message, *args, **kwargs):
        self._record("info", message, *args, **kwargs)

    def warning(self, message, *args, **kwargs):
        self._record("warning", message, *args, **kwargs)

    def error(self, message, *args, **kwargs):
        self._record("error", message, *args, **kwargs)

    def exception(self, message, *args, **kwargs):
        self._record("exception", message, *args, **kwargs)

    def messages(self, level: str) -> list[str]:
        return [m for lvl, m, _ in self.records if lvl == level]


async def until(predicate, what: str) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + PATIENCE
    while not predicate():
        if loop.time() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.002)


class Rig:
    """One Worker on fakes. ``beat`` is the heartbeat's injected sleep: by default it never
    returns (no extension happens); a test replaces it to drive the heartbeat."""

    def __init__(self, respond=None, concurrent=False, worker=None, **config):
        # concurrent: the fakes declared safe to call from several threads (as the AWS set is),
        # for a test that shows the worker's store calls side by side. worker: more of Worker's
        # keywords.
        self.stores = dataclasses.replace(fake_stores(), concurrent=True) if concurrent else fake_stores()
        self.queue = RecordingQueue(self.stores.faults)
        self.engine = InProcessEngine(respond) if respond else InProcessEngine()
        self.log = RecordingLogger()
        self.sleeps: list[float] = []
        self.config = WorkerConfig(
            **{
                "model": "test-chat",
                "queue_url": self.queue.url,
                "poll_wait_seconds": 0,
                "max_in_flight": 8,
                "metrics_interval_seconds": 3600,
                "drain_seconds": 30,
                "visibility_seconds": 90,
                "failure_retry_seconds": RETRY_AFTER_FAILURE,
                **config,
            }
        )
        self.metrics = WorkerMetrics(namespace="Test", service="worker-test", logger=self.log, model="test-chat")
        self.worker = Worker(
            self.config,
            stores=self.stores,
            queue=self.queue,
            engine=self.engine,
            metrics=self.metrics,
            logger=self.log,
            max_line_bytes=1024 * 1024,
            chunk_max_lines=2,
            clock=lambda: NOW,
            sleep=self.beat,
            **(worker or {}),
        )

    async def beat(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        await asyncio.get_running_loop().create_future()

    def run_until(self, predicate, what: str) -> None:
        """Run the worker until ``predicate()`` holds, then stop it (SIGTERM) and let it drain."""

        async def go() -> None:
            task = asyncio.create_task(self.worker.run())
            try:
                await until(lambda: predicate() or task.done(), what)
            finally:
                self.worker.stop()
                await task
            assert predicate(), f"the worker stopped before {what}"

        asyncio.run(go())

    def counted(self, chunk: int) -> bool:
        return self.stores.batches.markers.get(("acme", "batch_1", chunk)) is not None

    def errors(self, chunk: int = 0) -> list[tuple[str, str, str]]:
        """The counted attempt's error lines: (custom_id, code, message)."""
        marker = self.stores.batches.markers[("acme", "batch_1", chunk)]
        err = part_bytes(self.stores.objects, "acme", "batch_1", chunk, marker.attempt, "err")
        rows = map(BatchOutputLine.model_validate_json, err.splitlines())
        return [(row.custom_id, row.error.code, row.error.message) for row in rows if row.error is not None]


def test_a_malformed_message_is_released_for_a_later_retry_and_the_loop_goes_on():
    rig = Rig(max_open_chunks=1)  # one message at a time: the good one is taken after the bad one
    (message,) = seed(rig.stores, 2, per_chunk=2)
    rig.queue.send(["not a work message", message.model_dump_json()])
    bad = rig.queue.messages[0]
    rig.run_until(lambda: rig.counted(0) and rig.queue.deleted, "the good chunk counted and deleted")
    # not deleted (after its receives SQS moves it to the DLQ), not retried at once
    assert rig.queue.releases == [(f"{bad.id}#1", RETRY_AFTER_FAILURE)]
    assert rig.queue.bodies() == ["not a work message"] and rig.queue.deleted == [message.model_dump_json()]
    assert (rig.metrics.totals.chunks_failed, rig.metrics.totals.chunks_done) == (1, 1)
    assert rig.log.messages("error") == ["malformed work message"]
    assert rig.engine.contents() == ["hi 0", "hi 1"]  # the malformed message ran nothing


def test_a_chunk_that_fails_is_released_after_the_retry_delay_and_the_loop_survives():
    rig = Rig(max_open_chunks=1)
    first, second = seed(rig.stores, 4, per_chunk=2)
    rig.stores.faults.fail("batches.chunk_state", RuntimeError("the store broke"))  # the first chunk's first call
    rig.queue.send([first.model_dump_json(), second.model_dump_json()])
    failed = rig.queue.messages[0]
    rig.run_until(lambda: rig.counted(1) and rig.queue.deleted, "the next chunk counted")
    assert rig.queue.releases == [(f"{failed.id}#1", RETRY_AFTER_FAILURE)]
    assert rig.queue.bodies() == [first.model_dump_json()] and not rig.counted(0)  # it waits for its retry
    t = rig.metrics.totals
    assert (t.chunks_failed, t.chunks_released, t.chunks_done) == (1, 1, 1)
    assert rig.log.messages("exception") == ["chunk failed; it will be retried"]
    assert rig.engine.contents() == ["hi 2", "hi 3"]  # the failed attempt sent nothing to the engine


def test_the_heartbeat_extends_a_running_chunk_by_the_visibility_every_interval():
    rig = Rig()

    async def respond(path, body, seen):
        await until(lambda: len(rig.queue.extended) >= 3, "three extensions")
        return 200, chat_answer(body)

    rig.engine.respond = respond

    async def beat(seconds):
        rig.sleeps.append(seconds)
        await asyncio.sleep(0)

    rig.worker._sleep = beat
    (message,) = seed(rig.stores, 2, per_chunk=2)
    rig.queue.send([message.model_dump_json()])
    receipt = f"{rig.queue.messages[0].id}#1"
    rig.run_until(lambda: rig.queue.deleted, "the chunk done")
    extended = rig.queue.extended
    assert len(extended) >= 3 and set(extended) == {(receipt, 90)}  # by the whole visibility
    assert set(rig.sleeps) == {30}  # a third of the visibility apart
    assert rig.counted(0) and rig.queue.releases == []


def test_a_lost_receipt_stops_the_heartbeat_and_the_chunk_still_finishes():
    """Another consumer has the message (its visibility ran out): extending fails; the code
    finishes the chunk and counts it, and its delete does not remove the other's message."""
    rig = Rig()
    (message,) = seed(rig.stores, 2, per_chunk=2)
    rig.queue.send([message.model_dump_json()])
    stolen = rig.queue.messages[0]
    receipt = f"{stolen.id}#1"

    async def beat(seconds):
        rig.sleeps.append(seconds)
        stolen.receipt = f"{stolen.id}#someone-else"  # received again elsewhere
        await asyncio.sleep(0)

    rig.worker._sleep = beat

    async def respond(path, body, seen):
        await until(lambda: rig.log.messages("warning"), "the lost receipt noticed")
        return 200, chat_answer(body)

    rig.engine.respond = respond
    rig.run_until(lambda: rig.metrics.totals.chunks_done == 1, "the chunk done")
    assert rig.log.messages("warning") == ["lost the message (receipt no longer valid)"]
    assert rig.queue.extended == [(receipt, 90)] and rig.sleeps == [30]  # no extension after that
    assert rig.counted(0) and rig.queue.bodies() == [message.model_dump_json()] and rig.queue.deleted == []


# --- the process's exit status ------------------------------------------------------------------
def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_exit_2_on_bad_configuration(capsys):
    env = TEST_SETTINGS.to_env()
    assert main({**env, "WORKER_MODEL": "no-such-model"}) == 2  # no queue for it
    err = capsys.readouterr().err
    assert "configuration error" in err and "no work queue" in err
    assert main({**env, "WORKER_MODEL": "test-chat", "WORKER_QUEUE_URL": "q", "WORKER_MAX_IN_FLIGHT": "many"}) == 2
    assert "configuration error" in capsys.readouterr().err


def test_exit_1_when_the_engine_never_becomes_healthy(capsys):
    env = {
        **TEST_SETTINGS.to_env(),
        "WORKER_MODEL": "test-chat",
        "WORKER_QUEUE_URL": "http://127.0.0.1:9/queue",
        "WORKER_ENGINE_URL": f"http://127.0.0.1:{closed_port()}",
        "WORKER_HEALTH_TIMEOUT_SECONDS": "0.01",
        # A service name of its own: Powertools keeps one handler per service name, bound to the
        # stdout of whichever test first built it; a fresh name binds this test's captured stdout.
        "WORKER_SERVICE": "gpu-worker-exit-status-test",
    }
    assert main(env) == 1
    assert "engine unavailable; exiting" in capsys.readouterr().out


@pytest.mark.skipif(sys.platform != "linux", reason="a nice value per thread is Linux's")
def test_the_worker_lowers_its_priority_by_worker_nice_before_its_first_thread(monkeypatch):
    def nice() -> int:
        return os.getpriority(os.PRIO_PROCESS, threading.get_native_id())

    seen: dict[str, int] = {}

    async def serve(config, settings, stores, queue):
        seen["event loop"] = nice()
        thread = threading.Thread(target=lambda: seen.setdefault("a thread it starts", nice()))
        thread.start()
        thread.join()
        return 0

    monkeypatch.setattr(worker_main, "serve", serve)
    env = {**TEST_SETTINGS.to_env(), "WORKER_MODEL": "test-chat", "WORKER_QUEUE_URL": "q", "WORKER_NICE": "7"}
    exits: list[int] = []
    # On a thread of its own: os.nice lowers the calling thread's priority (Linux), not the test's.
    runner = threading.Thread(target=lambda: exits.append(main(env)))
    runner.start()
    runner.join()
    lowered = min(19, nice() + 7)
    assert exits == [0] and seen == {"event loop": lowered, "a thread it starts": lowered}


def test_engine_down_releases_the_chunk_at_once_and_waits_for_health_before_taking_more():
    from gpu_worker.engine_client import EngineDown

    def respond(path, body, seen):
        if seen == 0:
            raise EngineDown("the engine died")  # what the client raises when /health is gone too
        return 200, chat_answer(body)

    rig = Rig(respond)
    health_checks = []

    async def wait_healthy(timeout, interval=1.0):
        health_checks.append(timeout)
        return 0.0

    rig.engine.wait_healthy = wait_healthy
    (message,) = seed(rig.stores, 2, per_chunk=2)
    rig.queue.send([message.model_dump_json()])
    receipt = f"{rig.queue.messages[0].id}#1"
    rig.run_until(lambda: rig.counted(0) and rig.queue.deleted, "the chunk counted after the engine is back")
    assert rig.queue.releases[0] == (receipt, 0)  # no line failed: another try at once
    assert "engine unhealthy: not taking work until /health answers" in rig.log.messages("warning")
    assert len(health_checks) == 2  # at start, and again before taking more work
    t = rig.metrics.totals
    assert (t.chunks_released, t.chunks_failed, t.chunks_done, t.lines_failed) == (1, 0, 1, 0)


def test_a_line_that_keeps_crashing_the_engine_fails_alone_through_the_loop():
    """The engine dies whenever "hi 1" reaches it (and is restarted while the worker waits for
    /health, as the local supervisor or a new ECS task does). Each death releases the chunk at
    once; the worker's own record narrows it down to that line, which fails as engine_crashed;
    the other line completes, and the message is deleted, never dead-lettered."""
    from tests.fakes.engine import CrashingEngine

    rig = Rig()
    rig.engine = rig.worker.engine = engine = CrashingEngine("hi 1")

    async def back_up(timeout, interval=1.0):
        engine.restart()
        return 0.0

    engine.wait_healthy = back_up
    (message,) = seed(rig.stores, 2, per_chunk=2)
    rig.queue.send([message.model_dump_json()])
    rig.run_until(lambda: rig.counted(0) and rig.queue.deleted, "the chunk counted")
    assert [after for _, after in rig.queue.releases] == [0, 0, 0]  # three deaths, each released at once
    marker = rig.stores.batches.markers[("acme", "batch_1", 0)]
    err = rig.stores.objects.get(schema.chunk_part_key("acme", "batch_1", 0, marker.attempt, "err"))
    assert [(l.custom_id, l.error.code) for l in map(BatchOutputLine.model_validate_json, err.splitlines())] == [
        ("req-1", "engine_crashed")
    ]
    assert (marker.completed, marker.failed) == (1, 1)
    t = rig.metrics.totals
    assert (t.chunks_careful, t.lines_crashed, t.chunks_done) == (1, 1, 1)
    assert engine.contents().count("hi 1") == 3 and engine.with_crash[-1] == ["hi 1"]


def test_chunks_that_end_together_write_their_parts_side_by_side():
    """With stores that allow it (``Stores.concurrent``), two chunks' commits run at once on the
    worker's store threads: each chunk's part write waits until the other's has started too, so
    both are counted only if they ran side by side (one thread: the first waits for ever, its
    barrier breaks and the chunk fails)."""
    rig = Rig(concurrent=True, max_open_chunks=2, store_threads=4)
    assert rig.worker._store_pool.threads == 4
    first, second = seed(rig.stores, 4, per_chunk=2)
    both = threading.Barrier(2, timeout=PATIENCE)
    put = rig.stores.objects.put

    def meet_then_put(key, *args, **kwargs):
        if "/parts/" in key and key.endswith(".out.jsonl"):
            both.wait()  # the other chunk's part write has started too
        return put(key, *args, **kwargs)

    rig.stores.objects.put = meet_then_put
    rig.queue.send([first.model_dump_json(), second.model_dump_json()])
    rig.run_until(lambda: rig.counted(0) and rig.counted(1), "both chunks counted")
    assert not both.broken and rig.metrics.totals.chunks_done == 2


def test_stores_that_do_not_allow_it_get_one_store_pool():
    assert Rig(store_threads=4).worker._store_pool.threads == 1


# --- the media allowlist the worker is built with -----------------------------------------------
AUDIO = "/v1/audio/transcriptions"
WAV = "data:audio/wav;base64," + base64.b64encode(b"RIFF-audio").decode()


def seed_audio(stores, urls: list[str]) -> WorkMessage:
    """An in_progress audio batch of one chunk, a line per ``file_url``, and its work message."""
    lines = [
        (
            json.dumps(
                {"custom_id": f"a-{i}", "method": "POST", "url": AUDIO, "body": {"model": "test-chat", "file_url": url}}
            )
            + "\n"
        ).encode()
        for i, url in enumerate(urls)
    ]
    stores.objects.put(schema.batch_input_key("acme", "batch_1"), b"".join(lines))
    batch = running_batch(created_at=NOW, total=len(lines), chunk_count=1, model="test-chat", endpoint=AUDIO)
    stores.batches.put(batch)
    return batch.work_message(cut(lines, len(lines))[0])


def test_the_workers_media_allowlist_reaches_its_chunks_lines():
    """``Worker(allowed_media_domains=...)``: a line on a listed host goes on to the fetch (its name
    looked up by the injected resolver, whose private answer the SSRF rules then refuse: nothing is
    connected to), a line on another host is refused before any lookup, a data: URL runs."""
    looked_up = []

    def resolver(host: str, port: int) -> list[str]:
        looked_up.append((host, port))
        return ["10.9.8.7"]

    rig = Rig(worker={"allowed_media_domains": ("media.example.com",), "media_resolver": resolver})
    message = seed_audio(rig.stores, ["https://media.example.com/a.wav", "https://evil.example.net/b.wav", WAV])
    rig.queue.send([message.model_dump_json()])
    rig.run_until(lambda: rig.counted(0), "the chunk counted")
    (fetched, refused) = rig.errors()
    assert fetched[:2] == ("a-0", "media_fetch_failed") and "resolves to 10.9.8.7, a private address" in fetched[2]
    assert refused[:2] == ("a-1", "invalid_value") and "'evil.example.net' is not an allowed media domain" in refused[2]
    assert looked_up == [("media.example.com", 443)]
    assert [path for path, _ in rig.engine.requests] == [AUDIO]  # the data: URL only


def test_a_worker_without_an_allowlist_fetches_no_host():
    looked_up = []
    rig = Rig(worker={"media_resolver": lambda host, port: looked_up.append(host) or ["10.9.8.7"]})
    message = seed_audio(rig.stores, ["https://media.example.com/a.wav"])
    rig.queue.send([message.model_dump_json()])
    rig.run_until(lambda: rig.counted(0), "the chunk counted")
    assert [row[:2] for row in rig.errors()] == [("a-0", "invalid_value")] and looked_up == []


def test_python_m_gpu_worker_builds_its_worker_with_the_deployments_media_allowlist():
    rig = Rig()
    settings = TEST_SETTINGS.model_copy(update={"allowed_media_domains": ("media.example.com", "cdn.example.org")})
    worker = build_worker(
        rig.config,
        settings,
        stores=rig.stores,
        queue=rig.queue,
        engine=rig.engine,
        metrics=rig.metrics,
        logger=rig.log,
    )
    assert worker.policy.media.allowed_domains == ("media.example.com", "cdn.example.org")
    assert worker.chunks.policy.media == worker.policy.media  # what every attempt runs with


def test_a_big_batch_s_chunks_are_received_by_their_size_not_hoarded():
    """Chunks bigger than chunk_max_lines (a big batch's): the worker asks for one chunk first
    (ingest's biggest may fill its cap), then for as many as the chunks it sees fit in its room
    (by chunk_max_lines, 2, it would have asked for 6 at once)."""
    held = asyncio.Event()

    async def respond(path, body, seen):
        await held.wait()  # the engine keeps every line: the backlog stays
        return 200, chat_answer(body)

    rig = Rig(respond)
    messages = seed(rig.stores, 60, per_chunk=6)
    rig.queue.send([m.model_dump_json() for m in messages])

    async def go() -> None:
        task = asyncio.create_task(rig.worker.run())
        await until(lambda: len(rig.queue.asked) >= 2, "a second receive")
        for _ in range(20):
            await asyncio.sleep(0.01)
        held.set()
        rig.worker.stop()
        await task

    asyncio.run(go())
    cap = rig.worker.engine.max_in_flight
    assert rig.queue.asked[0] == 1
    assert 1 < rig.queue.asked[1] <= -(-cap // 6)  # then by the 6-line chunks it saw
