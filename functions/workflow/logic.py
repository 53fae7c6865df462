"""The batch workflow's tasks: register the wait token, check a batch whose signal is late, drain
running chunks, finalize, fail.

The state machine (infra/workflow.py) calls these through one Lambda. Each is safe to retry."""

import logging
from collections.abc import Iterator
from contextlib import closing
from dataclasses import dataclass, field
from typing import Any

from functions.core import chunk_lifecycle, ids, lifecycle, limits, results, schema
from functions.core.errors import ConditionFailed, Throttled
from functions.core.lifecycle import CLOSABLE, SIGNAL_FIELD, Signal, is_terminal
from functions.core.messages import Chunk, ChunkManifest
from functions.core.ports import ObjectWriter, Stores
from functions.core.records import BatchRecord, ChunkRecord, FileRecord
from functions.core.settings import Settings

from .tasks import Check, Drain, Fail, Finalize, Register, TaskError

#: What ``check`` answers when there is nothing to act on yet: wait for a signal again.
WAIT = "wait"

#: What a request that never ran says, by why the batch closed (``BatchRecord.closed_for``: a
#: ``Signal``, or "fail" when the workflow's failure path closed it).
NEVER_RAN: dict[str, tuple[str, str]] = {
    Signal.CANCEL: ("batch_cancelled", "The batch was cancelled before this request ran."),
    Signal.EXPIRE: ("batch_expired", "The batch expired before this request could be completed."),
    Signal.COMPLETE: ("batch_incomplete", "This request was not run."),
    "fail": ("batch_failed", "The batch failed because of an internal error before this request ran."),
}
#: The terminal status a batch closed for a signal ends in.
TERMINAL: dict[Signal, str] = {Signal.COMPLETE: "completed", Signal.CANCEL: "cancelled", Signal.EXPIRE: "expired"}


def run(
    task: Register | Check | Drain | Finalize | Fail, stores: Stores, settings: Settings, *, now: int
) -> dict[str, Any]:
    """Run one task of the state machine at time ``now``."""
    match task:
        case Register():
            return register(stores, task.tenant, task.batch_id, task.token)
        case Check():
            return check(stores, task.tenant, task.batch_id, task.reconcile_seconds, now)
        case Drain():
            return drain(stores, settings, task.tenant, task.batch_id, task.signal, now)
        case Finalize():
            return finalize(stores, task.tenant, task.batch_id, task.signal, now)
        case Fail():
            return fail(stores, task.tenant, task.batch_id, task.error, now)
    raise TypeError(f"not a workflow task: {task!r}")


def _batch(stores: Stores, tenant: str, batch_id: str) -> BatchRecord:
    batch = stores.batches.get(tenant, batch_id)
    if batch is None:
        raise LookupError(f"batch {batch_id} of tenant {tenant} does not exist")
    return batch


def register(stores: Stores, tenant: str, batch_id: str, token: str) -> dict[str, Any]:
    """Store the token the workflow waits on. If the batch is already done or cancelling (its
    signal may have come before there was a token to signal), resume the workflow now."""
    batch = lifecycle.apply(stores, _batch(stores, tenant, batch_id), lifecycle.note_token(token)).batch
    if (owed := _owed(batch)) is not None:
        lifecycle.signal(stores.workflows, token, owed)
    return {"registered": True}


def _owed(batch: BatchRecord) -> Signal | None:
    """The signal the batch's state says its workflow is owed, whether or not it was sent: cancel
    while cancelling, complete once every chunk is counted (or the batch is past waiting)."""
    if batch.status == "cancelling":
        return Signal.CANCEL
    if batch.status != "in_progress" or chunk_lifecycle.all_counted(batch):
        return Signal.COMPLETE  # past waiting: drain and finalize read the batch again
    return None


