"""The workflow's tasks against the in-memory ports: register when the signal came first, drain
within and after the grace period, finalize (files in input order, never-ran lines, idempotent, a
concurrent finish, an aborted assembly leaves no object), fail; and the typed task events."""

import json

import pytest
from botocore.exceptions import ClientError
from pydantic import ValidationError

from functions.core import chunk_lifecycle, results, schema
from functions.core.lifecycle import Signal
from functions.core.messages import ChunkManifest
from functions.core.records import BatchRecord, ChunkRunRecord
from functions.core.settings import Settings
from functions.core.wire import BatchOutputLine
from functions.workflow import logic, tasks
from functions.workflow.tasks import Check, Drain, Fail, Finalize, Register, TaskError
from tests.agreement import assert_stores_agree, assert_usage_agrees
from tests.builders import assert_fields, cut, put_manifest, running_batch
from tests.chunks import open_attempt
from tests.fakes.aws import condition_failed, conflict, fake_stores, throttle
from tests.unit.chunk_steps import run_chunk as run_chunk_at

CHAT = "/v1/chat/completions"
NOW = 5_000
GRACE = 30
SETTINGS = Settings(table_name="t", bucket_name="b", drain_grace_seconds=GRACE)
INPUT_KEY = schema.batch_input_key("acme", "batch_1")


def setup(lines: int = 4, per_chunk: int = 2, **over):
    """A batch in progress with ``lines`` requests in chunks of ``per_chunk``, its token stored."""
    stores = fake_stores()
    rows = [
        json.dumps({"custom_id": f"req-{i}", "method": "POST", "url": CHAT, "body": {"model": "m"}}).encode() + b"\n"
        for i in range(lines)
    ]
    stores.objects.put(INPUT_KEY, b"".join(rows))
    chunks = put_manifest(stores, cut(rows, per_chunk)).chunks
    fields = dict(in_progress_at=200, model="m", total=lines, task_token="tok")
    stores.batches.put(running_batch(**{"chunk_count": len(chunks), **fields, **over}))
    return stores


def run_chunk(stores, chunk: int):
    return run_chunk_at(stores, chunk, now=NOW)


def running(stores, chunk: int = 0) -> None:
    """A worker opened an attempt at ``chunk`` (while the batch took chunks) and runs it."""
    stores.batches.save_chunk_run(
        ChunkRunRecord(tenant="acme", batch_id="batch_1", chunk=chunk, version=1, open=["a1"], expires_at=10**10)
    )


def current(stores) -> BatchRecord:
    return stores.batches.get("acme", "batch_1")


def file_lines(stores, file_id) -> list[BatchOutputLine]:
    if file_id is None:
        return []
    return [
        BatchOutputLine.model_validate_json(l)
        for l in stores.objects.get(schema.file_key("acme", file_id)).splitlines()
    ]


# --- register ---------------------------------------------------------------------------------
def test_register_stores_the_token_and_does_not_signal_a_running_batch():
    stores = setup(task_token=None)
    assert logic.register(stores, "acme", "batch_1", "tok-2") == {"registered": True}
    assert current(stores).task_token == "tok-2" and stores.workflows.signals == []


def test_the_last_chunk_counted_before_the_token_was_stored_signals_complete_at_register():
    stores = setup(task_token=None)
    run_chunk(stores, 0)
    last = run_chunk(stores, 1)
    assert last.last and stores.workflows.signals == []  # nobody to signal yet
    logic.register(stores, "acme", "batch_1", "tok-2")
    assert stores.workflows.signals == [("tok-2", {"outcome": "complete"})]


def test_a_cancel_before_the_token_was_stored_signals_cancel_at_register():
    stores = setup(task_token=None, status="cancelling", cancelling_at=300)
    logic.register(stores, "acme", "batch_1", "tok-2")
    assert stores.workflows.signals == [("tok-2", {"outcome": "cancel"})]
    assert current(stores).task_token == "tok-2"


def test_register_on_a_batch_past_waiting_resumes_the_workflow():
    stores = setup(task_token=None, status="finalizing", accepting=False)
    logic.register(stores, "acme", "batch_1", "tok-2")
    assert stores.workflows.signals == [("tok-2", {"outcome": "complete"})]


# --- check (the wait for a signal timed out: was a signal lost?) -----------------------------------
EXPIRES = 100 + 86_400  # setup's expires_at


def test_check_completes_a_batch_whose_last_signal_was_lost():
    stores = setup()
    stores.workflows.signal = lambda token, output: True  # the signals go nowhere (lost)
    run_chunk(stores, 0)
    assert run_chunk(stores, 1).last
    assert logic.check(stores, "acme", "batch_1", 300, NOW) == {"outcome": "complete", "timeout_seconds": 0}


