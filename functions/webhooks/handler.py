"""The webhook Lambda (docs/webhooks.md), fed by the webhook queue: fans true batch events out to
the tenant's endpoints and attempts the deliveries that are due, all of one invocation's at once.
A delivery not yet due goes back invisible until it is (not an attempt); a failed attempt sends the
next attempt's message; a spent schedule goes to the dead-letter queue. A message that could not
be handled is reported as a batch item failure and comes back after the queue's visibility."""

import json
from typing import Any

from aws_lambda_powertools import Logger, single_metric
from aws_lambda_powertools.metrics import MetricUnit

from functions.core import clients, deps
from functions.core.aws.dynamodb import Table
from functions.core.aws.repos import BatchRepo
from functions.core.names import METRICS_NAMESPACE

from . import http, logic
from .store import WebhookRepo

logger = Logger(service="batch-api-webhooks")


@deps.per_process
def _table() -> Table:
    return Table(clients.dynamodb_table(deps.settings().table_name))


def repo() -> WebhookRepo:
    return WebhookRepo(_table())


def batches() -> BatchRepo:
    return BatchRepo(_table())


def fan_out(message: dict[str, Any]) -> None:
    queue = deps.stores().queues.queue(deps.settings().webhook_queue_url)
    result = logic.fan_out(repo(), batches(), queue, message, now=deps.now())
    if result.dropped is None:
        logger.info(
            "webhook fan-out", extra={"event_type": message.get("detail-type"), "deliveries": result.webhook_ids}
        )
        return
    detail = message.get("detail")
    if not isinstance(detail, dict):
        detail = {}
    logger.warning(
        "webhook event dropped",
        extra={
            "reason": result.dropped,
            "event_type": message.get("detail-type"),
            "source": message.get("source"),
            "tenant": detail.get("tenant"),
            "batch_id": detail.get("id"),
            "event_id": message.get("id"),
        },
    )
    with single_metric(
        name=logic.DROPPED_METRIC, unit=MetricUnit.Count, value=1, namespace=METRICS_NAMESPACE
    ) as metric:
        metric.add_dimension(name="service", value="webhooks")


def settle(record: dict[str, Any], message: logic.Delivery, outcome: logic.Outcome) -> None:
    """What follows an attempt: the next attempt's message, or the dead-letter queue."""
    settings = deps.settings()
    queues = deps.stores().queues
    logger.info("webhook attempt", extra=outcome.attempt.model_dump(exclude={"tenant"}) | {"tenant": message.tenant})
    if outcome.retry is not None:
        queues.queue(settings.webhook_queue_url).send([outcome.retry.model_dump_json()])
    elif outcome.give_up:
        queues.queue(settings.webhook_dead_letter_queue_url).send([record["body"]])


@logger.inject_lambda_context(clear_state=True)
def handler(event: dict[str, Any], context: Any) -> dict[str, Any]:
    settings, now = deps.settings(), deps.now()
    queue = deps.stores().queues.queue(settings.webhook_queue_url)
    failures: list[str] = []
    due: list[tuple[dict[str, Any], logic.Delivery]] = []
    for record in event.get("Records", []):
        try:
            body = json.loads(record["body"])
            if not logic.is_delivery(body):
                fan_out(body)
                continue
            message = logic.Delivery.model_validate(body)
            wait = message.wait_seconds(now)
            if wait == 0 and context.get_remaining_time_in_millis() >= logic.ATTEMPT_RESERVE_SECONDS * 1000:
                due.append((record, message))
                continue
            queue.release(record["receiptHandle"], wait)  # back when due (or at once: no time left): not an attempt
        except Exception:
            logger.exception("webhook message failed; it will be retried", extra={"message_id": record["messageId"]})
        failures.append(record["messageId"])
    outcomes = logic.deliver_all(
        repo(),
        [m for _, m in due],
        post=http.post,
        now=now,
        allow_loopback_http=settings.webhook_allow_loopback_http,
    )
    for (record, message), outcome in zip(due, outcomes, strict=True):
        try:
            if isinstance(outcome, Exception):
                raise outcome  # not attempted, or its attempt not logged
            settle(record, message, outcome)
        except Exception:
            logger.exception(
                "webhook delivery not settled; it will be retried",
                extra={"message_id": record["messageId"], "webhook_id": message.webhook_id},
            )
            failures.append(record["messageId"])
    return {"batchItemFailures": [{"itemIdentifier": m} for m in failures]}
