"""The ingest dead-letter Lambda: ingest events (S3 snapshot notifications) that the ingest queue
dead-lettered after INGEST_MAX_RECEIVES receives, delivered through an SQS event source on the
ingest DLQ. Each names batch snapshots; ``logic.handle_dead_letter`` ends or resumes each
batch. A record whose handling raised (a store error) is reported in ``batchItemFailures`` and
redelivered; a body that is not an ingest event is logged and dropped (it can never succeed)."""

from typing import Any

from aws_lambda_powertools import Logger
from aws_lambda_powertools.utilities.batch import BatchProcessor, EventType, process_partial_response
from aws_lambda_powertools.utilities.batch.types import PartialItemFailureResponse
from aws_lambda_powertools.utilities.data_classes.sqs_event import SQSRecord
from pydantic import ValidationError

from functions.core import deps
from functions.ingest.events import IngestRecord, snapshot_batches

from .logic import handle_dead_letter

logger = Logger(service="batch-api-ingest-dlq")


def handle_record(record: SQSRecord) -> None:
    try:
        parsed = IngestRecord.model_validate(record.raw_event)
    except ValidationError:
        logger.error(
            "dead-lettered ingest message is not an ingest event; dropped", extra={"message_id": record.message_id}
        )
        return
    now = deps.now()
    for tenant, batch_id in snapshot_batches(parsed.body):
        status = handle_dead_letter(deps.stores(), deps.settings(), tenant, batch_id, now=now)
        logger.info(
            "dead-lettered ingest event handled", extra={"batch_id": batch_id, "tenant": tenant, "status": status}
        )


processor = BatchProcessor(event_type=EventType.SQS)


@logger.inject_lambda_context(clear_state=True)
def handler(event: dict[str, Any], context: Any) -> PartialItemFailureResponse:
    return process_partial_response(event=event, record_handler=handle_record, processor=processor, context=context)
