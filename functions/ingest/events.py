"""The ingest Lambda's event: an SQS record whose body is an S3 notification (or S3's test event),
on powertools' parser models, and the batch input snapshot keys it names."""

from typing import Literal
from urllib.parse import unquote_plus

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

from functions.core import schema


class S3TestEvent(BaseModel):
    """What S3 sends once when a notification is configured (not an object event)."""

    Event: Literal["s3:TestEvent"]


# powertools' S3 models require fields S3 always sends but the local deployment's moto omits and
# ingest never reads (who made the request, the bucket owner): optional here.
class _Bucket(S3Bucket):
    ownerIdentity: S3OwnerIdentify | None = None  # type: ignore[assignment]  # optional here (above)


class _Message(S3Message):
    bucket: _Bucket


class S3EventRecord(S3RecordModel):
    userIdentity: S3Identity | None = None  # type: ignore[assignment]  # optional here (above)
    requestParameters: S3RequestParameters | None = None  # type: ignore[assignment]  # optional here (above)
    responseElements: S3ResponseElements | None = None  # type: ignore[assignment]  # optional here (above)
    s3: _Message


class S3Notification(S3Model):
    Records: list[S3EventRecord]  # type: ignore[assignment]  # our record model (a list is invariant)


class IngestRecord(SqsRecordModel):
    """An SQS record carrying an S3 notification (or S3's test event)."""

    body: Json[S3TestEvent | S3Notification]


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


def snapshot_batches(notification: S3TestEvent | S3Notification) -> list[tuple[str, str]]:
    """(tenant, batch_id) of each batch input snapshot a notification names (``snapshot_keys``)."""
    return [batch for key in snapshot_keys(notification) if (batch := schema.parse_batch_input_key(key))]
