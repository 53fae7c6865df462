"""The sweeper: every ``sweep_seconds`` it looks at each OPEN batch (the sparse index
``schema.GSI_OPEN``, never a table scan) and ends or restarts the ones the normal path left
behind, so that no batch stays open whatever single component failed or message was lost
(docs/lifecycle.md, "Liveness: every batch ends"):

- ``validating`` past ``created_at + validating_timeout_seconds`` (or past its expiry + grace):
  ``failed`` with ``ingest_failed`` (its ingest event was lost or kept failing);
- ``cancelling`` before it started, ``enqueue_grace_seconds`` after the cancel: ``cancelled``;
- ``in_progress``/``cancelling`` not ``enqueued`` ``enqueue_grace_seconds`` after it moved: the
  fan-out and the workflow start again (ingest's own ``resume``; duplicates are harmless);
- every chunk counted (``chunk_lifecycle.all_counted``) and nothing done to the batch for
  ``completion_grace`` (its workflow died: failed, aborted or timed out without finalizing, or
  Fail's retries ran out): finalized by the workflow's own ``finalize`` as the workflow would have
  (``completed``; ``cancelled`` if cancelling; ``expired`` if its expiry's drain had begun;
  ``failed``, with its files, if Fail closed it), long before its expiry;
- any open batch past ``expires_at + expiry_grace_seconds``: finalized ``expired`` (a cancelling
  one ``cancelled``) by the workflow's own ``finalize``, with its output and error files, whatever
  happened to its workflow. If that keeps failing for another grace period, the workflow's last
  resort ``fail`` ends it ``failed`` (keeping what it can).

Every action is a conditional write or the workflow's idempotent finalize, so a sweep racing
ingest, the workflow, another sweep or itself changes nothing twice. One batch's error is logged
and does not stop the sweep; the next sweep tries again."""

import logging
from dataclasses import dataclass, field
from typing import Final

from functions.core import chunk_lifecycle
from functions.core.lifecycle import Signal, is_terminal
from functions.core.ports import Stores
from functions.core.records import BatchRecord
from functions.core.settings import Settings
from functions.ingest.logic import fail_validating, resume
from functions.workflow import logic as workflow
from functions.workflow.tasks import TaskError

logger = logging.getLogger("batch-api-sweeper.logic")

#: What ``sweep_batch`` did to one batch.
NOTHING: Final = "nothing"
FAILED_VALIDATING: Final = "failed_validating"
CANCELLED: Final = "cancelled"
RESTARTED: Final = "restarted"
EXPIRED: Final = "expired"
COMPLETED: Final = "completed"
FAILED: Final = "failed"


@dataclass
class Sweep:
    """What one sweep saw and did: the open batches it looked at, the batch ids per action, and
    the batch ids whose handling raised (retried by the next sweep)."""

    looked: int = 0
    actions: dict[str, list[str]] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)


def sweep(stores: Stores, settings: Settings, *, now: int) -> Sweep:
    """Look at every open batch once at time ``now``."""
    result = Sweep()
    for tenant, batch_id in stores.batches.open_batches():
        result.looked += 1
        try:
            action = sweep_batch(stores, settings, tenant, batch_id, now=now)
        except Exception:
            logger.exception(
                "sweeping a batch failed; the next sweep retries", extra={"tenant": tenant, "batch_id": batch_id}
            )
            result.errors.append(batch_id)
            continue
        if action != NOTHING:
            logger.info("swept a batch", extra={"tenant": tenant, "batch_id": batch_id, "action": action})
            result.actions.setdefault(action, []).append(batch_id)
    return result


