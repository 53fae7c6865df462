"""A batch counted on shards (docs/lifecycle.md, "Counting shards"): its chunks start and count on
their shard's item, each shard is folded into the batch once, the last fold signals the workflow,
and drain and close stop the shards as they stop the batch. On the in-memory fakes."""

import json

import pytest

from functions.core import chunk_lifecycle, limits, schema
from functions.core.lifecycle import Signal, request_cancel
from functions.core.messages import ChunkManifest
from functions.core.records import CountShardRecord
from functions.ingest.logic import chunk_lines
from functions.workflow import logic
from tests.agreement import assert_stores_agree
from tests.builders import CHAT, cut, put_manifest, running_batch
from tests.chunks import open_attempt
from tests.fakes.aws import fake_stores, throttle
from tests.unit.chunk_steps import run_chunk
from tests.unit.test_workflow_logic import SETTINGS

NOW = 5_000
LINES = 70  # one line a chunk: 70 chunks, 3 shards


def setup(lines: int = LINES):
    stores = fake_stores()
    rows = [
        json.dumps({"custom_id": f"req-{i}", "method": "POST", "url": CHAT, "body": {"model": "m"}}).encode() + b"\n"
        for i in range(lines)
    ]
    key = schema.batch_input_key("acme", "batch_1")
    stores.objects.put(key, b"".join(rows))
    chunks = put_manifest(stores, cut(rows, 1)).chunks
    batch = running_batch(
        chunk_count=len(chunks),
        count_shards=limits.count_shards(len(chunks)),
        in_progress_at=200,
        model="m",
        total=lines,
        task_token="tok",
    )
    stores.batches.put(batch)
    stores.batches.open_shards(CountShardRecord.of(batch, chunk_lifecycle.MARKER_RETENTION_SECONDS))
    return stores


def message(stores, chunk: int):
    batch = stores.batches.get("acme", "batch_1")
    manifest = ChunkManifest.model_validate_json(stores.objects.get(schema.batch_manifest_key("acme", "batch_1")))
    return batch.work_message(manifest.chunks[chunk])


def test_the_shard_count_follows_the_chunk_count():
    assert [limits.count_shards(n) for n in (0, 1, 32, 33, 64, 65, 200, 1000, 2000, 10**6)] == [
        1,
        1,
        1,
        2,
        2,
        3,
        7,
        32,
        63,
        limits.MAX_COUNT_SHARDS,
    ]
    assert limits.count_shards(LINES) == 3


def test_every_chunk_counts_on_its_shard_and_the_last_fold_signals_once():
    stores = setup()
    outcomes = [run_chunk(stores, c, now=NOW) for c in range(LINES)]
    assert all(o.counted for o in outcomes)
    assert [c for c, o in enumerate(outcomes) if o.last] == [LINES - 1]
    # The batch's item was written only by the three folds, never by a chunk's opening or count.
    assert stores.faults.calls["batches.transition"] == 0 and stores.faults.calls["batches.fold_shard"] == 3
    batch = stores.batches.get("acme", "batch_1")
    assert (batch.chunks_done, batch.completed, batch.failed) == (LINES, LINES, 0)
    shards = stores.batches.count_shards(batch)
    assert [s.chunk_count for s in shards] == [24, 23, 23] and all(s.folded for s in shards)
    assert stores.workflows.signals == [("tok", {"outcome": str(Signal.COMPLETE)})]
    assert logic.finalize(stores, "acme", "batch_1", Signal.COMPLETE, NOW) == {"status": "completed"}
    assert stores.batches.get("acme", "batch_1").completed == LINES
    assert_stores_agree(stores, "acme", "batch_1", [f"req-{i}" for i in range(LINES)])


def test_a_duplicate_of_a_shard_s_last_chunk_folds_nothing_twice():
    stores = setup()
    for c in range(LINES):
        run_chunk(stores, c, now=NOW)
    again = run_chunk(stores, LINES - 1, now=NOW)
    assert not again.counted and again.last  # it may signal again, harmlessly
    assert stores.batches.get("acme", "batch_1").chunks_done == LINES


def test_a_fold_lost_with_its_worker_is_made_by_the_chunk_s_redelivery():
    stores = setup()
    for c in range(LINES - 1):
        run_chunk(stores, c, now=NOW)
    fault = throttle()
    stores.faults.fail("batches.fold_shard", fault)
    with pytest.raises(type(fault)):  # the worker's store call fails after the count: the message stays
        run_chunk(stores, LINES - 1, now=NOW)
    assert stores.batches.get("acme", "batch_1").chunks_done == LINES - 24  # that shard is not folded
    assert stores.workflows.signals == []
    # The redelivery finds the chunk counted: the fold and the signal happen then.
    assert chunk_lifecycle.signal_if_all_counted(stores, message(stores, LINES - 1)) is True
    assert stores.batches.get("acme", "batch_1").chunks_done == LINES
    assert len(stores.workflows.signals) == 1