def test_check_cancels_a_cancelling_batch_whose_signal_was_lost():
    stores = setup(status="cancelling", cancelling_at=300)
    assert logic.check(stores, "acme", "batch_1", 300, NOW) == {"outcome": "cancel", "timeout_seconds": 0}


def test_a_cancel_wins_over_all_counted_at_check():
    stores = setup(status="cancelling", cancelling_at=300, chunks_done=2)
    assert logic.check(stores, "acme", "batch_1", 300, NOW)["outcome"] == "cancel"


def test_check_expires_a_batch_at_its_expiry_only():
    stores = setup()
    assert logic.check(stores, "acme", "batch_1", 300, EXPIRES) == {"outcome": "expire", "timeout_seconds": 0}
    assert logic.check(stores, "acme", "batch_1", 300, EXPIRES + 50)["outcome"] == "expire"
    # a timer that fired a second early waits the last second rather than expire early
    assert logic.check(stores, "acme", "batch_1", 300, EXPIRES - 1) == {"outcome": "wait", "timeout_seconds": 1}


def test_check_waits_again_for_the_reconcile_period_or_until_expiry():
    stores = setup(chunks_done=1)
    assert logic.check(stores, "acme", "batch_1", 300, NOW) == {"outcome": "wait", "timeout_seconds": 300}
    assert logic.check(stores, "acme", "batch_1", 300, EXPIRES - 120) == {"outcome": "wait", "timeout_seconds": 120}
    assert stores.workflows.signals == [] and stores.faults.calls["batches.transition"] == 0  # reads only


def test_check_on_a_batch_past_waiting_moves_on():
    stores = setup(status="finalizing", accepting=False)
    assert logic.check(stores, "acme", "batch_1", 300, NOW)["outcome"] == "complete"


# --- drain ------------------------------------------------------------------------------------
def test_a_complete_signal_drains_at_once():
    stores = setup()
    assert logic.drain(stores, SETTINGS, "acme", "batch_1", Signal.COMPLETE, NOW) == {
        "drained": True,
        "reason": Signal.COMPLETE,
    }
    assert stores.faults.calls["batches.transition"] == 0


def test_a_cancel_waits_for_running_chunks_within_the_grace_period_only():
    stores = setup(status="cancelling", cancelling_at=300)
    running(stores)
    assert logic.drain(stores, SETTINGS, "acme", "batch_1", Signal.CANCEL, NOW) == {
        "drained": False,
        "reason": Signal.CANCEL,
    }
    assert current(stores).drain_deadline == NOW + GRACE
    # a later poll, still within the grace period: the deadline stays the first one
    assert not logic.drain(stores, SETTINGS, "acme", "batch_1", Signal.CANCEL, NOW + GRACE - 1)["drained"]
    assert current(stores).drain_deadline == NOW + GRACE
    assert logic.drain(stores, SETTINGS, "acme", "batch_1", Signal.CANCEL, NOW + GRACE)["drained"]


def test_a_cancel_drains_as_soon_as_the_running_chunk_is_counted():
    stores = setup(status="cancelling", cancelling_at=300)
    started = current(stores)
    running(stores)
    assert not logic.drain(stores, SETTINGS, "acme", "batch_1", Signal.CANCEL, NOW)["drained"]
    message = started.work_message(
        ChunkManifest.model_validate_json(stores.objects.get(schema.batch_manifest_key("acme", "batch_1"))).chunks[0]
    )
    chunk_lifecycle.record_chunk(
        stores, message, parts=results.write_parts(stores.objects, message, []), usage=chunk_lifecycle.Usage(), now=NOW
    )
    assert logic.drain(stores, SETTINGS, "acme", "batch_1", Signal.CANCEL, NOW + 1)["drained"]


def test_expiry_shows_finalizing_and_stops_new_chunks():
    stores = setup()
    running(stores)
    assert logic.drain(stores, SETTINGS, "acme", "batch_1", Signal.EXPIRE, NOW) == {
        "drained": False,
        "reason": Signal.EXPIRE,
    }
    batch = current(stores)
    assert_fields(batch, status="finalizing", finalizing_at=NOW, accepting=True)
    manifest = ChunkManifest.model_validate_json(stores.objects.get(schema.batch_manifest_key("acme", "batch_1")))
    assert open_attempt(stores, batch.work_message(manifest.chunks[1])) is None


def test_a_cancel_wins_over_a_complete_signal():
    stores = setup(status="cancelling", cancelling_at=300)
    assert logic.drain(stores, SETTINGS, "acme", "batch_1", Signal.COMPLETE, NOW) == {
        "drained": True,
        "reason": Signal.CANCEL,
    }