def sweep_batch(stores: Stores, settings: Settings, tenant: str, batch_id: str, *, now: int) -> str:
    """Act on one open batch if it is overdue; returns the action taken (``NOTHING`` if none)."""
    batch = stores.batches.get(tenant, batch_id)
    if batch is None or is_terminal(batch.status):
        return NOTHING  # the index lags the table
    expiry_deadline = batch.expires_at + settings.expiry_grace_seconds
    if batch.status == "validating":
        if now >= min(batch.created_at + settings.validating_timeout_seconds, expiry_deadline):
            failed = fail_validating(stores, batch, now)
            return FAILED_VALIDATING if failed.status == "failed" and failed.failed_at == now else NOTHING
        return NOTHING
    if batch.status == "cancelling" and batch.in_progress_at is None:
        if now >= (batch.cancelling_at or batch.created_at) + settings.enqueue_grace_seconds:
            return CANCELLED if resume(stores, settings, batch, now) == "cancelled" else NOTHING
        return NOTHING
    if now >= expiry_deadline:
        return _expire(stores, settings, batch, now)
    if batch.status in ("in_progress", "cancelling", "finalizing"):
        batch = chunk_lifecycle.counted_batch(stores, batch)  # a shard its last worker did not fold
    if batch.status in ("in_progress", "cancelling", "finalizing") and chunk_lifecycle.all_counted(batch):
        return _complete(stores, settings, batch, now)
    grace_over = now >= (batch.in_progress_at or batch.created_at) + settings.enqueue_grace_seconds
    if batch.status in ("in_progress", "cancelling") and not batch.enqueued and grace_over:
        resume(stores, settings, batch, now)
        return RESTARTED
    return NOTHING


def completion_grace(settings: Settings) -> int:
    """How long a batch whose every chunk is counted is left to its workflow: one reconcile period
    (a live workflow whose signal was lost sees the counts at its next Check, at most
    ``reconcile_seconds`` later) plus the expiry grace (its Drain and Finalize tasks with their
    retries, which the same grace covers at expiry). 300 + 900 s = 20 min by default: a live
    workflow always finishes first; ``finalize`` is idempotent should both run."""
    return settings.reconcile_seconds + settings.expiry_grace_seconds


def _complete(stores: Stores, settings: Settings, batch: BatchRecord, now: int) -> str:
    """Finalize an all-counted batch its workflow left open, once it has been quiet (no chunk
    counted, no cancel, no close) for ``completion_grace``."""
    counted = stores.batches.counted_chunks(batch.tenant, batch.id, batch.count_shards)
    touched = max(
        [m.recorded_at for m in counted.values()]
        + [t or 0 for t in (batch.in_progress_at, batch.cancelling_at, batch.finalizing_at)]
    )
    if now < touched + completion_grace(settings):
        return NOTHING
    # The signal the workflow would have finalized with: a cancel and a close that decided why
    # (``closed_for``) win over it in ``finalize``; an expiry's drain had begun if finalizing.
    expiring = batch.status == "finalizing" and batch.closed_for is None
    workflow.finalize(stores, batch.tenant, batch.id, Signal.EXPIRE if expiring else Signal.COMPLETE, now)
    return COMPLETED


def _expire(stores: Stores, settings: Settings, batch: BatchRecord, now: int) -> str:
    """Finalize an open batch past its expiry and grace as the workflow would (``expired``, or
    ``cancelled`` if it was cancelling), with its files. A finalize that keeps failing for one more
    grace period gives way to the workflow's last resort, ``fail``, which never fails to end it."""
    try:
        workflow.finalize(stores, batch.tenant, batch.id, Signal.EXPIRE, now)
        return EXPIRED
    except Exception as exc:
        if now < batch.expires_at + 2 * settings.expiry_grace_seconds:
            raise  # logged by ``sweep``; the next sweep finalizes again
        logger.exception(
            "finalizing an overdue batch keeps failing; failing it",
            extra={"tenant": batch.tenant, "batch_id": batch.id},
        )
        workflow.fail(
            stores,
            batch.tenant,
            batch.id,
            TaskError(Error="SweeperFinalizeFailed", Cause=repr(exc)),
            now,
            retried=False,
        )
        return FAILED
