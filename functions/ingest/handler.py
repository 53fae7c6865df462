"""The ingest Lambda: S3 ObjectCreated events of batch input snapshots, delivered through SQS.

Each SQS record is parsed with powertools' parser models (``events.IngestRecord``); a record that
fails (a parse error, a batch not visible yet, a throttle) is reported in ``batchItemFailures`` and
redelivered by SQS."""

import time
from collections.abc import Callable
from typing import Any

from aws_lambda_powertools import Logger
from aws_lambda_powertools.utilities.batch import BatchProcessor, EventType, process_partial_response
from aws_lambda_powertools.utilities.batch.types import PartialItemFailureResponse

from functions.core import deps

from .events import IngestRecord, snapshot_batches
from .logic import ingest

logger = Logger(service="batch-api-ingest")

#: The pauses between attempts at reading a batch record that is not visible yet, short first: the
#: create handler copies the snapshot before it writes the record (so a crash leaves no record
#: without its input), and locally the snapshot's event often reaches ingest before that write
#: lands; a fixed 0.25 s pause cost half the batches 0.25 s before their first line
#: (docs/benchmarks.md, "End to end vs vllm run-batch"). About 1.8 s of patience in all.
RECORD_WAITS = (0.02, 0.04, 0.08, 0.16, 0.25, 0.25, 0.25, 0.25, 0.25, 0.25)
RECORD_ATTEMPTS = len(RECORD_WAITS) + 1


def _record_waits() -> Callable[[], None]:
    """One record read's pauses, in turn (the last repeated)."""
    pauses = iter(RECORD_WAITS)
    return lambda: time.sleep(next(pauses, RECORD_WAITS[-1]))


def handle_record(record: IngestRecord) -> None:
    now = deps.now()
    for tenant, batch_id in snapshot_batches(record.body):
        status = ingest(
            deps.stores(),
            deps.settings(),
            tenant,
            batch_id,
            now=now,
            wait=_record_waits(),
            attempts=RECORD_ATTEMPTS,
        )
        logger.info("ingested", extra={"batch_id": batch_id, "tenant": tenant, "status": status})


processor = BatchProcessor(event_type=EventType.SQS, model=IngestRecord)


@logger.inject_lambda_context(clear_state=True)
def handler(event: dict[str, Any], context: Any) -> PartialItemFailureResponse:
    return process_partial_response(event=event, record_handler=handle_record, processor=processor, context=context)
