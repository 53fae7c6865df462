"""The ingest Lambda: S3 ObjectCreated events of batch input snapshots, delivered through SQS."""

import json
import time
from typing import Any
from urllib.parse import unquote_plus

from aws_lambda_powertools import Logger
from aws_lambda_powertools.utilities.batch import BatchProcessor, EventType, process_partial_response
from aws_lambda_powertools.utilities.data_classes.sqs_event import SQSRecord

from functions.core import deps, schema

from .logic import ingest

logger = Logger(service="batch-api-ingest")
processor = BatchProcessor(event_type=EventType.SQS)


def snapshot_keys(body: str) -> list[str]:
    """The batch input snapshot keys an S3 notification names (test events and other keys: none)."""
    event = json.loads(body)
    keys = []
    for record in event.get("Records", []):
        if not str(record.get("eventName", "")).startswith("ObjectCreated:"):
            continue
        key = unquote_plus(record["s3"]["object"]["key"])
        if schema.parse_batch_input_key(key):
            keys.append(key)
    return keys


def handle_record(record: SQSRecord) -> None:
    for key in snapshot_keys(record.body):
        tenant, batch_id = schema.parse_batch_input_key(key)  # type: ignore[misc]
        status = ingest(
            deps.stores(), deps.settings(), tenant, batch_id,
            now=lambda: int(time.time()), wait=lambda: time.sleep(0.25), attempts=8,
        )
        logger.info("ingested", extra={"batch_id": batch_id, "tenant": tenant, "status": status})


@logger.inject_lambda_context(clear_state=True)
def handler(event: dict[str, Any], context: Any) -> dict[str, Any]:
    return process_partial_response(event=event, record_handler=handle_record, processor=processor, context=context)