def check(stores: Stores, tenant: str, batch_id: str, reconcile_seconds: int, now: int) -> dict[str, Any]:
    """The wait for a signal timed out: act on what the batch says, whether or not its signal
    arrived (the worker may have died after counting the last chunk and before signalling; the
    API's cancel signal may have failed). ``{"outcome": <signal>, "timeout_seconds": 0}``, or
    ``{"outcome": "wait", "timeout_seconds": <seconds>}`` to wait again (at most
    ``reconcile_seconds``, never past the batch's expiry)."""
    batch = chunk_lifecycle.counted_batch(stores, _batch(stores, tenant, batch_id))
    outcome = _owed(batch) or (Signal.EXPIRE if now >= batch.expires_at else None)
    if outcome is None:
        return {
            SIGNAL_FIELD: WAIT,
            "timeout_seconds": limits.signal_wait_seconds(batch.expires_at, now, reconcile_seconds),
        }
    return {SIGNAL_FIELD: str(outcome), "timeout_seconds": 0}


def reason_for(batch: BatchRecord, signalled: Signal) -> Signal:
    """A cancel wins over whatever signal arrived (a last chunk may race the cancel)."""
    if batch.status == "cancelling":
        return Signal.CANCEL
    return Signal(signalled) if signalled in (Signal.EXPIRE, Signal.CANCEL) else Signal.COMPLETE


def drain(
    stores: Stores, settings: Settings, tenant: str, batch_id: str, signalled: Signal, now: int
) -> dict[str, Any]:
    """Wait for chunks already running (within the grace period) before finalizing a batch that
    was cancelled or expired; an expiring batch shows ``finalizing`` meanwhile and takes no new
    chunks. Returns {"drained": bool, "reason": ...}."""
    batch = _batch(stores, tenant, batch_id)
    if is_terminal(batch.status):
        return {"drained": True, "reason": reason_for(batch, signalled)}
    reason = reason_for(batch, signalled)
    if reason == Signal.COMPLETE:
        return {"drained": True, "reason": reason}
    begin = lifecycle.drain(now, expiring=reason == Signal.EXPIRE, grace_seconds=settings.drain_grace_seconds)
    batch = lifecycle.apply(stores, batch, begin).batch
    stores.batches.close_shards(batch, accepting=True)  # no new chunk starts on its shards either
    running = chunk_lifecycle.running_chunks(stores, batch)
    drained = not running or now >= (batch.drain_deadline or 0)
    return {"drained": drained, "reason": reason_for(batch, signalled)}


def finalize(stores: Stores, tenant: str, batch_id: str, signalled: Signal, now: int) -> dict[str, Any]:
    """Close the batch to late chunks, assemble output and error files in input order, write
    never-ran lines, and set the terminal state. Idempotent: a retry after any crash converges.
    The first task to close the batch decides why (``closed_for``): a retry, or a ``fail`` that
    closed it first, ends it the same way with the same files."""
    batch = _batch(stores, tenant, batch_id)
    if is_terminal(batch.status):
        lifecycle.publish_status(stores.events, batch)  # at-least-once
        return {"status": batch.status}
    reason = reason_for(batch, signalled)
    batch = _close(stores, batch, str(reason), finalizing=reason != Signal.CANCEL, now=now)
    assembled = assemble(stores, batch, now)
    if batch.closed_for == FAIL:  # a fail closed it and did not finish: end it as fail would
        status, values = "failed", _failed_values(assembled)
    else:
        # _close set closed_for: this reason, or the one of the task that closed the batch first
        status, values = TERMINAL[Signal(batch.closed_for or reason)], assembled.values()
    batch = _finish(stores, batch, assembled, status, values, now)
    lifecycle.publish_status(stores.events, batch)
    return {"status": batch.status}


#: ``closed_for`` of a batch that the workflow's failure path closed.
FAIL = "fail"


def _close(stores: Stores, batch: BatchRecord, closed_for: str, *, finalizing: bool, now: int) -> BatchRecord:
    """Stop the batch taking chunks (and show it ``finalizing`` if asked) and plan its files
    (``lifecycle.close``: every retry and every concurrent task writes the same files).
    ConditionFailed if the batch is no longer closable (another task finished it)."""
    change = lifecycle.close(
        now,
        closed_for=closed_for,
        finalizing=finalizing,
        planned_output_file_id=ids.new_id(ids.FILE),
        planned_error_file_id=ids.new_id(ids.FILE),
    )
    closed = stores.batches.transition(batch.tenant, batch.id, change)
    stores.batches.close_shards(closed, accepting=False)  # after the batch: a retry closes them too
    return closed


