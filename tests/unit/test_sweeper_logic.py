"""The sweeper against the in-memory ports: each kind of batch the normal path can leave open
(validating past its deadline, cancelled before it started, never enqueued, past its expiry with
no workflow) is ended or restarted once; nothing early; duplicates, faults and one bad batch."""

import json

import pytest

from functions.core import lifecycle, schema
from functions.core.errors import Throttled
from functions.core.messages import Chunk, ChunkManifest
from functions.core.records import BatchRecord
from functions.core.settings import ModelRoute, Settings
from functions.core.wire import BatchOutputLine
from functions.sweeper import logic as sweeper
from functions.workflow import logic as workflow
from functions.workflow.tasks import TaskError
from tests.agreement import assert_stores_agree
from tests.builders import assert_fields, batch_record, cut, put_manifest
from tests.fakes.aws import fake_stores, throttle
from tests.unit.chunk_steps import run_chunk

CHAT = "/v1/chat/completions"
QUEUE = "https://sqs.local/work-chat"
CREATED = 10_000
EXPIRES = CREATED + 86_400
SETTINGS = Settings(
    table_name="t",
    bucket_name="b",
    models={"chat": ModelRoute(endpoints=(CHAT,), queue_url=QUEUE)},
    validating_timeout_seconds=3_600,
    enqueue_grace_seconds=300,
    expiry_grace_seconds=900,
)
INGEST_FAILED = "ingest_failed"


def setup(stores=None, batch_id: str = "batch_1", lines: int = 4, per_chunk: int = 2, **over):
    """A batch with ``lines`` requests in chunks of ``per_chunk`` (input and manifest written),
    stored as ``over`` says (``validating`` by default)."""
    stores = stores or fake_stores()
    key = schema.batch_input_key("acme", batch_id)
    rows = [
        json.dumps({"custom_id": f"req-{i}", "method": "POST", "url": CHAT, "body": {"model": "chat"}}).encode() + b"\n"
        for i in range(lines)
    ]
    stores.objects.put(key, b"".join(rows))
    put_manifest(stores, cut(rows, per_chunk), batch_id=batch_id)
    stores.batches.put(batch_record(id=batch_id, created_at=CREATED, **over))
    return stores


RUNNING = dict(status="in_progress", in_progress_at=CREATED + 10, model="chat", total=4, chunk_count=2, accepting=True)


def current(stores, batch_id: str = "batch_1") -> BatchRecord:
    return stores.batches.get("acme", batch_id)


def sweep(stores, now: int):
    return sweeper.sweep(stores, SETTINGS, now=now)


def file_lines(stores, file_id) -> list[BatchOutputLine]:
    if file_id is None:
        return []
    return [
        BatchOutputLine.model_validate_json(l)
        for l in stores.objects.get(schema.file_key("acme", file_id)).splitlines()
    ]


# --- the open-batch index ----------------------------------------------------------------------
def test_only_open_batches_are_looked_at():
    stores = setup(**RUNNING, enqueued=True)
    setup(stores, "batch_2", status="completed", completed_at=CREATED + 50)
    setup(stores, "batch_3", status="failed", failed_at=CREATED + 50)
    result = sweep(stores, CREATED + 100)
    assert result.looked == 1 and result.actions == {} and result.errors == []
    assert stores.faults.calls["batches.open_batches"] == 1
    assert stores.faults.calls["batches.get"] == 1  # one read per OPEN batch, none for the others


# --- validating --------------------------------------------------------------------------------
def test_a_validating_batch_is_left_alone_before_its_deadline():
    stores = setup()
    assert sweep(stores, CREATED + 3_599).actions == {}
    assert current(stores).status == "validating"


