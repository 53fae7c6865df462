"""One chunk through ``gpu_worker.chunk.process_chunk`` against the in-memory stores and an
in-process engine: usage totals (cached and reasoning tokens included) reach the chunk's marker
and the batch; a chunk already counted, or of a stopped batch, runs nothing; the commit (parts +
count) is not interrupted by a cancelled caller."""

import asyncio

from functions.core.accounting import Usage
from gpu_worker.chunk import process_chunk
from tests.fakes.engine import InProcessEngine, chat_answer, content
from tests.fakes.aws import fake_stores
from tests.unit.test_worker_loop import seed


async def direct(fn, *args, **kwargs):
    return fn(*args, **kwargs)


def run(stores, message, engine, **kwargs):
    return asyncio.run(process_chunk(stores, message, engine, io=direct, max_line_bytes=1024 * 1024, now=lambda: 1000, **kwargs))


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
    assert (batch.input_tokens, batch.cached_tokens, batch.output_tokens, batch.reasoning_tokens) == (40, 32, 10, 6)
    assert (batch.completed, batch.failed, batch.chunks_done) == (2, 1, 1)


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
    stores.batches.update("acme", "batch_1", values={"status": "cancelling"})
    engine = InProcessEngine()
    report = run(stores, message, engine)
    assert report.skipped and engine.requests == [] and stores.batches.counted_chunk("acme", "batch_1", 0) is None
    assert stores.objects.list_keys("batches/acme/batch_1/parts/") == []


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
        task = asyncio.create_task(process_chunk(
            stores, message, InProcessEngine(), io=io, max_line_bytes=1024 * 1024, commits=commits,
        ))
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
    stores.batches.update("acme", "batch_1", values={"task_token": "token-1"})
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
    stores.batches.update("acme", "batch_1", values={"task_token": "token-1"})
    run(stores, first, InProcessEngine())
    assert run(stores, first, InProcessEngine()).skipped and stores.workflows.signals == []