@dataclass(frozen=True)
class Assembled:
    """A closed batch's output and error files as written, and how many lines each holds."""

    files: list[FileRecord]
    completed: int
    failed: int
    output_file_id: str | None
    error_file_id: str | None
    #: The batch's usage: its counted chunks' (the counters) and its uncounted chunks'
    #: checkpointed lines'.
    usage: chunk_lifecycle.Usage = field(default_factory=chunk_lifecycle.Usage)

    def values(self) -> dict[str, Any]:
        """The batch's request counts, usage and file ids: the counts are the files' lines, so
        they agree with the files whatever the counters say."""
        return {
            "completed": self.completed,
            "failed": self.failed,
            "output_file_id": self.output_file_id,
            "error_file_id": self.error_file_id,
            **self.usage.model_dump(),
        }


def assemble(stores: Stores, batch: BatchRecord, now: int) -> Assembled:
    """Write a closed batch's files in input order: each counted chunk's parts (the counted
    attempt's); for a chunk that was not counted, the result lines its workers checkpointed
    (docs/reliability.md, "Nothing completed is lost") and an error line for each of its other
    requests (saying why the batch closed, ``closed_for``). The one assembly of ``finalize`` and
    ``fail``; it writes nothing on the batch's record. Raises on any store failure (the writers
    abort: no object).

    ``batch`` is as the close left it (``accepting`` False): no chunk is counted after the close
    (counting requires ``accepting``), so the markers read here are final, and each chunk's run
    record is read after the close. A worker still running an uncounted chunk may checkpoint more
    lines after that read: they stay out (that request gets its never-ran line)."""
    assert batch.planned_output_file_id and batch.planned_error_file_id and batch.closed_for
    tenant, batch_id = batch.tenant, batch.id
    counted = stores.batches.counted_chunks(tenant, batch_id, batch.count_shards)
    manifest = ChunkManifest.model_validate_json(stores.objects.get(schema.batch_manifest_key(tenant, batch_id)))
    output_key = schema.file_key(tenant, batch.planned_output_file_id)
    error_key = schema.file_key(tenant, batch.planned_error_file_id)
    parted = {True: 0, False: 0}  # lines of the counted chunks' parts, by succeeded
    salvaged = {True: 0, False: 0}  # lines of the uncounted chunks (checkpointed or never-ran), by succeeded
    # The counted chunks' usage from their markers (on shards, the batch's counters hold only the
    # shards folded before the close).
    usage = chunk_lifecycle.Usage(
        **{k: sum(getattr(m, k) for m in counted.values()) for k in chunk_lifecycle.Usage.model_fields}
    )
    # Each chunk in file order with its counted parts (None: not counted); the parts are read ahead.
    plan = [
        (chunk, _counted_parts(tenant, batch_id, chunk.chunk, counted.get(chunk.chunk))) for chunk in manifest.chunks
    ]
    with (
        stores.objects.writer(output_key) as output,
        stores.objects.writer(error_key) as errors,
        closing(stores.objects.iter_objects([key for _, parts in plan for _, key in parts or ()])) as read,
    ):
        for chunk, parts in plan:
            if parts is None:
                for ok, count in _write_salvaged(stores, batch, chunk, batch.closed_for, output, errors, usage).items():
                    salvaged[ok] += count
                continue
            for ok, _ in parts:
                parted[ok] += _append_part(next(read), output if ok else errors)
    completed, failed = parted[True], parted[False]
    marked = (sum(m.completed for m in counted.values()), sum(m.failed for m in counted.values()))
    if (completed, failed) != marked:
        # The markers and the parts disagree (they never should): the files win, so that the
        # counts a tenant reads agree with the files; the difference is logged.
        logger.warning(
            "batch parts disagree with its markers: %d completed and %d failed lines in the counted parts, markers %d and %d",
            completed,
            failed,
            *marked,
            extra={"tenant": tenant, "batch_id": batch_id},
        )
    completed += salvaged[True]
    failed += salvaged[False]
    expiry = batch.output_expires_after or limits.OUTPUT_FILE_DEFAULT_EXPIRY_SECONDS
    files = [
        FileRecord(
            tenant=tenant,
            id=file_id,
            filename=f"{batch_id}_{kind}.jsonl",
            purpose="batch_output",
            bytes=writer.bytes,
            created_at=now,
            expires_at=now + expiry,
            s3_key=writer.key,
        )
        for file_id, kind, writer in (
            (batch.planned_output_file_id, "output", output),
            (batch.planned_error_file_id, "error", errors),
        )
        if writer.bytes > 0
    ]
    return Assembled(
        files=files,
        completed=completed,
        failed=failed,
        output_file_id=batch.planned_output_file_id if output.bytes else None,
        error_file_id=batch.planned_error_file_id if errors.bytes else None,
        usage=usage,
    )