def test_a_validating_batch_past_its_deadline_fails_with_the_clear_ingest_error():
    stores = setup()
    assert sweep(stores, CREATED + 3_600).actions == {sweeper.FAILED_VALIDATING: ["batch_1"]}
    batch = current(stores)
    assert_fields(batch, status="failed", failed_at=CREATED + 3_600)
    assert [e["code"] for e in batch.errors] == [INGEST_FAILED]
    assert stores.events.types() == ["batch.failed"]
    # a second sweep (or a duplicate invocation) changes nothing
    assert sweep(stores, CREATED + 4_000).looked == 0
    assert stores.events.types() == ["batch.failed"]


def test_a_validating_batch_with_a_short_window_fails_at_its_expiry_plus_grace():
    stores = setup(expires_at=CREATED + 30)
    assert sweep(stores, CREATED + 30 + 899).actions == {}
    assert sweep(stores, CREATED + 30 + 900).actions == {sweeper.FAILED_VALIDATING: ["batch_1"]}


# --- cancelled before it started ---------------------------------------------------------------
def test_a_batch_cancelled_while_validating_ends_cancelled_after_the_grace():
    stores = setup(status="cancelling", cancelling_at=CREATED + 5)
    assert sweep(stores, CREATED + 5 + 299).actions == {}
    assert sweep(stores, CREATED + 5 + 300).actions == {sweeper.CANCELLED: ["batch_1"]}
    assert current(stores).status == "cancelled" and stores.events.types() == ["batch.cancelled"]
    assert stores.workflows.started == {}


# --- never enqueued (StartExecution or the fan-out kept failing) ----------------------------------
def test_a_batch_not_enqueued_is_fanned_out_and_started_again_after_the_grace():
    stores = setup(**RUNNING)
    assert sweep(stores, CREATED + 10 + 299).actions == {}
    assert stores.workflows.started == {}
    assert sweep(stores, CREATED + 10 + 300).actions == {sweeper.RESTARTED: ["batch_1"]}
    assert current(stores).enqueued and list(stores.workflows.started) == ["batch_1"]
    assert len(stores.queues.queue(QUEUE).bodies()) == 2
    assert sweep(stores, CREATED + 1_000).actions == {}  # enqueued now: nothing more
    assert len(stores.queues.queue(QUEUE).bodies()) == 2


def test_a_start_that_fails_again_is_retried_by_the_next_sweep():
    stores = setup(**RUNNING)
    stores.faults.fail("workflows.start", throttle(), times=2)
    for now in (CREATED + 400, CREATED + 700):
        result = sweep(stores, now)
        assert result.errors == ["batch_1"] and not current(stores).enqueued
    assert sweep(stores, CREATED + 1_000).actions == {sweeper.RESTARTED: ["batch_1"]}
    assert current(stores).enqueued and list(stores.workflows.started) == ["batch_1"]


# --- every chunk counted, its workflow dead (failed, aborted or timed out without finalizing) ---------
#: A live workflow sees an all-counted batch within one reconcile period (300 s by default) and
#: finalizes it in its Drain and Finalize tasks, which the expiry grace (900 s here) covers: the
#: sweeper waits both past the batch's last change.
COMPLETION_GRACE = 300 + 900


def test_the_completion_grace_outlasts_a_live_workflows_wait_and_tasks():
    assert sweeper.completion_grace(SETTINGS) == COMPLETION_GRACE
    assert sweeper.completion_grace(Settings(table_name="t", bucket_name="b")) == 20 * 60  # the defaults
    tight = Settings(table_name="t", bucket_name="b", reconcile_seconds=60, expiry_grace_seconds=30)
    assert sweeper.completion_grace(tight) > tight.reconcile_seconds


def test_an_all_counted_batch_whose_workflow_died_is_finalized_completed_after_the_grace():
    stores = setup(**RUNNING, enqueued=True)  # its workflow died after the chunks were sent
    run_chunk(stores, 0, now=CREATED + 100)
    run_chunk(stores, 1, now=CREATED + 200)
    last = CREATED + 200
    assert sweep(stores, last + COMPLETION_GRACE - 1).actions == {}  # a live workflow's time
    assert current(stores).status == "in_progress"
    assert sweep(stores, last + COMPLETION_GRACE).actions == {sweeper.COMPLETED: ["batch_1"]}
    batch = current(stores)
    assert_fields(batch, status="completed", completed_at=last + COMPLETION_GRACE)
    assert batch.completed_at < batch.expires_at - 80_000  # long before its expiry
    out, err = assert_stores_agree(stores, "acme", "batch_1", [f"req-{i}" for i in range(4)])
    assert len(out) == 4 and err == []
    assert stores.events.types() == ["batch.completed"]
    assert sweep(stores, last + COMPLETION_GRACE + 300).looked == 0  # ended: off the open index


