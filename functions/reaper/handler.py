"""Removes the bytes of files whose records are gone and releases what removed files and uploads
held on their tenant's stored-bytes ledger: DynamoDB stream REMOVE events, whether the item was
deleted by the API or expired by TTL. Idempotent (deleting a missing S3 key is a no-op; a release
deletes its marker in the same transaction)."""

from typing import Any

from aws_lambda_powertools import Logger
from aws_lambda_powertools.utilities.data_classes import DynamoDBStreamEvent, event_source
from aws_lambda_powertools.utilities.data_classes.dynamo_db_stream_event import DynamoDBRecordEventName

from functions.core import deps

from .logic import purge_removed, release_removed

logger = Logger(service="batch-api-reaper")


@event_source(data_class=DynamoDBStreamEvent)
@logger.inject_lambda_context(clear_state=True)
def handler(event: DynamoDBStreamEvent, context: Any) -> None:
    old = [
        record.dynamodb.old_image
        for record in event.records
        if record.event_name == DynamoDBRecordEventName.REMOVE and record.dynamodb and record.dynamodb.old_image
    ]
    stores = deps.stores()
    removed = purge_removed(stores.objects, old)
    released = release_removed(stores.stored, old)
    logger.info("purged", extra={"keys": len(removed), "released": released})