# --- finalize ---------------------------------------------------------------------------------
def test_finalize_assembles_the_files_in_input_order_with_never_ran_lines():
    stores = setup(lines=6, status="cancelling", cancelling_at=300)
    run_chunk(stores, 2)  # the last chunk ran (a cancel came while it ran), the others never did
    assert logic.finalize(stores, "acme", "batch_1", Signal.CANCEL, NOW) == {"status": "cancelled"}
    batch = current(stores)
    assert_fields(batch, status="cancelled", cancelled_at=NOW, accepting=False)
    out, err = file_lines(stores, batch.output_file_id), file_lines(stores, batch.error_file_id)
    assert [l.custom_id for l in out] == ["req-4", "req-5"]
    assert [(l.custom_id, l.error.code) for l in err] == [(f"req-{i}", "batch_cancelled") for i in range(4)]
    assert_fields(batch, completed=2, failed=4)
    output = stores.files.items[("acme", batch.output_file_id)]
    assert (output.purpose, output.bytes, output.expires_at) == (
        "batch_output",
        len(stores.objects.get(output.s3_key)),
        NOW + 30 * 86_400,
    )
    assert stores.events.types() == ["batch.cancelled"]


def test_finalize_is_idempotent():
    stores = setup()
    run_chunk(stores, 0)
    run_chunk(stores, 1)
    assert logic.finalize(stores, "acme", "batch_1", Signal.COMPLETE, NOW) == {"status": "completed"}
    done, objects, files = current(stores), dict(stores.objects.data), dict(stores.files.items)
    assert done.error_file_id is None and len(file_lines(stores, done.output_file_id)) == 4
    assert logic.finalize(stores, "acme", "batch_1", Signal.COMPLETE, NOW + 9) == {"status": "completed"}
    assert (current(stores), stores.objects.data, stores.files.items) == (done, objects, files)
    assert stores.events.types() == ["batch.completed", "batch.completed"]  # at least once


def test_a_finalize_retried_after_a_crash_writes_the_planned_files_once():
    stores = setup()
    run_chunk(stores, 0)
    run_chunk(stores, 1)
    stores.faults.fail("batches.transition", TimeoutError("lost"), skip=1)  # the finish (after the close)
    with pytest.raises(TimeoutError):
        logic.finalize(stores, "acme", "batch_1", Signal.COMPLETE, NOW)
    planned = current(stores).planned_output_file_id
    logic.finalize(stores, "acme", "batch_1", Signal.COMPLETE, NOW + 1)
    assert current(stores).output_file_id == planned
    assert [k for k in stores.objects.data if k.startswith(schema.file_key("acme", ""))] == [
        schema.file_key("acme", planned)
    ]


def test_a_concurrent_finish_converges():
    """Two finalizers: the other one's transaction lands first, ours fails its condition."""
    stores = setup()
    run_chunk(stores, 0)
    run_chunk(stores, 1)
    real_transition = stores.batches.transition

    def transition(tenant, batch_id, change, files=()):
        if not change.terminal:
            return real_transition(tenant, batch_id, change, files=files)
        real_transition(tenant, batch_id, change, files=files)  # the concurrent finalizer's
        raise condition_failed()  # ours

    stores.batches.transition = transition
    assert logic.finalize(stores, "acme", "batch_1", Signal.COMPLETE, NOW) == {"status": "completed"}
    assert current(stores).status == "completed" and stores.events.types() == ["batch.completed"]


def test_a_failure_mid_assembly_aborts_the_writers_and_leaves_no_object():
    stores = setup(lines=6)
    for c in range(3):
        run_chunk(stores, c)
    real_iter = stores.objects.iter_bytes
    parts_read = []

    def iter_bytes(key, chunk_size=1024 * 1024):  # the second part read fails, after one was written
        if "/parts/" in key:
            parts_read.append(key)
            if len(parts_read) == 2:
                raise KeyError(f"NoSuchKey: {key}")
        return real_iter(key, chunk_size)

    stores.objects.iter_bytes = iter_bytes
    with pytest.raises(KeyError):
        logic.finalize(stores, "acme", "batch_1", Signal.COMPLETE, NOW)
    writers = stores.objects.writers
    assert writers and all(w.aborted for w in writers) and any(w.bytes for w in writers)
    assert not [k for k in stores.objects.data if k.startswith(schema.file_key("acme", ""))]
    batch = current(stores)
    assert batch.status == "finalizing" and batch.output_file_id is None and stores.files.items == {}


# --- fail -------------------------------------------------------------------------------------
def test_fail_lands_a_running_batch_in_failed_without_the_cause():
    stores = setup()
    assert logic.fail(stores, "acme", "batch_1", TaskError(Error="States.TaskFailed", Cause="boom"), NOW) == {
        "status": "failed"
    }
    batch = current(stores)
    assert_fields(batch, status="failed", failed_at=NOW, accepting=False)
    (error,) = batch.errors
    assert error["code"] == "batch_failed" and "boom" not in error["message"]  # the cause is logged only
    assert stores.events.types() == ["batch.failed"]


