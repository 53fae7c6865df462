"""The worker's fault handling, through the real lifecycle on moto (API -> ingest -> worker ->
workflow on moto's Step Functions interpreter), with a FAKE OpenAI-compatible engine that injects
the faults: engine 500s, timeouts, 429/503 bursts, a worker killed mid-chunk, a request that
kills its worker (fails alone), benign releases (not dead-lettered), the DLQ as last resort,
SIGTERM mid-chunk, the engine going down."""

import asyncio
import json
import threading

import pytest

from functions.chunk_dlq import handler as chunk_dlq_handler
from functions.chunk_dlq.logic import ERROR_CODE as DLQ_CODE
from functions.core import clients, schema
from infra import names
from infra.local.pollers import drain_queue
from tests.fakes.engine import HANG, FakeEngine, chat_answer, content
from tests.integration.batch_helpers import line, wait_for_execution
from tests.integration.test_workflow import assert_invariants, read_file, start
from tests.integration.worker.harness import WorkerThread, dlq_url, queue_depth, wait_until, worker_config

pytestmark = [
    pytest.mark.workflow,
    pytest.mark.settings(chunk_max_lines=3, drain_poll_seconds=0, drain_grace_seconds=30),
]


@pytest.fixture
def fake():
    engine = FakeEngine().start()
    yield engine
    engine.stop()


def ids(n):
    return [f"req-{i}" for i in range(n)]


def finish(client, deployed, batch_id):
    execution = wait_for_execution(deployed, batch_id)
    assert execution["status"] == "SUCCEEDED", execution
    return client.batches.retrieve(batch_id)


def run_lines(client, stores, deployed, fake, n, **config):
    """A batch of n chat lines through one worker to the end of its workflow; the invariants hold."""
    batch = start(client, stores, [line(i) for i in range(n)])
    worker = WorkerThread(worker_config(deployed, fake.url, **config), deployed, stores).start()
    done = finish(client, deployed, batch.id)
    worker.stop()
    out, err = assert_invariants(client, done, ids(n))
    return done, out, err, worker


def test_a_batch_runs_through_the_worker_in_input_order(client, stores, deployed, fake):
    async def respond(path, body, seen):
        i = int(content(body).split()[-1])
        await asyncio.sleep(0.02 * ((7 * i) % 5))  # answers arrive out of order
        return 200, chat_answer(body, completion_tokens=i + 1)

    fake.respond = respond
    done, out, err, worker = run_lines(client, stores, deployed, fake, 10, max_in_flight=4)
    assert [l.custom_id for l in out] == ids(10) and err == []
    assert done.status == "completed"
    assert done.usage.input_tokens == 100 and done.usage.output_tokens == sum(range(1, 11))
    assert fake.max_concurrent <= 4  # the global cap holds across the 4 chunks
    assert all(l.response.request_id.startswith("req_") for l in out)
    assert worker.worker.metrics.totals.chunks_done == 4


def test_engine_500s_become_error_lines_with_status_and_body(client, stores, deployed, fake):
    boom = {"error": {"message": "engine exploded", "type": "InternalServerError", "param": None, "code": 500}}

    def respond(path, body, seen):
        return (500, boom) if content(body) in ("hi 1", "hi 4") else (200, chat_answer(body))

    fake.respond = respond
    done, _out, err, _ = run_lines(client, stores, deployed, fake, 6)
    assert [l.custom_id for l in err] == ["req-1", "req-4"]
    for l in err:
        assert l.error is None and l.response.status_code == 500 and l.response.body == boom
    assert done.request_counts.completed == 4 and done.request_counts.failed == 2
    assert len(fake.requests) == 6  # a 500 is a result: not retried


def test_timeouts_are_retried_then_become_error_lines(client, stores, deployed, fake):
    def respond(path, body, seen):
        if content(body) == "hi 1":
            return HANG  # never answers
        if content(body) == "hi 2" and seen == 0:
            return HANG  # answers on the retry
        return 200, chat_answer(body)

    fake.respond = respond
    _done, out, err, _ = run_lines(client, stores, deployed, fake, 4, request_timeout_seconds=2, max_attempts=3)
    assert [l.custom_id for l in out] == ["req-0", "req-2", "req-3"]
    (timed_out,) = err
    assert timed_out.custom_id == "req-1" and timed_out.response is None
    assert timed_out.error.code == "engine_timeout" and "3 attempts" in timed_out.error.message
    assert fake.contents().count("hi 1") == 3 and fake.contents().count("hi 2") == 2


