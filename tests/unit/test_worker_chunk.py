"""One chunk through ``gpu_worker.chunk.ChunkRunner`` against the in-memory stores and an
in-process engine: usage totals (cached and reasoning tokens included) reach the chunk's marker
and the batch; a chunk already counted, or of a stopped batch, runs nothing; the commit (parts +
count) is not interrupted by a cancelled caller; an audio chunk runs under the worker's media
policy (``RunPolicy.media``) and is posted as multipart."""

import asyncio
import base64
import json

import pytest

from functions.core import schema
from functions.core.chunk_lifecycle import Usage
from functions.core.messages import Chunk
from functions.core.wire import BatchOutputLine
from gpu_worker.attempt import RunPolicy
from gpu_worker.engine_client import EngineDown
from gpu_worker.engine_gate import EngineGate
from gpu_worker.media import MediaPolicy
from tests.builders import assert_fields, running_batch
from tests.chunks import part_bytes, process_chunk
from tests.fakes.aws import fake_stores
from tests.fakes.engine import CrashingEngine, InProcessEngine, chat_answer, content
from tests.unit.test_worker_loop import seed


async def direct(fn, *args, **kwargs):
    return fn(*args, **kwargs)


def run(stores, message, engine, **kwargs):
    return asyncio.run(
        process_chunk(stores, message, engine, io=direct, max_line_bytes=1024 * 1024, now=lambda: 1000, **kwargs)
    )


def test_usage_with_cached_and_reasoning_tokens_reaches_the_marker_and_the_batch():
    def respond(path, body, seen):
        if content(body) == "hi 1":  # an error answer's usage, if any, is not the batch's
            return 400, {"error": {"message": "no"}, "usage": {"prompt_tokens": 1000, "completion_tokens": 1000}}
        answer = chat_answer(body, completion_tokens=5, prompt_tokens=20)
        answer["usage"]["prompt_tokens_details"] = {"cached_tokens": 16}
        answer["usage"]["completion_tokens_details"] = {"reasoning_tokens": 3}
        return 200, answer

    stores = fake_stores()
    (message,) = seed(stores, 3, per_chunk=3)
    report = run(stores, message, InProcessEngine(respond))
    expected = Usage(input_tokens=40, cached_tokens=32, output_tokens=10, reasoning_tokens=6)
    assert (report.completed, report.failed, report.usage) == (2, 1, expected)
    marker = stores.batches.counted_chunk("acme", "batch_1", 0)
    assert (marker.input_tokens, marker.cached_tokens, marker.output_tokens, marker.reasoning_tokens) == (40, 32, 10, 6)
    batch = stores.batches.get("acme", "batch_1")
    assert_fields(batch, input_tokens=40, cached_tokens=32, output_tokens=10, reasoning_tokens=6)
    assert_fields(batch, completed=2, failed=1, chunks_done=1)


def test_a_chunk_already_counted_is_skipped_without_running_a_line():
    stores = fake_stores()
    (message,) = seed(stores, 2, per_chunk=2)
    assert run(stores, message, InProcessEngine()).outcome.counted
    engine = InProcessEngine()
    again = run(stores, message, engine)  # SQS delivered it again after it was counted
    assert again.skipped and again.outcome is None and engine.requests == []
    assert stores.batches.get("acme", "batch_1").completed == 2


def test_a_chunk_of_a_batch_that_stopped_taking_work_is_skipped():
    stores = fake_stores()
    (message,) = seed(stores, 2, per_chunk=2)
    stores.batches.set("acme", "batch_1", status="cancelling")
    engine = InProcessEngine()
    report = run(stores, message, engine)
    assert report.skipped and engine.requests == [] and stores.batches.counted_chunk("acme", "batch_1", 0) is None
    assert stores.objects.list_keys("batches/acme/batch_1/parts/") == []