def test_fail_leaves_a_finished_batch_alone():
    stores = setup(status="completed", completed_at=400, accepting=False)
    assert logic.fail(stores, "acme", "batch_1", TaskError(), NOW) == {"status": "completed"}
    assert current(stores).errors is None and stores.events.types() == ["batch.completed"]


# --- nothing completed is lost (docs/reliability.md) -----------------------------------------------
def test_fail_after_some_chunks_ran_keeps_their_lines():
    stores = setup(lines=6)
    run_chunk(stores, 0)
    run_chunk(stores, 2)  # chunk 1 never ran
    assert logic.fail(stores, "acme", "batch_1", TaskError(Error="States.TaskFailed", Cause="boom"), NOW) == {
        "status": "failed"
    }
    batch = current(stores)
    assert_fields(batch, status="failed", failed_at=NOW, accepting=False)
    out, err = assert_stores_agree(stores, "acme", "batch_1", [f"req-{i}" for i in range(6)])
    assert [l.custom_id for l in out] == ["req-0", "req-1", "req-4", "req-5"]
    assert [(l.custom_id, l.error.code) for l in err] == [("req-2", "batch_failed"), ("req-3", "batch_failed")]
    assert_fields(batch, completed=4, failed=2, total=6)
    assert_fields(batch, output_file_id=batch.planned_output_file_id, error_file_id=batch.planned_error_file_id)
    (error,) = batch.errors
    assert (
        error["code"] == "batch_failed"
        and "output and error files" in error["message"]
        and "boom" not in error["message"]
    )
    assert stores.events.types() == ["batch.failed"]
    assert stores.events.published[-1][1]["output_file_id"] == batch.output_file_id


def test_fail_when_the_files_cannot_be_written_fails_without_files(caplog):
    stores = setup(lines=4)
    run_chunk(stores, 0)
    # A non-transient error (a transient one is raised for the Fail state's retry: tests below).
    denied = ClientError({"Error": {"Code": "AccessDenied", "Message": "S3 did not answer"}}, "PutObject")
    stores.faults.fail("objects.writer.write", denied, times=100)
    with caplog.at_level("WARNING", logger="batch-api-workflow.logic"):
        assert logic.fail(stores, "acme", "batch_1", TaskError(Error="E", Cause="S3 is down"), NOW) == {
            "status": "failed"
        }
    batch = current(stores)
    assert_fields(batch, status="failed", failed_at=NOW, accepting=False)
    assert (batch.output_file_id, batch.error_file_id) == (None, None) and stores.files.items == {}
    assert batch.errors == [logic.FAILED_ERROR]  # results not available: the tenant is told so
    assert all(w.aborted for w in stores.objects.writers) and not [
        k for k in stores.objects.data if k.startswith(schema.file_key("acme", ""))
    ]
    assert any(
        "could not write the files" in r.getMessage() and "S3 did not answer" in (r.exc_text or "")
        for r in caplog.records
    )
    assert stores.events.types() == ["batch.failed"]


def test_fail_twice_converges_to_one_outcome():
    stores = setup(lines=4)
    run_chunk(stores, 0)
    logic.fail(stores, "acme", "batch_1", TaskError(), NOW)
    done, objects, files = current(stores), dict(stores.objects.data), dict(stores.files.items)
    assert logic.fail(stores, "acme", "batch_1", TaskError(), NOW + 7) == {"status": "failed"}
    assert (current(stores), stores.objects.data, stores.files.items) == (done, objects, files)
    assert logic.finalize(stores, "acme", "batch_1", Signal.COMPLETE, NOW + 8) == {"status": "failed"}
    assert (current(stores), stores.objects.data, stores.files.items) == (done, objects, files)


def test_fail_after_a_finalize_that_crashed_writes_the_planned_files_saying_why_the_batch_closed():
    stores = setup(lines=4, status="cancelling", cancelling_at=300)
    run_chunk(stores, 1)
    stores.faults.fail("batches.transition", TimeoutError("lost"), skip=1)  # the finish (after the close)
    with pytest.raises(TimeoutError):
        logic.finalize(stores, "acme", "batch_1", Signal.CANCEL, NOW)
    planned = current(stores)
    assert logic.fail(stores, "acme", "batch_1", TaskError(), NOW + 1) == {"status": "failed"}
    batch = current(stores)
    assert_fields(batch, output_file_id=planned.planned_output_file_id, error_file_id=planned.planned_error_file_id)
    _out, err = assert_stores_agree(stores, "acme", "batch_1", [f"req-{i}" for i in range(4)])
    assert {l.error.code for l in err} == {"batch_cancelled"}  # the cancel closed it: its lines say so
    assert len([k for k in stores.objects.data if k.startswith(schema.file_key("acme", ""))]) == 2


