"""The webhook Lambda (docs/webhooks.md), fed by the webhook queue: fans batch events out to the
tenant's endpoints and attempts deliveries. A delivery to retry is reported as a batch item
failure after its visibility is set to the next delay of the schedule, so SQS hands it back then."""

import json
from typing import Any

from aws_lambda_powertools import Logger

from functions.core import clients, deps
from functions.core.aws.dynamodb import Table

from . import http, logic
from .store import WebhookRepo

logger = Logger(service="batch-api-webhooks")


@deps.per_process
def repo() -> WebhookRepo:
    return WebhookRepo(Table(clients.dynamodb_table(deps.settings().table_name)))


def handle(record: dict[str, Any]) -> bool:
    """Handle one SQS record; False if its message must come back (visibility already set)."""
    settings = deps.settings()
    queue = deps.stores().queues.queue(settings.webhook_queue_url)
    message = json.loads(record["body"])
    if not logic.is_delivery(message):
        ids = logic.fan_out(repo(), queue, message, now=deps.now())
        logger.info("webhook fan-out", extra={"event_type": message.get("detail-type"), "deliveries": ids})
        return True
    attempt = int(record.get("attributes", {}).get("ApproximateReceiveCount", 1))
    outcome = logic.deliver(
        repo(), message, attempt=attempt, post=http.post, now=deps.now(),
        allow_loopback_http=settings.webhook_allow_loopback_http,
    )
    logger.info("webhook attempt", extra=outcome.attempt.model_dump(exclude={"tenant"}) | {"tenant": message["tenant"]})
    if outcome.retry_in is not None:
        queue.release(record["receiptHandle"], outcome.retry_in)
        return False
    if outcome.give_up:
        queue.release(record["receiptHandle"], 0)  # received once more: past maxReceiveCount, to the DLQ
        return False
    return True


@logger.inject_lambda_context(clear_state=True)
def handler(event: dict[str, Any], context: Any) -> dict[str, Any]:
    failures = []
    for record in event.get("Records", []):
        try:
            done = handle(record)
        except Exception:
            logger.exception("webhook message failed; it will be retried", extra={"message_id": record["messageId"]})
            done = False
        if not done:
            failures.append({"itemIdentifier": record["messageId"]})
    return {"batchItemFailures": failures}