@pytest.mark.parametrize("status", [429, 503])
def test_overload_bursts_back_off_and_fail_no_line(client, stores, deployed, fake, status):
    burst = {"left": 12}

    def respond(path, body, seen):
        if burst["left"] > 0:
            burst["left"] -= 1
            headers = {"Retry-After": "0"} if status == 503 else {}
            return status, {"error": {"message": "overloaded", "type": "ServiceUnavailable", "code": status}}, headers
        return 200, chat_answer(body)

    fake.respond = respond
    done, out, err, worker = run_lines(client, stores, deployed, fake, 8)
    assert len(out) == 8 and err == [] and done.request_counts.failed == 0
    stats = worker.worker.engine.stats
    assert stats.overloaded == 12 and stats.answered[status] == 12 and stats.answered[200] == 8


def test_a_worker_killed_mid_chunk_is_redelivered_without_duplicates(client, stores, deployed, fake):
    release = {"slow": True}

    async def respond(path, body, seen):
        while release["slow"]:  # the first worker dies while these are in flight
            await asyncio.sleep(0.01)
        return 200, chat_answer(body)

    fake.respond = respond
    batch = start(client, stores, [line(i) for i in range(6)])
    config = worker_config(deployed, fake.url, visibility_seconds=2, heartbeat_seconds=0.5)
    first = WorkerThread(config, deployed, stores).start()
    wait_until(lambda: len(fake.requests) >= 3, what="the first worker's requests")
    first.kill()
    assert stores.batches.get("acme", batch.id).chunks_done == 0
    release["slow"] = False
    second = WorkerThread(config, deployed, stores).start()
    done = finish(client, deployed, batch.id)
    second.stop()
    out, err = assert_invariants(client, done, ids(6))
    assert len(out) == 6 and err == [] and done.request_counts.completed == 6
    assert done.usage.output_tokens == 18  # each line counted once
    assert second.worker.metrics.totals.chunks_redelivered >= 1


def test_a_request_that_kills_its_worker_fails_alone_and_the_batch_completes(client, stores, deployed, fake):
    """A request that kills its worker every time it runs (docs/reliability.md, "Poison isolation"): the first death puts its
    chunk in careful mode (small groups alone on the engine, each recorded in flight); the second
    makes the dead group's lines suspects (each then runs alone); the third is blamed on the one
    line in flight, which gets an engine_crashed error line and is never sent again; the chunk's
    other lines complete; nothing is dead-lettered."""
    fake.respond = lambda path, body, seen: (200, chat_answer(body)) if content(body) != "hi 4" else HANG
    lines = [line(i) for i in range(6)]  # chunks: 0-2, 3-5 (the poison line is in the second)
    batch = start(client, stores, lines)
    config = worker_config(deployed, fake.url, visibility_seconds=1, heartbeat_seconds=0.3)
    queue = deployed.models["test-chat"].queue_url
    for attempt in range(3):
        worker = WorkerThread(config, deployed, stores).start()
        wait_until(lambda: fake.contents().count("hi 4") == attempt + 1, what="the poison request")
        worker.kill()  # the poison request crashed the engine/worker
    worker = WorkerThread(config, deployed, stores).start()
    done = finish(client, deployed, batch.id)
    worker.stop()
    assert done.status == "completed"
    out, err = assert_invariants(client, done, ids(6))
    assert [l.custom_id for l in out] == ["req-0", "req-1", "req-2", "req-3", "req-5"]
    assert [(l.custom_id, l.response, l.error.code) for l in err] == [("req-4", None, "engine_crashed")]
    assert "crashed the inference engine" in err[0].error.message
    assert fake.contents().count("hi 4") == 3  # with its chunk, in its careful group, alone: never again
    run = stores.batches.chunk_run("acme", batch.id, 1)
    assert (run.failures, run.blamed) == (3, [1])
    assert queue_depth(queue) == (0, 0) and queue_depth(dlq_url(queue)) == (0, 0)


