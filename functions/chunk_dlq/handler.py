"""The chunk DLQ Lambda: fed by the work queues' dead-letter queues (SQS event, partial batch failures)."""

from typing import Any

from aws_lambda_powertools import Logger
from aws_lambda_powertools.utilities.batch import BatchProcessor, EventType, process_partial_response
from aws_lambda_powertools.utilities.batch.types import PartialItemFailureResponse
from aws_lambda_powertools.utilities.data_classes.sqs_event import SQSRecord
from pydantic import ValidationError

from functions.core import deps
from functions.core.messages import WorkMessage

from .logic import fail_chunk

logger = Logger(service="batch-api-dlq")
processor = BatchProcessor(event_type=EventType.SQS)


def handle_record(record: SQSRecord) -> None:
    try:
        message = WorkMessage.model_validate_json(record.body)
    except ValidationError as exc:
        # Not a work message: nothing can be recorded for it. Log and drop (retrying cannot help).
        logger.error(
            "dead-lettered message is not a work message",
            extra={"message_id": record.message_id, "error": str(exc)[:500]},
        )
        return
    if not message.bound():
        # Its input is not its tenant's batch input (WorkMessage.bound): read and record nothing.
        logger.error(
            "dead-lettered message not bound to its tenant",
            extra={"message_id": record.message_id, "tenant": message.tenant, "batch_id": message.batch_id},
        )
        return
    receives = int(record.attributes.approximate_receive_count or 0)
    outcome = fail_chunk(deps.stores(), message, now=deps.now())
    logger.warning(
        "dead-lettered chunk",
        extra={
            "batch_id": message.batch_id,
            "tenant": message.tenant,
            "chunk": message.chunk,
            "receives": receives,
            "action": outcome.action,
            "failed": outcome.failed,
            "last": outcome.last,
        },
    )


@logger.inject_lambda_context(clear_state=True)
def handler(event: dict[str, Any], context: Any) -> PartialItemFailureResponse:
    return process_partial_response(event=event, record_handler=handle_record, processor=processor, context=context)
