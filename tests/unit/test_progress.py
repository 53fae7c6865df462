"""Live progress (docs/lifecycle.md, "Live progress"): GET /v1/batches/{id} of an open batch
shows the lines its chunks checkpointed, not only the counted chunks; the counts rise as
checkpoints are recorded, never go down, never pass the final counts, under a crash at (or
between) a checkpoint's writes and a redelivery; a counted chunk is not counted twice. And the
chunking rule that spreads a small batch over several chunks."""

import asyncio
import itertools
import json

from functions.api.batches import list_batches, wire
from functions.api.protocol import BatchListQuery
from functions.core import results, schema
from functions.core.records import ChunkRunRecord
from functions.core.settings import ModelRoute, Settings
from functions.ingest import logic as ingest
from gpu_worker.attempt import RunPolicy
from tests.builders import batch_record
from tests.chunks import process_chunk
from tests.fakes.aws import fake_stores
from tests.fakes.engine import InProcessEngine, chat_answer, content
from tests.unit.test_worker_loop import seed

#: A checkpoint every 2 finished lines (never for a chunk's last lines: the commit writes them).
EVERY_TWO = RunPolicy(checkpoint_min_seconds=0, checkpoint_lines=2, checkpoint_seconds=0)


def counts(stores) -> tuple[int, int]:
    rc = wire(stores, stores.batches.get("acme", "batch_1")).request_counts  # what GET shows
    return rc.completed, rc.failed


def polling(stores, polls: list[tuple[int, int]]):
    """The worker's ``io``, with a GET of the batch after every store call it makes."""

    async def io(fn, *args, **kwargs):
        try:
            return fn(*args, **kwargs)
        finally:
            polls.append(counts(stores))

    return io


def run(stores, message, engine, polls, *, io=None):
    return asyncio.run(
        process_chunk(
            stores,
            message,
            engine,
            io=io or polling(stores, polls),
            max_line_bytes=1 << 20,
            now=lambda: 1000,
            policy=EVERY_TWO,
        )
    )


def failing(*bad: str):
    """The engine answers 400 to the lines whose content is in ``bad``, 200 to the rest."""

    def respond(path, body, seen):
        return (400, {"error": {"message": "no"}}) if content(body) in bad else (200, chat_answer(body))

    return respond


def flaky_on_rerun(path, body, seen):
    """200 the first time a line is sent, 500 when it is sent again: a rerun line ends failed."""
    return (200, chat_answer(body)) if seen == 0 else (500, {"error": {"message": "down"}})


def assert_monotone_and_bounded(polls, final):
    for before, after in itertools.pairwise(polls):
        assert after[0] >= before[0] and after[1] >= before[1], polls
    for completed, failed in polls:
        assert completed <= final[0] and failed <= final[1], (polls, final)


def test_counts_rise_at_every_checkpoint_and_end_at_the_final_counts():
    stores = fake_stores()
    messages = seed(stores, 12, per_chunk=6)
    polls: list[tuple[int, int]] = []
    engine = InProcessEngine(failing("hi 1", "hi 8"))
    for message in messages:
        run(stores, message, engine, polls)
    final = (10, 2)  # 12 lines, two answered 400
    assert counts(stores) == final
    assert_monotone_and_bounded(polls, final)
    # Each chunk of 6: checkpoints after lines 2 and 4, then its commit: 6 steps of 2 lines.
    totals = sorted({c + f for c, f in polls})
    assert totals == [0, 2, 4, 6, 8, 10, 12]


def test_a_counted_chunk_is_not_counted_twice():
    stores = fake_stores()
    first, _ = seed(stores, 12, per_chunk=6)
    run(stores, first, InProcessEngine(failing("hi 1")), [])
    run_record = stores.batches.chunk_run("acme", "batch_1", 0)
    assert run_record.checkpointed() == (3, 1)  # its checkpoints stay on the run record ...
    assert counts(stores) == (5, 1)  # ... but its marker replaces them


def test_list_shows_the_live_counts_too():
    stores = fake_stores()
    first, _ = seed(stores, 12, per_chunk=6)
    run(stores, first, InProcessEngine(), [])
    stores.batches.save_chunk_run(
        ChunkRunRecord(
            tenant="acme",
            batch_id="batch_1",
            chunk=1,
            version=1,
            segments=[[0, 2]],
            outcomes={"0-2": "10"},
            expires_at=10**10,
        )
    )
    (batch,) = list_batches(stores, "acme", BatchListQuery()).data
    assert (batch.request_counts.completed, batch.request_counts.failed) == (6 + 1, 1)


