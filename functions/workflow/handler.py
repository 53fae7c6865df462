"""The workflow Lambda: the state machine's tasks, selected by ``action``."""

import time
from typing import Any

from aws_lambda_powertools import Logger

from functions.core import deps

from . import logic

logger = Logger(service="batch-api-workflow")


@logger.inject_lambda_context(clear_state=True)
def handler(event: dict[str, Any], context: Any) -> dict[str, Any]:
    action, tenant, batch_id = event["action"], event["tenant"], event["batch_id"]
    logger.append_keys(batch_id=batch_id, action=action)
    stores, now = deps.stores(), int(time.time())
    if action == "register":
        return logic.register(stores, tenant, batch_id, event["token"])
    if action == "drain":
        return logic.drain(stores, deps.settings(), tenant, batch_id, event["signal"], now)
    if action == "finalize":
        return logic.finalize(stores, tenant, batch_id, event["signal"], now)
    if action == "fail":
        return logic.fail(stores, tenant, batch_id, event.get("error") or {}, now)
    raise ValueError(f"unknown workflow action {action!r}")
