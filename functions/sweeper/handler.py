"""The sweeper Lambda: invoked by an EventBridge schedule every ``sweep_seconds``; the work is
``logic.sweep`` (every open batch that is overdue is ended or restarted)."""

from typing import Any

from aws_lambda_powertools import Logger

from functions.core import deps

from .logic import sweep

logger = Logger(service="batch-api-sweeper")


@logger.inject_lambda_context(clear_state=True)
def handler(event: dict[str, Any], context: Any) -> dict[str, Any]:
    result = sweep(deps.stores(), deps.settings(), now=deps.now())
    summary = {
        "looked": result.looked,
        "actions": {k: len(v) for k, v in result.actions.items()},
        "errors": len(result.errors),
    }
    # Quiet when there was nothing to do (the local deployment sweeps every few seconds:
    # ``LocalConfig.settings.sweep_seconds``).
    (logger.info if result.actions or result.errors else logger.debug)("swept", extra=summary)
    return summary