def test_the_grace_counts_from_the_last_count():
    stores = setup(**RUNNING, enqueued=True)
    run_chunk(stores, 0, now=CREATED + 100)
    run_chunk(stores, 1, now=CREATED + 5_000)  # a slow last chunk: its worker signalled a live workflow
    assert sweep(stores, CREATED + 100 + COMPLETION_GRACE).actions == {}
    assert sweep(stores, CREATED + 5_000 + COMPLETION_GRACE - 1).actions == {}
    assert sweep(stores, CREATED + 5_000 + COMPLETION_GRACE).actions == {sweeper.COMPLETED: ["batch_1"]}


def test_a_batch_still_running_chunks_is_left_to_its_workflow():
    stores = setup(**RUNNING, enqueued=True)
    run_chunk(stores, 0, now=CREATED + 100)  # chunk 1 not counted yet
    assert sweep(stores, CREATED + 100 + 10 * COMPLETION_GRACE).actions == {}
    assert current(stores).status == "in_progress"


def test_an_all_counted_cancelling_batch_ends_cancelled_with_every_answer():
    stores = setup(**RUNNING, enqueued=True)
    run_chunk(stores, 0, now=CREATED + 100)
    run_chunk(stores, 1, now=CREATED + 200)
    stores.batches.set("acme", "batch_1", status="cancelling", cancelling_at=CREATED + 300)
    assert sweep(stores, CREATED + 300 + COMPLETION_GRACE - 1).actions == {}  # the cancel restarts the wait
    assert sweep(stores, CREATED + 300 + COMPLETION_GRACE).actions == {sweeper.COMPLETED: ["batch_1"]}
    assert current(stores).status == "cancelled"
    out, _ = assert_stores_agree(stores, "acme", "batch_1", [f"req-{i}" for i in range(4)])
    assert len(out) == 4


def test_a_batch_whose_fail_ran_out_of_retries_ends_failed_with_its_files():
    # The Fail state closed the batch (closed_for "fail") and a transient error outlasted its
    # retries: the execution failed. The sweeper finalizes it as Fail would have.
    stores = setup(**RUNNING, enqueued=True)
    run_chunk(stores, 0, now=CREATED + 100)
    run_chunk(stores, 1, now=CREATED + 200)
    real_transition, throttled = stores.batches.transition, iter(range(4))

    def transition(tenant, batch_id, change, **kwargs):  # the terminal write throttles 4 times
        if change.terminal and next(throttled, None) is not None:
            raise throttle()
        return real_transition(tenant, batch_id, change, **kwargs)

    stores.batches.transition = transition
    for attempt in range(4):  # the Fail task and its 3 retries
        with pytest.raises(Throttled):
            workflow.fail(stores, "acme", "batch_1", TaskError(Error="States.TaskFailed"), CREATED + 210 + attempt)
    assert_fields(current(stores), status="in_progress", closed_for="fail", accepting=False)
    assert sweep(stores, CREATED + 200 + COMPLETION_GRACE).actions == {sweeper.COMPLETED: ["batch_1"]}
    batch = current(stores)
    assert batch.status == "failed" and batch.errors == [workflow.FAILED_WITH_FILES_ERROR]
    out, _ = assert_stores_agree(stores, "acme", "batch_1", [f"req-{i}" for i in range(4)])
    assert len(out) == 4