def test_fail_racing_finalize_converges_on_the_files_the_record_describes():
    """Fail closes the batch; while it writes its files, a finalize (the sweeper's, say) runs to
    the end; fail's uploads then land last and its finish loses. The files in the store are the
    ones the record describes, and the batch ends as the first closer decided (failed)."""
    stores = setup(lines=6)
    run_chunk(stores, 0)
    real_writer, raced = stores.objects.writer, []

    def writer(key):
        if not raced:  # fail's first writer: the concurrent finalize runs to the end first
            raced.append(None)
            raced[0] = logic.finalize(stores, "acme", "batch_1", Signal.EXPIRE, NOW + 1)
        return real_writer(key)

    stores.objects.writer = writer
    assert logic.fail(stores, "acme", "batch_1", TaskError(), NOW) == {"status": "failed"}
    assert raced == [{"status": "failed"}]
    batch = current(stores)
    assert batch.failed_at == NOW + 1  # finalize finished it
    out, err = assert_stores_agree(stores, "acme", "batch_1", [f"req-{i}" for i in range(6)])
    assert [l.custom_id for l in out] == ["req-0", "req-1"] and {l.error.code for l in err} == {"batch_failed"}
    assert len([k for k in stores.objects.data if k.startswith(schema.file_key("acme", ""))]) == 2
    assert stores.events.types() == ["batch.failed", "batch.failed"]  # at least once


def test_fail_loses_its_finish_to_a_concurrent_finalize():
    stores = setup(lines=4)
    run_chunk(stores, 0)
    run_chunk(stores, 1)
    real_transition = stores.batches.transition

    def transition(tenant, batch_id, change, files=()):
        if change.terminal:
            stores.batches.transition = real_transition
            logic.finalize(stores, "acme", "batch_1", Signal.COMPLETE, NOW + 1)  # lands first
        return real_transition(tenant, batch_id, change, files=files)

    stores.batches.transition = transition
    assert logic.fail(stores, "acme", "batch_1", TaskError(), NOW) == {"status": "failed"}
    assert_stores_agree(stores, "acme", "batch_1", [f"req-{i}" for i in range(4)])


def test_fail_assembles_again_when_a_finalize_moved_the_batch_on_under_it():
    """Fail closed an in_progress batch; a finalize showed it finalizing and crashed before its
    finish: fail's finish loses its condition, so it assembles again rather than drop the files."""
    stores = setup(lines=4)
    run_chunk(stores, 0)
    real_transition, moved = stores.batches.transition, []

    def transition(tenant, batch_id, change, files=()):
        if change.terminal and not moved:  # the terminal write of fail: a finalize moved it on first
            moved.append(stores.batches.set(tenant, batch_id, status="finalizing", finalizing_at=NOW))
        return real_transition(tenant, batch_id, change, files=files)

    stores.batches.transition = transition
    assert logic.fail(stores, "acme", "batch_1", TaskError(), NOW) == {"status": "failed"}
    batch = current(stores)
    assert batch.output_file_id is not None and batch.errors == [logic.FAILED_WITH_FILES_ERROR]
    assert_stores_agree(stores, "acme", "batch_1", [f"req-{i}" for i in range(4)])


def test_an_expired_batch_keeps_the_lines_that_ran():
    stores = setup(lines=6)
    run_chunk(stores, 0)
    assert logic.drain(stores, SETTINGS, "acme", "batch_1", Signal.EXPIRE, NOW)["drained"]
    assert logic.finalize(stores, "acme", "batch_1", Signal.EXPIRE, NOW) == {"status": "expired"}
    out, err = assert_stores_agree(stores, "acme", "batch_1", [f"req-{i}" for i in range(6)])
    assert [l.custom_id for l in out] == ["req-0", "req-1"] and {l.error.code for l in err} == {"batch_expired"}
    assert_fields(current(stores), completed=2, failed=4)


def test_redelivered_chunks_and_a_retried_finalize_keep_the_counts_in_agreement():
    stores = setup(lines=6)
    run_chunk(stores, 0)
    assert not run_chunk(stores, 0).counted  # delivered twice: its second parts are never counted
    run_chunk(stores, 1)
    stores.faults.fail("batches.transition", TimeoutError("lost"), skip=1)  # the finish (after the close)
    with pytest.raises(TimeoutError):
        logic.finalize(stores, "acme", "batch_1", Signal.EXPIRE, NOW)
    assert not run_chunk(stores, 2).counted  # too late: the batch is closed
    assert logic.finalize(stores, "acme", "batch_1", Signal.EXPIRE, NOW + 1) == {"status": "expired"}
    out, err = assert_stores_agree(stores, "acme", "batch_1", [f"req-{i}" for i in range(6)])
    assert len(out) == 4 and [l.error.code for l in err] == ["batch_expired", "batch_expired"]


