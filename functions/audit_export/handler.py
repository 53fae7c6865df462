"""The table's stream -> the audit chains' WORM copy (functions/audit_export/logic.py). The event
source mapping passes only INSERTs of audit records (``infra/constructs/audit.py``,
``stream_filter``); anything else in a batch is skipped here too."""

from typing import Any

from aws_lambda_powertools import Logger
from aws_lambda_powertools.utilities.data_classes import DynamoDBStreamEvent, event_source
from aws_lambda_powertools.utilities.data_classes.dynamo_db_stream_event import DynamoDBRecordEventName

from functions.core import clients, deps, schema
from functions.core.aws.s3 import WormObjects

from .logic import export

logger = Logger(service="batch-api-audit-export")


@deps.per_process
def worm() -> WormObjects:
    return WormObjects(clients.client("s3"), deps.settings().audit_bucket_name)


def audit_records(event: DynamoDBStreamEvent) -> list[str]:
    """The canonical JSON of each audit record the event's INSERTs carry."""
    out = []
    for record in event.records:
        image = record.dynamodb.new_image if record.dynamodb else None
        if record.event_name != DynamoDBRecordEventName.INSERT or not image:
            continue
        if str(image.get(schema.PK, "")).startswith(schema.audit_pk("")) and str(image.get(schema.SK, "")).startswith(schema.AUDIT_SEQ_PREFIX):
            out.append(image["record"])
    return out


@event_source(data_class=DynamoDBStreamEvent)
@logger.inject_lambda_context(clear_state=True)
def handler(event: DynamoDBStreamEvent, context: Any) -> None:
    done = export(worm(), audit_records(event))
    if done.conflicts:
        logger.error("audit_worm_conflict", extra={"keys": done.conflicts})
    logger.info("exported", extra={"written": len(done.written), "duplicates": len(done.duplicates)})