def test_benign_releases_do_not_spend_the_poison_budget(client, stores, deployed, fake):
    """The poison budget is the chunk's own, not SQS's receive count: benign releases (shutdown,
    engine restart, store errors) do not spend it (docs/reliability.md, "Poison isolation"). A chunk released by four shutdowns in a row (SIGTERM past
    the drain time) is not dead-lettered and runs normally on the fifth receive."""
    slow = {"on": True}

    async def respond(path, body, seen):
        while slow["on"]:
            await asyncio.sleep(0.02)
        return 200, chat_answer(body)

    fake.respond = respond
    batch = start(client, stores, [line(i) for i in range(3)])
    queue = deployed.models["test-chat"].queue_url
    for release in range(1, 5):
        worker = WorkerThread(worker_config(deployed, fake.url, drain_seconds=0.1), deployed, stores).start()
        wait_until(lambda: len(fake.requests) == 3 * release, what=f"receive {release} running")
        worker.stop(timeout=10)
        assert queue_depth(queue) == (1, 0)  # released at once, not dead-lettered
    slow["on"] = False
    worker = WorkerThread(worker_config(deployed, fake.url), deployed, stores).start()
    done = finish(client, deployed, batch.id)
    worker.stop()
    out, err = assert_invariants(client, done, ids(3))
    assert len(out) == 3 and err == [] and done.status == "completed"
    run = stores.batches.chunk_run("acme", batch.id, 0)
    assert (run.failures, run.benign) == (0, 4)
    assert worker.worker.metrics.totals.chunks_careful == 0
    assert queue_depth(dlq_url(queue)) == (0, 0)


def test_the_dlq_still_takes_a_chunk_received_too_often(client, stores, deployed, fake):
    """The last resort: a message received WORK_MAX_RECEIVES times without being counted (say,
    every worker took it and lost it) goes to the DLQ, whose handler fails its lines and counts
    it; the batch completes."""
    lines = [line(i) for i in range(6)]  # chunks: 0-2, 3-5
    batch = start(client, stores, lines)
    queue = deployed.models["test-chat"].queue_url
    sqs = clients.client("sqs")
    for _ in range(names.WORK_MAX_RECEIVES):
        got = sqs.receive_message(QueueUrl=queue, MaxNumberOfMessages=10, VisibilityTimeout=0)
        assert got.get("Messages")
    dead = dlq_url(queue)
    sqs.receive_message(QueueUrl=queue, MaxNumberOfMessages=10, VisibilityTimeout=0)  # SQS moves them now
    wait_until(lambda: queue_depth(dead)[0] == 2, timeout=30, what="the chunks in the DLQ")
    # As the DLQ's event source mapping polls it: moto may return one of two visible messages to a
    # short poll (seen on a loaded 2-core machine), so poll until both were handled.
    handled: list[int] = []
    wait_until(
        lambda: handled.append(drain_queue(sqs, dead, chunk_dlq_handler.handler, name="dlq")) or sum(handled) >= 2,
        timeout=30,
        what="both dead-lettered chunks handled",
    )
    assert sum(handled) == 2
    done = finish(client, deployed, batch.id)
    assert done.status == "completed"
    out, err = assert_invariants(client, done, ids(6))
    assert out == [] and [l.custom_id for l in err] == ids(6)
    for l in err:
        assert l.response is None and l.error.code == DLQ_CODE and "dead-lettered" in l.error.message
    assert queue_depth(queue) == (0, 0)


def test_sigterm_mid_chunk_finishes_what_it_holds_and_takes_no_more_work(client, stores, deployed, fake):
    stopping = threading.Event()

    async def respond(path, body, seen):
        while not stopping.is_set():  # the chunk is answered only once the worker is stopping
            await asyncio.sleep(0.01)
        return 200, chat_answer(body)

    fake.respond = respond
    batch = start(client, stores, [line(i) for i in range(9)])  # 3 chunks of 3
    # File order: every line of a chunk in the engine at once (smart order would admit only
    # max_num_seqs + 25 % of them, docs/worker.md, "Order of lines in the engine"). Chunk 0 fills the engine (cap 3); chunk 1
    # is taken as soon as chunk 0 is all in the engine (a chunk's tail never keeps new lines out)
    # and waits for slots; then the backlog (3 lines) is at the cap, so chunk 2 stays queued.
    config = worker_config(deployed, fake.url, max_in_flight=3, max_open_chunks=1, order="file")
    worker = WorkerThread(config, deployed, stores).start()
    queue = deployed.models["test-chat"].queue_url
    # Chunk 1 held means the loop has it open, not only that SQS lent it out: a message still on its
    # way from the receive to the loop when the stop comes is released, by design.
    wait_until(
        lambda: len(fake.requests) == 3 and queue_depth(queue) == (1, 2) and worker.worker.open_chunks == 2,
        what="chunk 0 running, chunk 1 held",
    )
    worker.request_stop()  # SIGTERM mid-chunk, drain time is plenty
    stopping.set()
    worker.join()
    counted = stores.batches.counted_chunks("acme", batch.id)
    assert sorted(counted) == [0, 1] and [counted[c].completed for c in (0, 1)] == [3, 3]  # finished what it held
    assert len(fake.requests) == 6  # took no more work
    assert queue_depth(queue) == (1, 0)  # the last chunk waits, visible, for another worker
    other = WorkerThread(worker_config(deployed, fake.url), deployed, stores).start()
    done = finish(client, deployed, batch.id)
    other.stop()
    assert_invariants(client, done, ids(9))