def _finish(
    stores: Stores, batch: BatchRecord, assembled: Assembled, status: str, values: dict[str, Any], now: int
) -> BatchRecord:
    """Create the files and set the terminal state in one transaction, only if the batch is still
    as this task closed it; returns the batch as stored after (finished by us or by another: the
    caller publishes its status either way)."""
    change = lifecycle.finish(now, status=status, closed_from=batch.status, values=values)
    return lifecycle.apply(stores, batch, change, files=assembled.files, publish=False).batch


def _counted_parts(tenant: str, batch_id: str, chunk: int, marker: ChunkRecord | None) -> list[tuple[bool, str]] | None:
    """A counted chunk's parts that hold lines, (succeeded, key): its marker's counts say which,
    so an empty part costs no request. None for a chunk not counted."""
    if marker is None:
        return None
    return [
        (ok, schema.chunk_part_key(tenant, batch_id, chunk, marker.attempt, kind))
        for ok, kind, lines in ((True, "out", marker.completed), (False, "err", marker.failed))
        if lines
    ]


def _append_part(part: Iterator[bytes], writer: ObjectWriter) -> int:
    """Copy a result part into ``writer``; returns how many lines it held."""
    lines = 0
    for data in part:
        writer.write(data)
        lines += data.count(b"\n")
    return lines


def _write_salvaged(
    stores: Stores,
    batch: BatchRecord,
    chunk: Chunk,
    closed_for: str,
    output: ObjectWriter,
    errors: ObjectWriter,
    usage: chunk_lifecycle.Usage,
) -> dict[bool, int]:
    """Write an uncounted chunk's lines: its checkpointed results (2xx to ``output``, the rest to
    ``errors``, as ``results.write_parts`` splits them; their usage added to ``usage``) and a
    never-ran error line for each other request. Returns {succeeded: lines}."""
    code, message = NEVER_RAN[closed_for]
    run = stores.batches.chunk_run(batch.tenant, batch.id, chunk.chunk, batch.count_shards)
    counts = {True: 0, False: 0}
    for line in results.salvaged_lines(
        stores.objects, batch.work_message(chunk), run.cover() if run else [], code, message
    ):
        ok = results.succeeded(line)
        (output if ok else errors).write(line.model_dump_json().encode() + b"\n")
        usage.add_response(results.usage_of(line))
        counts[ok] += 1
    return counts


#: What a tenant reads on a batch the workflow had to fail: short and true, never the cause itself
#: (Step Functions' Cause holds stack traces, ARNs and the account id); the cause goes to the logs.
#: FAILED_ERROR when not even its files could be written; FAILED_WITH_FILES_ERROR when they were.
FAILED_ERROR: dict[str, Any] = {
    "code": "batch_failed",
    "message": (
        "The batch could not be finalized because of an internal error, so its results are not "
        "available. Submit its requests again in a new batch."
    ),
    "param": None,
    "line": None,
}
FAILED_WITH_FILES_ERROR: dict[str, Any] = {
    "code": "batch_failed",
    "message": (
        "The batch could not be finished because of an internal error. Its output and error files "
        "hold every request's result; submit those that failed with batch_failed again."
    ),
    "param": None,
    "line": None,
}