def test_the_counts_are_the_files_lines_when_the_markers_disagree(caplog):
    stores = setup(lines=4)
    run_chunk(stores, 0)
    run_chunk(stores, 1)
    key = ("acme", "batch_1", 0)
    marker = stores.batches.markers[key]  # a marker drifted from its parts (it never should)
    stores.batches.markers[key] = marker.model_copy(update={"completed": marker.completed + 1})
    with caplog.at_level("WARNING", logger="batch-api-workflow.logic"):
        assert logic.finalize(stores, "acme", "batch_1", Signal.COMPLETE, NOW) == {"status": "completed"}
    assert current(stores).completed == 4
    assert_stores_agree(stores, "acme", "batch_1", [f"req-{i}" for i in range(4)])
    assert any("disagree with its markers" in r.getMessage() for r in caplog.records)


# --- checkpointed lines of a chunk that was not counted (docs/reliability.md) -----------------------
#: One engine answer's usage: 10 prompt tokens (4 cached), 3 completion tokens.
USAGE = {"prompt_tokens": 10, "completion_tokens": 3, "prompt_tokens_details": {"cached_tokens": 4}}


def answer(line: BatchOutputLine, status: int) -> BatchOutputLine:
    """The engine's answer to ``line``'s request: a 2xx with USAGE, or a 400 without usage."""
    body = (
        {"object": "chat.completion", "usage": USAGE}
        if status == 200
        else {"error": {"message": "bad", "type": "invalid_request_error"}}
    )
    return results.response_line(line.custom_id, status, body, "r")


def message_of(stores, chunk: int):
    manifest = ChunkManifest.model_validate_json(stores.objects.get(schema.batch_manifest_key("acme", "batch_1")))
    return current(stores).work_message(manifest.chunks[chunk])


def checkpoint(stores, chunk: int, statuses: list[int]):
    """A worker started ``chunk`` and checkpointed its first lines' answers (then hangs or dies)."""
    message = message_of(stores, chunk)
    open_attempt(stores, message)
    lines = [
        answer(l, s) for l, s in zip(results.unrun_lines(stores.objects, message, "x", "x"), statuses, strict=False)
    ]
    segment = results.write_checkpoint(stores.objects, message, 0, lines)
    chunk_lifecycle.add_segment(stores, message, "a1", segment, None)
    return message


def run_with_usage(stores, chunk: int):
    """The worker's path for a whole chunk, every line 200 with USAGE, its usage counted."""
    message = message_of(stores, chunk)
    open_attempt(stores, message)
    lines = [answer(l, 200) for l in results.unrun_lines(stores.objects, message, "x", "x")]
    usage = chunk_lifecycle.Usage()
    for line in lines:
        usage.add_response(results.usage_of(line))
    return chunk_lifecycle.record_chunk(
        stores, message, parts=results.write_parts(stores.objects, message, lines), usage=usage, now=NOW
    )


def end_batch(stores, how: str) -> str:
    """End the batch as the workflow would: expiry (drain, finalize), a cancel, or its Fail."""
    if how == "expire":
        logic.drain(stores, SETTINGS, "acme", "batch_1", Signal.EXPIRE, NOW)
        return logic.finalize(stores, "acme", "batch_1", Signal.EXPIRE, NOW)["status"]
    if how == "cancel":
        stores.batches.set("acme", "batch_1", status="cancelling", cancelling_at=NOW - 10)
        return logic.finalize(stores, "acme", "batch_1", Signal.CANCEL, NOW)["status"]
    return logic.fail(stores, "acme", "batch_1", TaskError(Error="States.TaskFailed"), NOW)["status"]


@pytest.mark.parametrize(
    ("how", "status", "code"),
    [
        ("expire", "expired", "batch_expired"),
        ("cancel", "cancelled", "batch_cancelled"),
        ("fail", "failed", "batch_failed"),
    ],
)
def test_a_batch_ending_mid_chunk_keeps_the_chunks_checkpointed_lines(how, status, code):
    # Chunk 0 (req-0..3) ran two lines, checkpointed (req-0 answered 200, req-1 400), and was never
    # counted; chunk 1 (req-4, req-5) was.
    stores = setup(lines=6, per_chunk=4)
    checkpoint(stores, 0, [200, 400])
    run_with_usage(stores, 1)
    assert end_batch(stores, how) == status
    out, err = assert_stores_agree(stores, "acme", "batch_1", [f"req-{i}" for i in range(6)])
    assert [l.custom_id for l in out] == ["req-0", "req-4", "req-5"]
    assert [(l.custom_id, l.response.status_code if l.response else l.error.code) for l in err] == [
        ("req-1", 400),
        ("req-2", code),
        ("req-3", code),
    ]
    batch = current(stores)
    assert_fields(batch, completed=3, failed=3, total=6)
    # Three 2xx answers of 10 prompt (4 cached) and 3 completion tokens each.
    assert assert_usage_agrees(stores, "acme", "batch_1") == {
        "input_tokens": 30,
        "cached_tokens": 12,
        "output_tokens": 9,
        "reasoning_tokens": 0,
    }