def test_cancel_stops_new_chunks_on_the_shards_and_the_close_refuses_late_counts():
    stores = setup()
    run_chunk(stores, 0, now=NOW)
    running = message(stores, 1)
    assert open_attempt(stores, running) is not None  # a worker is on chunk 1
    request_cancel(stores, stores.batches.get("acme", "batch_1"), NOW)
    # The API writes no chunk partition: the workflow its cancel resumed stops the shards.
    assert stores.faults.calls["batches.close_shards"] == 0
    drained = logic.drain(stores, SETTINGS, "acme", "batch_1", Signal.CANCEL, NOW)
    assert drained == {"drained": False, "reason": Signal.CANCEL}  # chunk 1 still runs
    assert open_attempt(stores, message(stores, 2)) is None
    assert logic.finalize(stores, "acme", "batch_1", Signal.CANCEL, NOW) == {"status": "cancelled"}
    assert all(not s.accepting for s in stores.batches.count_shards(stores.batches.get("acme", "batch_1")))
    late = run_chunk(stores, 1, now=NOW)
    assert not late.counted
    batch = stores.batches.get("acme", "batch_1")
    assert (batch.status, batch.completed, batch.failed) == ("cancelled", 1, LINES - 1)


def _count_all_but_the_last_fold(stores):
    """Every chunk counted; the worker of the last one died between its count and its fold."""
    for c in range(LINES - 1):
        run_chunk(stores, c, now=NOW)
    fault = throttle()
    stores.faults.fail("batches.fold_shard", fault)
    with pytest.raises(type(fault)):
        run_chunk(stores, LINES - 1, now=NOW)
    assert stores.batches.get("acme", "batch_1").chunks_done == LINES - 24
    assert stores.workflows.signals == []


def test_a_lost_fold_is_made_by_the_workflow_s_reconciling_check():
    stores = setup()
    _count_all_but_the_last_fold(stores)  # and its message was dead-lettered: no redelivery
    assert logic.check(stores, "acme", "batch_1", 300, NOW) == {"outcome": str(Signal.COMPLETE), "timeout_seconds": 0}
    assert stores.batches.get("acme", "batch_1").chunks_done == LINES
    assert logic.check(stores, "acme", "batch_1", 300, NOW)["outcome"] == str(Signal.COMPLETE)  # folds nothing twice
    assert stores.faults.calls["batches.fold_shard"] == 4
    assert logic.finalize(stores, "acme", "batch_1", Signal.COMPLETE, NOW) == {"status": "completed"}
    assert_stores_agree(stores, "acme", "batch_1", [f"req-{i}" for i in range(LINES)])


def test_a_lost_fold_is_made_by_the_dead_letter_consumer_and_by_the_sweeper():
    from functions.chunk_dlq.logic import fail_chunk
    from functions.sweeper import logic as sweeper

    stores = setup()
    _count_all_but_the_last_fold(stores)
    outcome = fail_chunk(stores, message(stores, LINES - 1), now=NOW)
    assert (outcome.action, outcome.last) == ("already_counted", True)
    assert stores.batches.get("acme", "batch_1").chunks_done == LINES
    assert len(stores.workflows.signals) == 1

    stores = setup()
    _count_all_but_the_last_fold(stores)
    later = NOW + sweeper.completion_grace(SETTINGS)
    assert sweeper.sweep_batch(stores, SETTINGS, "acme", "batch_1", now=later) == sweeper.COMPLETED
    batch = stores.batches.get("acme", "batch_1")
    assert (batch.status, batch.completed) == ("completed", LINES)


def test_live_counts_read_every_shard():
    from functions.api.batches import live_counts

    stores = setup()
    for c in (0, 1, 2, 3):  # one shard has two counted, the others one each
        run_chunk(stores, c, now=NOW)
    counts = live_counts(stores, stores.batches.get("acme", "batch_1"))
    assert (counts.completed, counts.failed, counts.total) == (4, 0, LINES)


@pytest.mark.parametrize(
    ("total", "fleet", "lines"),
    [
        (50_000, 1, 250),
        (50_000, 200, 250),
        (50_000, 1_000, 50),
        (5_000, 1_000, 25),
        (800, 1, 100),
        (100, 1_000, 25),
        (5_000, 1, 250),
    ],
)
def test_a_big_fleet_gets_a_chunk_per_engine(total, fleet, lines):
    assert chunk_lines(total, 100, fleet) == lines