def test_a_stopped_batch_s_chunk_is_skipped_even_if_its_input_can_no_longer_be_read():
    """The checks and the input read run side by side; a read error of a chunk that is skipped
    anyway (its batch stopped, its input perhaps already gone) is not the chunk's failure."""
    stores = fake_stores()
    (message,) = seed(stores, 2, per_chunk=2)
    stores.batches.set("acme", "batch_1", status="cancelling")
    stores.faults.fail("objects.get", KeyError("the input is gone"))
    engine = InProcessEngine()
    assert run(stores, message, engine).skipped and engine.requests == []


def test_a_running_batch_s_chunk_whose_input_cannot_be_read_fails_with_that_error():
    stores = fake_stores()
    (message,) = seed(stores, 2, per_chunk=2)
    stores.faults.fail("objects.get", KeyError("the input is gone"))
    engine = InProcessEngine()
    with pytest.raises(KeyError, match="the input is gone"):
        run(stores, message, engine)
    assert engine.requests == [] and stores.batches.counted_chunk("acme", "batch_1", 0) is None


def test_a_cancelled_caller_does_not_interrupt_the_commit():
    """SIGTERM past the drain time cancels the chunk's task; once its parts are being written,
    the parts and the count still complete (else a redelivery would rewrite counted parts)."""
    stores = fake_stores()
    (message,) = seed(stores, 2, per_chunk=2)
    writing, go_on = asyncio.Event(), asyncio.Event()

    async def io(fn, *args, **kwargs):
        if fn.__name__ == "write_parts":
            writing.set()
            await go_on.wait()  # the parts are being written when the caller is cancelled
        return fn(*args, **kwargs)

    async def scenario():
        commits: set = set()
        task = asyncio.create_task(
            process_chunk(
                stores,
                message,
                InProcessEngine(),
                io=io,
                max_line_bytes=1024 * 1024,
                commits=commits,
            )
        )
        await writing.wait()
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        assert task.cancelled() and len(commits) == 1  # the commit outlives its caller ...
        go_on.set()
        await asyncio.gather(*commits)  # ... and the worker's drain awaits it

    asyncio.run(scenario())
    marker = stores.batches.counted_chunk("acme", "batch_1", 0)
    assert marker is not None and marker.completed == 2


def test_a_redelivered_last_chunk_signals_the_workflow_its_first_delivery_did_not():
    """The worker died after counting the last chunk and before signalling: the redelivery runs
    no line (the chunk is counted) but resumes the workflow, or the batch would wait for expiry."""
    stores = fake_stores()
    first, last = seed(stores, 4, per_chunk=2)
    stores.batches.set("acme", "batch_1", task_token="token-1")
    assert run(stores, first, InProcessEngine()).outcome.counted
    stores.faults.fail("workflows.signal", RuntimeError("the worker died here"))
    try:
        run(stores, last, InProcessEngine())
    except RuntimeError:
        pass
    assert stores.batches.get("acme", "batch_1").chunks_done == 2 and stores.workflows.signals == []
    engine = InProcessEngine()
    again = run(stores, last, engine)  # SQS redelivers the message
    assert again.skipped and engine.requests == []
    assert stores.workflows.signals == [("token-1", {"outcome": "complete"})]


def test_a_redelivered_chunk_that_is_not_the_last_signals_nothing():
    stores = fake_stores()
    first, _ = seed(stores, 4, per_chunk=2)
    stores.batches.set("acme", "batch_1", task_token="token-1")
    run(stores, first, InProcessEngine())
    assert run(stores, first, InProcessEngine()).skipped and stores.workflows.signals == []


# --- poison isolation, the chunk's own budget, checkpoints (docs/reliability.md) ----------------


def parts(stores, chunk=0):
    """The counted (out, err) result lines of a chunk."""
    marker = stores.batches.counted_chunk("acme", "batch_1", chunk)

    def read(kind):
        return [
            BatchOutputLine.model_validate_json(l)
            for l in part_bytes(stores.objects, "acme", "batch_1", chunk, marker.attempt, kind).splitlines()
        ]

    return read("out"), read("err")


