"""The ingest dead-letter consumer's logic: an ingest event that kept failing (INGEST_MAX_RECEIVES
receives) was dead-lettered; end or resume its batch so that it never waits forever.

- ``validating``: its input could not be processed: ``failed`` with ``INGEST_FAILED_ERROR``.
- ``cancelling`` before it started: ``cancelled``.
- ``in_progress``/``cancelling`` not ``enqueued`` (validated, but the fan-out or the workflow start
  kept failing): fan out and start once more; if that fails too, the sweeper redoes it later.
- anything else (already enqueued, terminal, or no record): nothing.

Every write is conditional, so a duplicate delivery, or the sweeper or ingest racing it, changes
nothing more. Takes its stores, settings and ``now``; the Lambda around it is ``handler``."""

import logging
from typing import Final

from functions.core.ports import Stores
from functions.core.settings import Settings
from functions.ingest.logic import fail_validating, resume

logger = logging.getLogger("batch-api-ingest-dlq.logic")

#: What ``handle_dead_letter`` reports (beside the batch's status) when the batch is unknown.
MISSING: Final = "missing"


def handle_dead_letter(stores: Stores, settings: Settings, tenant: str, batch_id: str, *, now: int) -> str:
    """Act on the dead-lettered ingest event of one batch at ``now``; returns the batch's status
    afterwards (``MISSING`` if there is no such batch). Store errors reading or failing the batch
    propagate (the message is redelivered); a failing retry of the fan-out is logged and left to
    the sweeper."""
    batch = stores.batches.get(tenant, batch_id)
    if batch is None:
        logger.warning(
            "dead-lettered ingest event for a batch that does not exist", extra={"tenant": tenant, "batch_id": batch_id}
        )
        return MISSING
    if batch.status == "validating":
        return fail_validating(stores, batch, now).status
    try:
        return resume(stores, settings, batch, now)
    except Exception:
        logger.exception(
            "retrying the fan-out of a dead-lettered batch failed; the sweeper will redo it",
            extra={"tenant": tenant, "batch_id": batch_id, "status": batch.status},
        )
        return batch.status