def test_a_crash_at_the_checkpoint_write_shows_nothing_that_runs_again():
    """The checkpoint's object could not be written (the worker dies there): its lines were never
    shown, and their rerun (answered differently) decides the final counts."""
    stores = fake_stores()
    (message,) = seed(stores, 6, per_chunk=6)
    polls: list[tuple[int, int]] = []
    engine = InProcessEngine(flaky_on_rerun)
    stores.faults.fail("objects.put", RuntimeError("the worker died writing its checkpoint"))
    try:
        run(stores, message, engine, polls)
    except RuntimeError:
        pass
    assert counts(stores) == (0, 0)
    run(stores, message, engine, polls)  # SQS delivers it again
    final = counts(stores)
    assert final == (0, 6)  # every line ran twice, the second answer (500) is its result
    assert_monotone_and_bounded(polls, final)


def test_a_crash_between_the_checkpoint_and_its_record_shows_nothing_that_runs_again():
    stores = fake_stores()
    (message,) = seed(stores, 6, per_chunk=6)
    polls: list[tuple[int, int]] = []
    inner = polling(stores, polls)

    async def io(fn, *args, **kwargs):
        if fn.__name__ == "_checkpoint":  # its object is written, then the run record's write fails
            stores.faults.fail("batches.save_chunk_run", RuntimeError("the worker died before recording it"))
        return await inner(fn, *args, **kwargs)

    engine = InProcessEngine(flaky_on_rerun)
    try:
        run(stores, message, engine, polls, io=io)
    except RuntimeError:
        pass
    assert stores.objects.list_keys(schema.chunk_checkpoint_key("acme", "batch_1", 0, 0, 2)) != []  # written
    assert counts(stores) == (0, 0)  # but not shown
    run(stores, message, engine, polls)
    assert counts(stores) == (0, 6)
    assert_monotone_and_bounded(polls, (0, 6))


def test_a_redelivery_keeps_the_lines_shown_before_the_crash():
    """Two lines checkpointed and shown, then the worker dies: the redelivery reuses them (their
    rerun would fail), so the shown count never goes down and ends in the final counts."""
    stores = fake_stores()
    (message,) = seed(stores, 6, per_chunk=6)
    polls: list[tuple[int, int]] = []
    engine = InProcessEngine(flaky_on_rerun)
    real_put = stores.objects.put
    puts = []

    def put(key, *args, **kwargs):
        puts.append(key)
        if len(puts) == 2:
            raise RuntimeError("the worker died writing its second checkpoint")
        return real_put(key, *args, **kwargs)

    stores.objects.put = put
    try:
        run(stores, message, engine, polls)
    except RuntimeError:
        pass
    stores.objects.put = real_put
    assert counts(stores) == (2, 0)
    run(stores, message, engine, polls)
    final = counts(stores)
    assert final == (2, 4)  # the two checkpointed lines kept their answers; the rest ran again
    assert_monotone_and_bounded(polls, final)


def test_checkpointed_reads_overlapping_segments_once():
    record = ChunkRunRecord(
        tenant="acme",
        batch_id="b",
        chunk=0,
        expires_at=1,
        segments=[[0, 4], [2, 6], [9, 10]],
        outcomes={"0-4": "1100", "2-6": "0011", "9-10": "0"},
    )
    # lines 0-3 from the first segment, 4-5 from the second; 9 is not written (line 6 is missing)
    assert record.checkpointed() == (4, 2)


def test_a_terminal_batch_shows_its_own_counts_without_reading_the_chunks():
    stores = fake_stores()
    first, _ = seed(stores, 12, per_chunk=6)
    run(stores, first, InProcessEngine(), [])
    stores.batches.set("acme", "batch_1", status="completed", completed=12)
    stores.faults.fail("batches.chunk_progress", RuntimeError("not read"))
    assert counts(stores) == (12, 0)


# --- the chunking rule ------------------------------------------------------------------------
CHAT = "/v1/chat/completions"
QUEUE = "https://sqs.local/work-chat"
SETTINGS = Settings(
    table_name="t",
    bucket_name="b",
    chunk_max_lines=100,
    models={"chat": ModelRoute(endpoints=(CHAT,), queue_url=QUEUE)},
)