def test_a_retried_finalize_keeps_the_checkpointed_lines_once():
    stores = setup(lines=4, per_chunk=4)
    checkpoint(stores, 0, [200, 200])
    stores.faults.fail("batches.transition", TimeoutError("lost"), skip=1)  # the finish (after the close)
    with pytest.raises(TimeoutError):
        logic.finalize(stores, "acme", "batch_1", Signal.EXPIRE, NOW)
    assert logic.finalize(stores, "acme", "batch_1", Signal.EXPIRE, NOW + 1) == {"status": "expired"}
    out, err = assert_stores_agree(stores, "acme", "batch_1", [f"req-{i}" for i in range(4)])
    assert [l.custom_id for l in out] == ["req-0", "req-1"] and [l.error.code for l in err] == ["batch_expired"] * 2
    assert assert_usage_agrees(stores, "acme", "batch_1")["input_tokens"] == 20


def test_a_chunk_counted_just_before_the_close_is_read_from_its_parts_not_its_checkpoints():
    # The worker checkpointed two lines, then finished the chunk and counts it while finalize is
    # closing the batch: the count lands first, so the chunk's parts hold all its lines.
    stores = setup(lines=4, per_chunk=4)
    checkpoint(stores, 0, [200, 200])
    real_transition = stores.batches.transition

    def transition(tenant, batch_id, change, **kw):
        if change.values.get("accepting") is False and not current(stores).chunks_done:
            assert run_with_usage(stores, 0).counted  # the racing count, just before the close
        return real_transition(tenant, batch_id, change, **kw)

    stores.batches.transition = transition
    assert logic.finalize(stores, "acme", "batch_1", Signal.EXPIRE, NOW) == {"status": "expired"}
    out, err = assert_stores_agree(stores, "acme", "batch_1", [f"req-{i}" for i in range(4)])
    assert ([l.custom_id for l in out], err) == ([f"req-{i}" for i in range(4)], [])
    assert assert_usage_agrees(stores, "acme", "batch_1")["input_tokens"] == 40


def test_a_chunk_counted_after_the_close_is_refused_and_its_checkpoints_are_kept():
    # The count comes just after the close (while finalize reads the run record): refused, so the
    # files hold the checkpointed lines and never-ran lines, and the counts agree with them.
    stores = setup(lines=4, per_chunk=4)
    checkpoint(stores, 0, [200, 400])
    real_run = stores.batches.chunk_run
    late = []

    def chunk_run(tenant, batch_id, chunk, shards=1):
        if not late:  # the late worker's own reads go to the store
            late.append(None)
            late[0] = run_with_usage(stores, 0).counted
        return real_run(tenant, batch_id, chunk, shards)

    stores.batches.chunk_run = chunk_run
    assert logic.finalize(stores, "acme", "batch_1", Signal.EXPIRE, NOW) == {"status": "expired"}
    assert late == [False]
    out, err = assert_stores_agree(stores, "acme", "batch_1", [f"req-{i}" for i in range(4)])
    assert [l.custom_id for l in out] == ["req-0"]
    assert [l.response.status_code if l.response else l.error.code for l in err] == [
        400,
        "batch_expired",
        "batch_expired",
    ]
    assert assert_usage_agrees(stores, "acme", "batch_1")["output_tokens"] == 3


def test_the_dead_letter_consumer_and_finalize_keep_checkpoints_through_one_code_path():
    # The same chunk, checkpointed the same way: the DLQ consumer's parts and finalize's files
    # hold the same lines (results.salvaged_lines), with their own error code for the rest.
    from functions.chunk_dlq import logic as dlq

    stores = setup(lines=4, per_chunk=4)
    message = checkpoint(stores, 0, [200, 400])
    assert dlq.fail_chunk(stores, message, now=NOW).action == "recorded"
    assert logic.finalize(stores, "acme", "batch_1", Signal.COMPLETE, NOW) == {"status": "completed"}
    out, err = assert_stores_agree(stores, "acme", "batch_1", [f"req-{i}" for i in range(4)])
    assert [l.custom_id for l in out] == ["req-0"]
    assert [l.response.status_code if l.response else l.error.code for l in err] == [
        400,
        dlq.ERROR_CODE,
        dlq.ERROR_CODE,
    ]
    assert assert_usage_agrees(stores, "acme", "batch_1")["input_tokens"] == 10


