"""The chunk lifecycle against the in-memory ports: counted once, only while the batch accepts
chunks; the last chunk (or its duplicate) signals; faults at the store propagate."""

import pytest

from functions.core import chunk_lifecycle, lifecycle
from functions.core.errors import Throttled
from functions.core.lifecycle import Signal
from functions.core.messages import WorkMessage
from functions.core.records import BatchRecord
from functions.core.results import Parts
from tests.builders import batch_record, work_message
from tests.fakes.aws import conflict, fake_stores, throttle


def batch(**over) -> BatchRecord:
    fields = dict(status="in_progress", model="m", total=3, chunk_count=2, accepting=True, task_token="token-1")
    return batch_record(**{**fields, **over})


def message(chunk: int) -> WorkMessage:
    return work_message(batch(), chunk=chunk, input_key="k", byte_end=10, line_count=2)


def record(stores, chunk: int, completed: int = 2, failed: int = 0, usage: chunk_lifecycle.Usage | None = None):
    return chunk_lifecycle.record_chunk(
        stores,
        message(chunk),
        parts=Parts(f"a{chunk}", completed, failed),
        usage=usage or chunk_lifecycle.Usage(),
        now=5,
    )


def test_each_chunk_counts_once_and_the_last_signals_complete():
    stores = fake_stores()
    stores.batches.put(batch())
    first = record(stores, 0)
    assert (first.counted, first.last) == (True, False) and stores.workflows.signals == []
    again = record(stores, 0)
    assert (again.counted, again.last) == (False, False)
    last = record(stores, 1, completed=1, failed=1)
    assert (last.counted, last.last) == (True, True)
    assert stores.workflows.signals == [("token-1", {"outcome": "complete"})]
    assert (last.batch.completed, last.batch.failed, last.batch.chunks_done) == (3, 1, 2)
    # A duplicate of the last chunk signals again (its first delivery may have died before it).
    dup = record(stores, 1)
    assert (dup.counted, dup.last) == (False, True) and len(stores.workflows.signals) == 2


def test_a_closed_batch_counts_nothing():
    stores = fake_stores()
    stores.batches.put(batch(accepting=False))
    outcome = record(stores, 0)
    assert not outcome.counted and outcome.batch.chunks_done == 0 and stores.workflows.signals == []


def test_the_last_chunk_before_the_workflow_waits_does_not_signal():
    stores = fake_stores()
    stores.batches.put(batch(chunk_count=1, task_token=None))
    outcome = record(stores, 0)
    assert outcome.last and stores.workflows.signals == []  # register() signals when the token arrives


def test_usage_is_summed_with_cached_and_reasoning_tokens():
    usage = chunk_lifecycle.Usage()
    usage.add_response(
        {
            "prompt_tokens": 10,
            "completion_tokens": 4,
            "prompt_tokens_details": {"cached_tokens": 6},
            "completion_tokens_details": {"reasoning_tokens": 3},
        }
    )
    usage.add_response(
        {
            "input_tokens": 5,
            "output_tokens": 2,
            "input_tokens_details": {"cached_tokens": 1},
            "output_tokens_details": {"reasoning_tokens": 2},
        }
    )
    usage.add_response(None)
    assert usage.model_dump() == {"input_tokens": 15, "cached_tokens": 7, "output_tokens": 6, "reasoning_tokens": 5}
    stores = fake_stores()
    stores.batches.put(batch(chunk_count=1))
    outcome = record(stores, 0, usage=usage)
    assert (
        outcome.batch.input_tokens,
        outcome.batch.cached_tokens,
        outcome.batch.output_tokens,
        outcome.batch.reasoning_tokens,
    ) == (15, 7, 6, 5)
    wire = outcome.batch.to_wire().usage
    assert wire.input_tokens_details.cached_tokens == 7 and wire.output_tokens_details.reasoning_tokens == 5
    assert wire.total_tokens == 21