def chunks_of(n: int, settings: Settings = SETTINGS, blank_every: int = 0):
    stores = fake_stores()
    rows = []
    for i in range(n):
        rows.append(
            json.dumps({"custom_id": f"r{i}", "method": "POST", "url": CHAT, "body": {"model": "chat", "messages": []}})
        )
        if blank_every and i % blank_every == 0:
            rows.append("")
    key = schema.batch_input_key("acme", "batch_1")
    data = ("\n".join(rows) + "\n").encode()
    stores.objects.put(key, data)
    record = batch_record(input_key=key)
    result = ingest.validate(stores.objects, settings, record)
    assert not result.errors and result.total == n
    return result.chunks, data


def test_a_small_batch_is_spread_over_eight_chunks():
    chunks, data = chunks_of(200, blank_every=7)
    assert [c.line_count for c in chunks] == [25] * 8
    for before, after in itertools.pairwise(chunks):
        assert after.byte_start >= before.byte_end and after.chunk == before.chunk + 1
    # every request line is in exactly one chunk's bytes
    lines = [ln for c in chunks for ln in data[c.byte_start : c.byte_end].split(b"\n") if ln.strip()]
    assert len(lines) == 200 and len(set(lines)) == 200


def test_chunk_sizes_for_tiny_medium_and_large_batches():
    assert [c.line_count for c in chunks_of(5)[0]] == [5]  # at least 25 lines a chunk
    assert [c.line_count for c in chunks_of(35)[0]] == [25, 10]
    assert [c.line_count for c in chunks_of(250)[0]] == [32] * 7 + [26]
    # Large, on one engine: about 8 chunks, of at least chunk_max_lines and at most 250 lines.
    assert [c.line_count for c in chunks_of(801)[0]] == [101] * 7 + [94]
    assert ingest.chunk_lines(1_000, 25) == 125 and ingest.chunk_lines(5_000, 25) == 250  # make up's
    assert ingest.chunk_lines(20_000, 100) == 250 and ingest.chunk_lines(200, 100) == 25
    assert ingest.chunk_lines(50_000, 100) == 250 and ingest.chunk_lines(1_000_000, 100) == 250
    assert ingest.chunk_lines(50_000, 2000) == 2000  # a deployment's own larger chunk_max_lines wins
    # A fleet of engines: 8 chunks for each, up to 200 (then still one for each engine).
    assert [ingest.chunk_lines(5_000, 100, fleet) for fleet in (1, 4, 25)] == [250, 157, 100]
    assert [ingest.chunk_lines(30_000, 100, fleet) for fleet in (1, 25, 200)] == [250, 150, 150]


def test_a_large_batch_is_cut_into_chunks_of_at_most_250_lines():
    chunks, data = chunks_of(30_000, blank_every=11)
    assert [c.line_count for c in chunks] == [250] * 120
    lines = [ln for c in chunks for ln in data[c.byte_start : c.byte_end].split(b"\n") if ln.strip()]
    assert len(lines) == 30_000 and len(set(lines)) == 30_000  # every request line in one chunk's bytes


def test_the_byte_cap_still_cuts_a_small_batch():
    settings = SETTINGS.model_copy(update={"chunk_max_bytes": 300})
    chunks, _ = chunks_of(40, settings)
    assert all(c.byte_end - c.byte_start <= 300 for c in chunks) and sum(c.line_count for c in chunks) == 40
    assert len(chunks) > 2


def test_cancel_answers_with_the_live_counts_a_get_showed():
    from functions.api.batches import cancel_batch, get_batch

    stores = fake_stores()
    stores.batches.put(
        batch_record(
            id="batch_01m8ravz6dmgem5n60vf5eqb29",
            status="in_progress",
            accepting=True,
            total=12,
            chunk_count=2,
            input_key="k",
        )
    )
    stores.batches.save_chunk_run(
        ChunkRunRecord(
            tenant="acme",
            batch_id="batch_01m8ravz6dmgem5n60vf5eqb29",
            chunk=0,
            version=1,
            segments=[[0, 3]],
            outcomes={"0-3": "110"},
            expires_at=10**10,
        )
    )
    shown = get_batch(stores, "acme", "batch_01m8ravz6dmgem5n60vf5eqb29").request_counts
    cancelled = cancel_batch(stores, "acme", "batch_01m8ravz6dmgem5n60vf5eqb29", now=5)
    assert cancelled.status == "cancelling"
    assert (
        (shown.completed, shown.failed)
        == (cancelled.request_counts.completed, cancelled.request_counts.failed)
        == (2, 1)
    )
