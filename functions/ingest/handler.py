"""The ingest Lambda: S3 ObjectCreated events of batch input snapshots, delivered through SQS.

Each SQS record is parsed with powertools' parser models (``events.IngestRecord``); a record that
fails (a parse error, a batch not visible yet, a throttle) is reported in ``batchItemFailures`` and
redelivered by SQS."""

import time
from typing import Any

from aws_lambda_powertools import Logger
from aws_lambda_powertools.utilities.batch import BatchProcessor, EventType, process_partial_response

from functions.core import deps, schema

from .events import IngestRecord, snapshot_keys
from .logic import ingest

logger = Logger(service="batch-api-ingest")

#: Attempts (and the pause between them) at reading a batch record that is not visible yet.
RECORD_ATTEMPTS = 8
RECORD_WAIT_SECONDS = 0.25


def handle_record(record: IngestRecord) -> None:
    now = deps.now()
    for key in snapshot_keys(record.body):
        tenant, batch_id = schema.parse_batch_input_key(key)  # type: ignore[misc]
        status = ingest(
            deps.stores(), deps.settings(), tenant, batch_id,
            now=now, wait=lambda: time.sleep(RECORD_WAIT_SECONDS), attempts=RECORD_ATTEMPTS,
        )
        logger.info("ingested", extra={"batch_id": batch_id, "tenant": tenant, "status": status})


processor = BatchProcessor(event_type=EventType.SQS, model=IngestRecord)


@logger.inject_lambda_context(clear_state=True)
def handler(event: dict[str, Any], context: Any) -> dict[str, Any]:
    return process_partial_response(event=event, record_handler=handle_record, processor=processor, context=context)
