"""The scaler Lambda: run by an EventBridge schedule every minute and by the batch ``in_progress``
event (the moment ingest has enqueued a batch's chunks), it sets each model's GPU service's
desired task count (``logic.run``). Every invocation looks at every model: a few API calls each."""

import os
from typing import Any

from aws_lambda_powertools import Logger

from functions.core import clients, deps
from functions.core.aws.scaling import EcsServices, SqsDepth, TableScalerState

from .logic import run
from .settings import ScalerSettings

logger = Logger(service="batch-api-scaler")


@deps.per_process
def _config() -> ScalerSettings:
    return ScalerSettings.from_env(os.environ)


@logger.inject_lambda_context(clear_state=True)
def handler(event: dict[str, Any], context: Any) -> dict[str, Any]:
    config = _config()
    services = EcsServices(clients.client("ecs"))
    queues = SqsDepth(clients.client("sqs"))
    states = TableScalerState(clients.dynamodb_table(config.table_name))
    now = deps.now()
    out: dict[str, Any] = {}
    failed = None
    for service in config.services:
        try:
            decision = run(service, services=services, queues=queues, states=states, now=now)
        except Exception as error:  # one model's failure must not stop the others
            logger.exception("scaling failed", extra={"model": service.model})
            failed = failed or error
            continue
        out[service.model] = {"desired": decision.desired, "reason": decision.reason}
    logger.info("scaled", extra={"trigger": event.get("detail-type", "schedule"), "services": out})
    if failed is not None:
        raise failed  # the invocation fails (retried; the Errors alarm sees it)
    return out