def deliver_until_counted(stores, message, engine, *, limit=20, **kwargs):
    """SQS delivers the chunk again after every attempt that died with the engine (restarted in
    between, as the local supervisor or a new ECS task does); the report of the one that counted it."""
    for _ in range(limit):
        try:
            return run(stores, message, engine, **kwargs)
        except EngineDown:
            engine.restart()
    raise AssertionError(f"not counted after {limit} deliveries")


def test_a_line_that_crashes_the_engine_fails_alone_as_engine_crashed():
    stores = fake_stores()
    (message,) = seed(stores, 4, per_chunk=4)
    engine = CrashingEngine("hi 2")
    report = deliver_until_counted(stores, message, engine)
    out, err = parts(stores)
    assert [l.custom_id for l in out] == ["req-0", "req-1", "req-3"]
    assert [(l.custom_id, l.error.code) for l in err] == [("req-2", "engine_crashed")]
    assert "crashed the inference engine" in err[0].error.message and "not retried" in err[0].error.message
    assert (report.completed, report.failed, report.crashed, report.careful) == (3, 1, 1, True)
    # sent with its chunk, then in a careful group (both died), then alone (died): never again
    assert engine.contents().count("hi 2") == 3 and engine.crashes == 3
    assert engine.with_crash[-1] == ["hi 2"]
    batch = stores.batches.get("acme", "batch_1")
    assert_fields(batch, completed=3, failed=1, chunks_done=1)


def test_a_careful_line_goes_alone_so_another_chunk_on_the_worker_is_not_blamed():
    stores = fake_stores()
    innocent, poisoned = seed(stores, 6, per_chunk=3)  # the poison request "hi 4" is in chunk 1
    engine = CrashingEngine("hi 4", turns=20)  # the innocent chunk's requests are slow
    with pytest.raises(EngineDown):
        run(stores, poisoned, engine)  # first delivery dies: chunk 1 is careful from now on
    engine.restart()
    gate = EngineGate()  # one worker: both chunks at once

    async def together():
        def go(m):
            return process_chunk(stores, m, engine, io=direct, max_line_bytes=1 << 20, now=lambda: 1000, gate=gate)

        return await asyncio.gather(go(poisoned), go(innocent), return_exceptions=True)

    results = asyncio.run(together())
    assert engine.with_crash[-1] == ["hi 3", "hi 4", "hi 5"]  # its careful group: no request of chunk 0
    assert all(isinstance(r, EngineDown) for r in results)  # the innocent chunk could not run on a dead engine ...
    innocent_run = stores.batches.chunk_run("acme", "batch_1", 0)
    assert (innocent_run.failures, innocent_run.benign, innocent_run.open) == (0, 1, [])  # ... but is not blamed
    engine.restart()
    clean = run(stores, innocent, engine)
    assert clean.completed == 3 and not clean.careful
    deliver_until_counted(stores, poisoned, engine)
    out, err = parts(stores, 1)
    assert [l.custom_id for l in out] == ["req-3", "req-5"] and [l.error.code for l in err] == ["engine_crashed"]


def test_benign_ends_do_not_spend_the_budget():
    """Shutdown (cancelled), a store error, and an engine that was down before the chunk's lines
    reached it: ten of them, and the chunk still runs normally (no careful mode, nothing failed)."""
    stores = fake_stores()
    (message,) = seed(stores, 3, per_chunk=3)

    async def cancelled():
        task = asyncio.create_task(
            process_chunk(
                stores,
                message,
                InProcessEngine(lambda p, b, s: "hang"),
                io=direct,
                max_line_bytes=1 << 20,
                now=lambda: 1000,
            )
        )
        await asyncio.sleep(0.01)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)

    down = EngineGate()
    down.down = True  # the worker already saw the engine die
    dead = CrashingEngine()
    dead.down = True
    for _ in range(4):
        asyncio.run(cancelled())
        stores.faults.fail("objects.put", TimeoutError())  # the first checkpoint's PUT fails
        with pytest.raises(TimeoutError):
            run(stores, message, InProcessEngine(), policy=RunPolicy(checkpoint_min_seconds=0, checkpoint_lines=1))
        with pytest.raises(EngineDown):
            run(stores, message, dead, gate=down)
    record = stores.batches.chunk_run("acme", "batch_1", 0)
    assert_fields(record, failures=0, strikes=0, benign=12, open=[])
    engine = InProcessEngine()
    report = run(stores, message, engine)
    assert (report.completed, report.failed, report.careful) == (3, 0, False)