# --- fail: a transient error is retried by the Fail state ---------------------------------------------
@pytest.mark.parametrize(
    ("op", "error", "skip"),
    [
        ("batches.transition", conflict(), 0),  # the close
        ("objects.writer.complete", TimeoutError("S3 did not answer"), 0),
        ("batches.transition", throttle(), 1),  # the finish
        ("batches.counted_chunks", ConnectionError("connection reset"), 0),
    ],
    ids=["close-conflict", "complete-timeout", "finish-throttled", "read-connection-reset"],
)
def test_fail_raises_a_transient_error_so_its_retry_keeps_the_files(op, error, skip):
    stores = setup(lines=4)
    run_chunk(stores, 0)
    stores.faults.fail(op, error, skip=skip)
    with pytest.raises(type(error)):
        logic.fail(stores, "acme", "batch_1", TaskError(Error="States.TaskFailed"), NOW)
    assert current(stores).status not in ("failed",) and current(stores).errors is None
    # The Fail state's retry:
    assert logic.fail(stores, "acme", "batch_1", TaskError(Error="States.TaskFailed"), NOW + 2) == {"status": "failed"}
    out, err = assert_stores_agree(stores, "acme", "batch_1", [f"req-{i}" for i in range(4)])
    assert [l.custom_id for l in out] == ["req-0", "req-1"] and [l.error.code for l in err] == ["batch_failed"] * 2
    assert current(stores).errors == [logic.FAILED_WITH_FILES_ERROR]


def test_fail_with_no_retry_left_fails_without_files_on_a_transient_error():
    # The sweeper's last resort (retried=False) must end the batch whatever the store says.
    stores = setup(lines=4)
    run_chunk(stores, 0)
    stores.faults.fail("batches.counted_chunks", throttle(), times=100)
    assert logic.fail(stores, "acme", "batch_1", TaskError(), NOW, retried=False) == {"status": "failed"}
    assert current(stores).errors == [logic.FAILED_ERROR] and stores.files.items == {}


# --- typed tasks --------------------------------------------------------------------------------
def test_task_events_are_typed_by_action():
    base = {"tenant": "acme", "batch_id": "batch_1"}
    assert tasks.parse({**base, "action": "register", "token": "t"}) == Register(**base, action="register", token="t")
    drain = tasks.parse({**base, "action": "drain", "signal": "expire"})
    assert isinstance(drain, Drain) and drain.signal is Signal.EXPIRE
    assert isinstance(tasks.parse({**base, "action": "finalize", "signal": "cancel"}), Finalize)
    assert tasks.parse({**base, "action": "check", "reconcile_seconds": 2}) == Check(
        **base, action="check", reconcile_seconds=2
    )
    failed = tasks.parse({**base, "action": "fail", "error": {"Error": "E", "Cause": "c"}})
    assert isinstance(failed, Fail) and failed.error.describe() == "c"
    assert tasks.parse({**base, "action": "fail", "error": None}).error.describe() == "unknown error"
    for bad in (
        {**base, "action": "explode"},
        {**base, "action": "drain", "signal": "later"},
        {**base, "action": "register"},
        {**base, "action": "check"},
        {**base, "action": "check", "reconcile_seconds": 0},
    ):
        with pytest.raises(ValidationError):
            tasks.parse(bad)


def test_run_dispatches_each_task_with_the_given_clock():
    stores = setup(status="cancelling", cancelling_at=300, task_token=None)
    base = {"tenant": "acme", "batch_id": "batch_1"}
    assert logic.run(tasks.parse({**base, "action": "register", "token": "t9"}), stores, SETTINGS, now=NOW) == {
        "registered": True
    }
    assert stores.workflows.signals == [("t9", {"outcome": "cancel"})]
    checked = logic.run(tasks.parse({**base, "action": "check", "reconcile_seconds": 60}), stores, SETTINGS, now=NOW)
    assert checked == {"outcome": "cancel", "timeout_seconds": 0}
    drained = logic.run(tasks.parse({**base, "action": "drain", "signal": "cancel"}), stores, SETTINGS, now=NOW)
    assert drained == {"drained": True, "reason": Signal.CANCEL}
    assert logic.run(
        tasks.parse({**base, "action": "finalize", "signal": "cancel"}), stores, SETTINGS, now=NOW + 3
    ) == {"status": "cancelled"}
    assert current(stores).cancelled_at == NOW + 3
    assert logic.run(tasks.parse({**base, "action": "fail", "error": {}}), stores, SETTINGS, now=NOW + 4) == {
        "status": "cancelled"
    }