#: The workflow's log (a child of the handler's Powertools logger "batch-api-workflow", whose
#: handler and keys, such as batch_id, its records use in Lambda).
logger = logging.getLogger("batch-api-workflow.logic")

#: Errors that say "try again shortly" (a throttled or conflicting store, after the adapters' own
#: retries; a timed-out or refused connection): ``fail`` raises them, so that the Fail state's
#: retry (infra/workflow.py) runs it again, rather than dropping the batch's files. If Fail's
#: retries run out, the batch stays closed and open, and the sweeper finalizes it (as failed, with
#: its files: ``closed_for`` is "fail") once every chunk is counted and the batch is quiet, or past
#: ``expires_at`` + the expiry grace (docs/lifecycle.md, "Liveness: every batch ends").
TRANSIENT: tuple[type[BaseException], ...] = (Throttled, TimeoutError, ConnectionError)

#: How often ``fail`` assembles again when another task moved the batch on under it (a
#: concurrent finalize showing it ``finalizing``) before it falls back to failing without files.
FAIL_ATTEMPTS = 3


def fail(
    stores: Stores, tenant: str, batch_id: str, error: TaskError, now: int, *, retried: bool = True
) -> dict[str, Any]:
    """The workflow's last resort: any unrecoverable failure lands the batch in ``failed``,
    keeping what completed. It closes the batch and assembles its files as ``finalize`` does
    (``assemble``; never-ran requests are error lines, ``batch_failed`` unless another task closed
    the batch first), so lines that ran are not lost. A transient error (``TRANSIENT``) is raised
    for the Fail state to retry; if the assembly fails otherwise (the store that made the workflow
    fail may refuse for good), the batch is failed without files, as the last resort must not
    fail; the cause is logged. ``retried=False`` (the sweeper's last resort, which has no retry
    left) takes that fallback on a transient error too. The tenant reads ``FAILED_WITH_FILES_ERROR`` or
    ``FAILED_ERROR``; the workflow's full error is logged."""
    batch = _batch(stores, tenant, batch_id)
    logger.error(
        "batch workflow failed: %s",
        error.describe(),
        extra={
            "tenant": tenant,
            "batch_id": batch_id,
            "error": error.Error,
            "cause": error.Cause,
            "status": batch.status,
        },
    )
    for _ in range(FAIL_ATTEMPTS):
        if is_terminal(batch.status) or batch.status not in CLOSABLE:
            break
        try:
            batch = _fail_keeping_results(stores, batch, now)
        except TRANSIENT:
            if retried:
                raise  # the Fail state runs it again: the files are worth a retry
            logger.warning(
                "a transient error again while failing an overdue batch; failing it without files",
                exc_info=True,
                extra={"tenant": tenant, "batch_id": batch_id},
            )
            break
        except Exception:
            # A warning: the batch's failure itself is the error logged above.
            logger.warning(
                "could not write the files of a failing batch; failing it without files",
                exc_info=True,
                extra={"tenant": tenant, "batch_id": batch_id},
            )
            break
    if not is_terminal(batch.status):
        batch = lifecycle.apply(stores, batch, lifecycle.fail_without_files(now, [FAILED_ERROR]), publish=False).batch
    lifecycle.publish_status(stores.events, batch)
    return {"status": batch.status}


def _fail_keeping_results(stores: Stores, batch: BatchRecord, now: int) -> BatchRecord:
    try:
        batch = _close(stores, batch, FAIL, finalizing=False, now=now)
    except ConditionFailed:
        return _batch(stores, batch.tenant, batch.id)  # finished meanwhile
    assembled = assemble(stores, batch, now)
    return _finish(stores, batch, assembled, "failed", _failed_values(assembled), now)


def _failed_values(assembled: Assembled) -> dict[str, Any]:
    return {"errors": [dict(FAILED_WITH_FILES_ERROR)], **assembled.values()}