def test_a_redelivered_chunk_does_not_resend_written_lines():
    stores = fake_stores()
    (message,) = seed(stores, 10, per_chunk=10)
    first = CrashingEngine("hi 7", crash_after=9)
    with pytest.raises(EngineDown):  # every other line answered, then 7 crashes the engine
        asyncio.run(
            process_chunk(
                stores,
                message,
                first,
                io=direct,
                max_line_bytes=1 << 20,
                now=lambda: 1000,
                policy=RunPolicy(checkpoint_min_seconds=0, checkpoint_lines=3),
            )
        )
    assert stores.batches.chunk_run("acme", "batch_1", 0).written() == 6  # checkpoints 0-2, 3-5
    again = InProcessEngine()  # the line no longer crashes anything (say, a fixed engine)
    report = run(stores, message, again, policy=RunPolicy(checkpoint_min_seconds=0, checkpoint_lines=3))
    assert again.contents() == [f"hi {i}" for i in range(6, 10)] and report.reused == 6
    out, err = parts(stores)
    assert [l.custom_id for l in out] == [f"req-{i}" for i in range(10)] and err == []
    assert report.usage.output_tokens == 30 and stores.batches.get("acme", "batch_1").output_tokens == 30


def test_the_budget_ends_a_chunk_that_keeps_dying_without_progress():
    """The worker dies on this chunk before any line is written, every time (say, it runs out of
    memory reading it): after 3 such real failures the lines fail as chunk_failed and it counts."""
    stores = fake_stores()
    (message,) = seed(stores, 3, per_chunk=3)

    class Killed(BaseException):
        """The process died: nothing after this runs (no benign end is recorded)."""

    async def dies(fn, *args, **kwargs):
        result = fn(*args, **kwargs)
        if fn.__name__ == "begin_run":
            raise Killed
        return result

    for _ in range(3):
        with pytest.raises(Killed):
            asyncio.run(
                process_chunk(stores, message, InProcessEngine(), io=dies, max_line_bytes=1 << 20, now=lambda: 1000)
            )
    engine = InProcessEngine()
    report = run(stores, message, engine)
    out, err = parts(stores)
    assert engine.requests == [] and out == []
    assert [(l.custom_id, l.error.code) for l in err] == [(f"req-{i}", "chunk_failed") for i in range(3)]
    assert "died 3 times" in err[0].error.message
    assert (report.failed, stores.batches.get("acme", "batch_1").failed) == (3, 3)


def test_a_careful_chunk_runs_in_groups_alone_and_blames_nobody_when_nothing_dies():
    """A chunk killed once along with another's poison request (a real failure, no line in it at
    fault) runs its 20 lines in careful groups of 8, 8 and 4: three exclusive rounds, three
    checkpoints, nothing blamed."""
    from functions.core.records import ChunkRunRecord

    stores = fake_stores()
    (message,) = seed(stores, 20, per_chunk=20)
    stores.batches.save_chunk_run(
        ChunkRunRecord(tenant="acme", batch_id="batch_1", chunk=0, version=1, open=["killed"], expires_at=10**10)
    )
    engine = InProcessEngine()
    puts = stores.faults.calls["objects.put"]
    report = run(stores, message, engine, policy=RunPolicy(careful_group_lines=8))
    assert (report.completed, report.failed, report.careful, report.crashed) == (20, 0, True, 0)
    assert (
        stores.faults.calls["objects.put"] - puts == 3 + 1
    )  # checkpoints 0-8, 8-16, 16-20; the output part (no error line: no error part)
    record = stores.batches.chunk_run("acme", "batch_1", 0)
    assert sorted(record.segments) == [[0, 8], [8, 16], [16, 20]] and record.blamed == [] and record.failures == 1