# --- past expiry + grace, whatever happened to its workflow ----------------------------------------
def test_an_open_batch_past_expiry_and_grace_is_finalized_expired_with_its_files():
    stores = setup(**RUNNING, enqueued=True)  # its workflow died: nothing will signal or check it
    run_chunk(stores, 0, now=CREATED + 100)
    assert sweep(stores, EXPIRES + 899).actions == {}
    assert sweep(stores, EXPIRES + 900).actions == {sweeper.EXPIRED: ["batch_1"]}
    batch = current(stores)
    assert_fields(batch, status="expired", expired_at=EXPIRES + 900, completed=2, failed=2)
    assert [l.custom_id for l in file_lines(stores, batch.output_file_id)] == ["req-0", "req-1"]
    errors = file_lines(stores, batch.error_file_id)
    assert [(l.custom_id, l.error.code) for l in errors] == [("req-2", "batch_expired"), ("req-3", "batch_expired")]
    assert stores.events.types() == ["batch.expired"]
    assert sweep(stores, EXPIRES + 1_000).looked == 0


def test_a_batch_never_enqueued_past_expiry_is_expired_not_restarted():
    stores = setup(**RUNNING)
    assert sweep(stores, EXPIRES + 900).actions == {sweeper.EXPIRED: ["batch_1"]}
    assert current(stores).status == "expired" and stores.workflows.started == {}
    assert [l.error.code for l in file_lines(stores, current(stores).error_file_id)] == ["batch_expired"] * 4


def test_a_cancelling_batch_past_expiry_and_grace_ends_cancelled():
    stores = setup(**{**RUNNING, "status": "cancelling"}, cancelling_at=CREATED + 20, enqueued=True)
    assert sweep(stores, EXPIRES + 900).actions == {sweeper.EXPIRED: ["batch_1"]}
    assert current(stores).status == "cancelled"
    assert [l.error.code for l in file_lines(stores, current(stores).error_file_id)] == ["batch_cancelled"] * 4


def test_a_finalize_that_keeps_failing_gives_way_to_fail_after_a_second_grace():
    stores = setup(**RUNNING, enqueued=True)
    stores.faults.fail("batches.counted_chunks", throttle(), times=1_000)  # assembly cannot read
    result = sweep(stores, EXPIRES + 900)
    assert result.errors == ["batch_1"] and current(stores).status == "finalizing"
    assert sweep(stores, EXPIRES + 1_799).errors == ["batch_1"]
    assert sweep(stores, EXPIRES + 1_800).actions == {sweeper.FAILED: ["batch_1"]}
    batch = current(stores)
    assert batch.status == "failed" and [e["code"] for e in batch.errors] == ["batch_failed"]
    assert "Throttled" not in json.dumps(batch.errors)  # internals stay in the logs


def test_one_failing_batch_does_not_stop_the_sweep():
    stores = setup(**RUNNING)  # batch_1: its restart will fail
    setup(stores, "batch_2")  # batch_2: validating past its deadline
    stores.faults.fail("workflows.start", throttle())
    result = sweep(stores, CREATED + 3_600)
    assert result.errors == ["batch_1"] and result.actions == {sweeper.FAILED_VALIDATING: ["batch_2"]}


def test_a_batch_ended_between_the_index_read_and_its_read_is_left_alone():
    stores = setup()
    real_get = stores.batches.get

    def ended_meanwhile(tenant, batch_id):
        stores.batches.transition(tenant, batch_id, lifecycle.refuse(1, []))
        return real_get(tenant, batch_id)

    stores.batches.get = ended_meanwhile
    assert sweep(stores, CREATED + 10_000).actions == {}
    del stores.batches.get
    assert current(stores).failed_at == 1 and stores.events.published == []


@pytest.mark.parametrize("status", ["in_progress", "finalizing"])
def test_a_running_batch_within_its_window_is_left_alone(status):
    stores = setup(**{**RUNNING, "status": status}, enqueued=True)
    before = current(stores)
    assert sweep(stores, EXPIRES + 899).actions == {}
    assert current(stores) == before