def test_sigterm_past_the_drain_time_releases_the_chunk_at_once(client, stores, deployed, fake):
    slow = {"on": True}

    async def respond(path, body, seen):
        while slow["on"]:
            await asyncio.sleep(0.05)
        return 200, chat_answer(body)

    fake.respond = respond
    batch = start(client, stores, [line(i) for i in range(3)])
    queue = deployed.models["test-chat"].queue_url
    worker = WorkerThread(worker_config(deployed, fake.url, drain_seconds=0.2), deployed, stores).start()
    wait_until(lambda: len(fake.requests) == 3, what="the chunk running")
    assert queue_depth(queue) == (0, 1)
    worker.stop(timeout=10)  # exits cleanly (no error raised by join)
    assert worker.worker.metrics.totals.chunks_released == 1
    assert queue_depth(queue) == (1, 0)  # visible again at once (not after the 120 s visibility)
    assert stores.batches.get("acme", batch.id).chunks_done == 0
    slow["on"] = False
    other = WorkerThread(worker_config(deployed, fake.url), deployed, stores).start()
    done = finish(client, deployed, batch.id)
    other.stop()
    out, _ = assert_invariants(client, done, ids(3))
    assert len(out) == 3


def test_engine_down_releases_the_chunk_instead_of_failing_its_lines(client, stores, deployed, fake):
    def respond(path, body, seen):
        fake.health_status = 503  # the engine dies with the first request in flight
        return HANG

    fake.respond = respond
    batch = start(client, stores, [line(i) for i in range(2)])
    config = worker_config(deployed, fake.url, request_timeout_seconds=0.3, max_attempts=2, health_timeout_seconds=60)
    worker = WorkerThread(config, deployed, stores).start()
    wait_until(lambda: worker.worker.metrics.totals.chunks_released == 1, what="the chunk released")
    assert stores.batches.get("acme", batch.id).chunks_done == 0  # no line failed
    fake.respond = lambda path, body, seen: (200, chat_answer(body))
    fake.health_status = 200  # back: the worker takes work again
    done = finish(client, deployed, batch.id)
    worker.stop()
    out, err = assert_invariants(client, done, ids(2))
    assert len(out) == 2 and err == []


def test_a_cancelled_batch_chunk_is_skipped(client, stores, deployed, fake):
    batch = start(client, stores, [line(i) for i in range(3)])
    client.batches.cancel(batch.id)
    done = finish(client, deployed, batch.id)
    worker = WorkerThread(worker_config(deployed, fake.url), deployed, stores).start()
    wait_until(lambda: worker.worker.metrics.totals.chunks_skipped == 1, what="the chunk skipped")
    worker.stop()
    assert fake.requests == [] and done.status == "cancelled"
    assert queue_depth(deployed.models["test-chat"].queue_url) == (0, 0)


@pytest.mark.settings(chunk_max_lines=3, drain_poll_seconds=0, drain_grace_seconds=0)
def test_a_running_chunk_of_a_batch_that_ended_is_abandoned_not_run_to_its_end(client, stores, deployed, fake):
    """Its lines hang in the engine; the batch is cancelled and finalized (no drain grace). The
    worker's next heartbeat finds the batch terminal: it cancels the chunk's requests (vLLM aborts
    a request whose client goes away), deletes the message (nothing of it can count) and takes the
    next work, instead of keeping the engine busy for a batch that is over."""
    fake.respond = lambda path, body, seen: HANG
    batch = start(client, stores, [line(i) for i in range(3)])  # one chunk
    worker = WorkerThread(worker_config(deployed, fake.url, heartbeat_seconds=0.3), deployed, stores).start()
    wait_until(lambda: len(fake.requests) == 3, what="the chunk's lines in the engine")
    assert client.batches.cancel(batch.id).status == "cancelling"
    done = finish(client, deployed, batch.id)
    assert done.status == "cancelled"
    queue = deployed.models["test-chat"].queue_url
    # The message is deleted just before the skip is counted and the chunk closed: wait for all three.
    wait_until(
        lambda: (
            worker.worker.engine.in_flight == 0
            and queue_depth(queue) == (0, 0)
            and worker.worker.metrics.totals.chunks_skipped == 1
            and worker.worker.open_chunks == 0
        ),
        what="the chunk abandoned",
    )
    assert len(fake.requests) == 3  # nothing was sent again
    worker.stop()
    _, err = assert_invariants(client, done, ids(3))
    assert {l.error.code for l in err} == {"batch_cancelled"}
