"""The workflow Lambda: the state machine's tasks, one typed event per task (``tasks.Task``)."""

from typing import Any

from aws_lambda_powertools import Logger

from functions.core import deps

from . import logic, tasks

logger = Logger(service="batch-api-workflow")


@logger.inject_lambda_context(clear_state=True)
def handler(event: dict[str, Any], context: Any) -> dict[str, Any]:
    task = tasks.parse(event)
    logger.append_keys(batch_id=task.batch_id, action=task.action)
    return logic.run(task, deps.stores(), deps.settings(), now=deps.now())