def test_a_store_error_while_committing_is_benign_and_keeps_what_ran():
    """The counting transaction fails once (a store error after the lines ran): the attempt ends
    benignly, its results are checkpointed, and the next delivery sends nothing to the engine."""
    stores = fake_stores()
    (message,) = seed(stores, 3, per_chunk=3)
    stores.faults.fail("batches.count_chunk", TimeoutError())
    with pytest.raises(TimeoutError):
        run(stores, message, InProcessEngine())
    record = stores.batches.chunk_run("acme", "batch_1", 0)
    assert (record.failures, record.benign, record.written()) == (0, 1, 3)
    engine = InProcessEngine()
    report = run(stores, message, engine)
    assert engine.requests == [] and (report.completed, report.reused, report.careful) == (3, 3, False)
    assert stores.batches.get("acme", "batch_1").completed == 3


def test_an_audio_chunk_fetches_under_the_workers_media_policy_and_posts_multipart():
    audio = "/v1/audio/transcriptions"
    wav = "data:audio/wav;base64," + base64.b64encode(b"RIFF-audio").decode()
    bodies = [{"file_url": wav}, {"file_url": "http://10.0.0.1/a.wav"}]
    lines = [
        (
            json.dumps({"custom_id": f"a-{i}", "method": "POST", "url": audio, "body": {"model": "test-chat", **b}})
            + "\n"
        )
        for i, b in enumerate(bodies)
    ]
    data = "".join(lines).encode()

    def chunk(stores):
        stores.objects.put(schema.batch_input_key("acme", "batch_1"), data)
        batch = running_batch(created_at=1000, total=2, chunk_count=1, model="test-chat", endpoint=audio)
        stores.batches.put(batch)
        return batch.work_message(Chunk(chunk=0, byte_start=0, byte_end=len(data), first_line=1, line_count=2))

    def codes(stores):
        return [(row.custom_id, row.error.code if row.error else None) for row in parts(stores)[1]]

    engine = InProcessEngine()
    stores = fake_stores()
    report = run(stores, chunk(stores), engine)  # no allowlist: only the data: URL is accepted
    assert (report.completed, report.failed) == (1, 1)
    assert engine.requests == [(audio, {"model": "test-chat", "file": {"filename": "audio.bin", "bytes": 10}})]
    assert codes(stores) == [("a-1", "invalid_value")]
    stores = fake_stores()
    policy = RunPolicy(media=MediaPolicy(allowed_domains=("10.0.0.1",)))
    report = run(stores, chunk(stores), InProcessEngine(), policy=policy)  # listed, but a private address
    assert codes(stores) == [("a-1", "media_fetch_failed")]


def test_fast_lines_are_checkpointed_by_time_not_every_checkpoint_lines():
    """The line trigger waits ``checkpoint_min_seconds`` after the last checkpoint: lines that
    finish at once write no checkpoint before the commit; once the clock has moved on, the next
    ``checkpoint_lines`` results are checkpointed."""
    policy = RunPolicy(checkpoint_lines=3, checkpoint_seconds=0, checkpoint_min_seconds=1.0)
    stores = fake_stores()
    (message,) = seed(stores, 10, per_chunk=10)
    report = run(stores, message, InProcessEngine(), policy=policy)  # the clock never moves
    assert report.completed == 10 and stores.batches.chunk_run("acme", "batch_1", 0).written() == 0

    clock = iter(range(1000, 10_000))  # every reading a second later
    stores = fake_stores()
    (message,) = seed(stores, 10, per_chunk=10)
    first = CrashingEngine("hi 7", crash_after=9)
    with pytest.raises(EngineDown):
        asyncio.run(
            process_chunk(
                stores, message, first, io=direct, max_line_bytes=1 << 20, now=lambda: next(clock), policy=policy
            )
        )
    assert stores.batches.chunk_run("acme", "batch_1", 0).written() == 6  # checkpoints 0-2, 3-5
