"""The ingest Lambda: S3 ObjectCreated events of batch input snapshots, delivered through SQS.

Each SQS record is parsed with powertools' parser models (an SQS record whose body is an S3
notification); a record that fails (a parse error, a batch not visible yet, a throttle) is reported
in ``batchItemFailures`` and redelivered by SQS."""

import time
from typing import Any, Literal
from urllib.parse import unquote_plus

from aws_lambda_powertools import Logger
from aws_lambda_powertools.utilities.batch import BatchProcessor, EventType, process_partial_response
from aws_lambda_powertools.utilities.parser.models import S3Model, S3RecordModel, SqsRecordModel
from aws_lambda_powertools.utilities.parser.models.s3 import (
    S3Bucket,
    S3Identity,
    S3Message,
    S3OwnerIdentify,
    S3RequestParameters,
    S3ResponseElements,
)
from pydantic import BaseModel, Json

from functions.core import deps, schema

from .logic import ingest

logger = Logger(service="batch-api-ingest")

#: Attempts (and the pause between them) at reading a batch record that is not visible yet.
RECORD_ATTEMPTS = 8
RECORD_WAIT_SECONDS = 0.25


class S3TestEvent(BaseModel):
    """What S3 sends once when a notification is configured (not an object event)."""

    Event: Literal["s3:TestEvent"]


# powertools' S3 models require fields S3 always sends but the local deployment's moto omits and
# ingest never reads (who made the request, the bucket owner): optional here.
class _Bucket(S3Bucket):
    ownerIdentity: S3OwnerIdentify | None = None  # type: ignore[assignment]


class _Message(S3Message):
    bucket: _Bucket  # type: ignore[assignment]


class S3EventRecord(S3RecordModel):
    userIdentity: S3Identity | None = None  # type: ignore[assignment]
    requestParameters: S3RequestParameters | None = None  # type: ignore[assignment]
    responseElements: S3ResponseElements | None = None  # type: ignore[assignment]
    s3: _Message  # type: ignore[assignment]


class S3Notification(S3Model):
    Records: list[S3EventRecord]  # type: ignore[assignment]


class IngestRecord(SqsRecordModel):
    """An SQS record carrying an S3 notification (or S3's test event)."""

    body: Json[S3TestEvent | S3Notification]  # type: ignore[assignment]


def snapshot_keys(notification: S3TestEvent | S3Notification) -> list[str]:
    """The batch input snapshot keys a notification names (test events, other events and other
    keys: none). S3 URL-encodes keys in notifications."""
    if isinstance(notification, S3TestEvent):
        return []
    keys = []
    for record in notification.Records:
        if not record.eventName.startswith("ObjectCreated:") or record.s3.object is None:
            continue
        key = unquote_plus(record.s3.object.key)
        if schema.parse_batch_input_key(key):
            keys.append(key)
    return keys


def handle_record(record: IngestRecord) -> None:
    now = deps.clock()()
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