def test_an_attempt_opens_in_one_conditional_write_only_while_the_batch_takes_chunks():
    stores = fake_stores()
    stores.batches.put(batch())
    start = chunk_lifecycle.begin_run(stores, message(1), "a", max_strikes=3, max_failures=10, read=True)
    assert start is not None and start.record.open == ["a"]
    # the run record was just read (absent): one write, no read, nothing on the batch's item
    assert stores.faults.calls["batches.save_chunk_run"] == 1 and stores.faults.calls["batches.chunk_run"] == 0
    assert stores.faults.calls["batches.transition"] == 0
    stores.batches.put(batch(status="cancelling"))
    assert begin(stores, "b", chunk=0) is None
    assert stores.batches.chunk_run("acme", "batch_1", 0) is None  # nothing written
    stores.batches.put(batch(accepting=False))
    assert begin(stores, "b", chunk=0) is None
    assert (
        chunk_lifecycle.begin_run(
            stores, message(0).model_copy(update={"batch_id": "nope"}), "b", max_strikes=3, max_failures=10
        )
        is None
    )


@pytest.mark.parametrize("fault", [throttle(), conflict()])
def test_a_store_fault_while_counting_propagates_and_counts_nothing(fault):
    stores = fake_stores()
    stores.batches.put(batch())
    stores.faults.fail("batches.count_chunk", fault)
    with pytest.raises(Throttled):
        record(stores, 0)
    assert stores.batches.get("acme", "batch_1").chunks_done == 0
    assert record(stores, 0).counted  # the retry counts it


def test_signal_vocabulary():
    assert [s.output() for s in Signal] == [{"outcome": "complete"}, {"outcome": "cancel"}, {"outcome": "expire"}]
    assert lifecycle.event_type("completed") == "batch.completed"


# --- the chunk's run record: its poison budget ----------------------------------------------------
def begin(stores, attempt, chunk=0):
    if stores.batches.get("acme", "batch_1") is None:
        stores.batches.put(batch())  # an attempt opens only while its batch takes chunks
    return chunk_lifecycle.begin_run(stores, message(chunk), attempt, max_strikes=3, max_failures=10)


def test_attempts_left_open_are_real_failures_and_benign_ends_are_not():
    stores = fake_stores()
    assert begin(stores, "a").died == 0
    chunk_lifecycle.end_run(stores, message(0), "a")  # shutdown: benign
    start = begin(stores, "b")
    assert (start.died, start.record.failures, start.record.benign, start.record.open) == (0, 0, 1, ["b"])
    start = begin(stores, "c")  # "b" never ended: it died
    assert (start.died, start.record.failures, start.record.strikes, start.record.open) == (1, 1, 1, ["c"])
    assert start.record.careful and not start.exhausted


def test_a_dead_group_makes_suspects_and_a_dead_single_line_is_blamed():
    stores = fake_stores()
    first = begin(stores, "a")
    chunk_lifecycle.mark_in_flight(stores, message(0), "a", (0, 8), first.record)  # a careful group of 8 dies
    start = begin(stores, "b")
    assert (start.record.suspects, start.record.blamed, start.record.strikes) == (list(range(8)), [], 0)
    assert start.record.in_flight is None
    record = chunk_lifecycle.add_segment(stores, message(0), "b", (0, 1), start.record)  # line 0 ran alone
    chunk_lifecycle.mark_in_flight(stores, message(0), "b", (1, 2), record)  # line 1 alone dies
    start = begin(stores, "c")
    assert (start.record.blamed, start.record.failures, start.record.strikes) == ([1], 2, 0)


def test_the_budget_is_spent_by_failures_without_progress_or_too_many_in_all():
    stores = fake_stores()
    begin(stores, "a0")
    for n in range(1, 4):
        start = begin(stores, f"a{n}")  # died again with nothing written
    assert (start.record.strikes, start.exhausted) == (3, True)
    other = fake_stores()
    start = begin(other, "b0")
    for n in range(1, 11):  # each attempt writes a line, then dies: progress, but 10 deaths in all
        chunk_lifecycle.add_segment(other, message(0), f"b{n - 1}", (n - 1, n), start.record)
        start = begin(other, f"b{n}")
        assert start.record.strikes == 0
    assert (start.record.failures, start.exhausted) == (10, True)


def test_a_concurrent_change_of_the_run_record_is_merged_not_lost():
    stores = fake_stores()
    stale = begin(stores, "a").record
    chunk_lifecycle.add_segment(stores, message(0), "a", (0, 5), stale)
    record = chunk_lifecycle.add_segment(stores, message(0), "a", (5, 9), stale)  # written over a stale copy
    assert record.segments == [[0, 5], [5, 9]] and record.written() == 9
