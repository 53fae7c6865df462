"""The batch workflow as plain ASL (JSONPath), defined once.

The CDK stack substitutes ``${WorkflowFunctionArn}`` (``DefinitionBody.from_string`` with
definition substitutions); the local deployment substitutes the local function's ARN and runs the
same definition on moto's Step Functions interpreter.

Execution input: ``{"tenant", "batch_id", "timeout_seconds", "poll_seconds", "reconcile_seconds"}``:
how long the first wait for a signal lasts (``limits.signal_wait_seconds``: until the batch's
``expires_at``, at most ``reconcile_seconds``), how often draining checks for running chunks, and
the reconcile period.

A signal can be lost (the worker dies between counting the last chunk and signalling; the API's
cancel signal fails), so the wait is a reconciling one: when it times out, ``Check`` reads the
batch and answers the signal to act on (cancel, complete, expire), or ``wait`` with the next
timeout, and the machine waits again with a fresh token (docs/lifecycle.md, "Lost signals").
"""

import json
from typing import Any

from functions.core.lifecycle import SIGNAL_FIELD
from functions.workflow.logic import WAIT

FUNCTION_PLACEHOLDER = "WorkflowFunctionArn"
_LAMBDA_RETRY = {
    "ErrorEquals": [
        "Lambda.ServiceException",
        "Lambda.AWSLambdaException",
        "Lambda.SdkClientException",
        "Lambda.TooManyRequestsException",
    ],
    "IntervalSeconds": 1,
    "MaxAttempts": 5,
    "BackoffRate": 2,
}
#: Transient task failures (a throttled or unreachable table, a Lambda crash) are retried before
#: the failure path. ``States.TaskFailed`` matches every error but ``States.Timeout``, which on
#: WaitForSignal is the reconcile tick and must reach its Catch.
_TASK_RETRY = {"ErrorEquals": ["States.TaskFailed"], "IntervalSeconds": 2, "MaxAttempts": 3, "BackoffRate": 2}
_ANY_RETRY = {"ErrorEquals": ["States.ALL"], "IntervalSeconds": 2, "MaxAttempts": 3, "BackoffRate": 2}
_TO_FAIL = {"ErrorEquals": ["States.ALL"], "ResultPath": "$.error", "Next": "Fail"}


def _invoke(action: str, extra: dict[str, str], *, wait_for_token: bool = False) -> dict[str, Any]:
    resource = "arn:aws:states:::lambda:invoke" + (".waitForTaskToken" if wait_for_token else "")
    return {
        "Type": "Task",
        "Resource": resource,
        "Parameters": {
            "FunctionName": "${" + FUNCTION_PLACEHOLDER + "}",
            "Payload": {"action": action, "tenant.$": "$.tenant", "batch_id.$": "$.batch_id", **extra},
        },
    }


def definition() -> dict[str, Any]:
    return {
        "Comment": "One execution per batch: wait for completion, cancel or expiry (checking the batch when no signal "
        "came); drain; finalize.",
        "StartAt": "WaitForSignal",
        "States": {
            "WaitForSignal": {
                **_invoke("register", {"token.$": "$$.Task.Token"}, wait_for_token=True),
                "TimeoutSecondsPath": "$.timeout_seconds",
                "ResultPath": "$.signal",
                "Retry": [_LAMBDA_RETRY, _TASK_RETRY],
                "Catch": [
                    {"ErrorEquals": ["States.Timeout"], "ResultPath": "$.timeout", "Next": "Check"},
                    _TO_FAIL,
                ],
                "Next": "Drain",
            },
            "Check": {
                **_invoke("check", {"reconcile_seconds.$": "$.reconcile_seconds"}),
                "ResultSelector": {
                    f"{SIGNAL_FIELD}.$": f"$.Payload.{SIGNAL_FIELD}",
                    "timeout_seconds.$": "$.Payload.timeout_seconds",
                },
                "ResultPath": "$.signal",
                "Retry": [_LAMBDA_RETRY, _ANY_RETRY],
                "Catch": [_TO_FAIL],
                "Next": "Signalled?",
            },
            "Signalled?": {
                "Type": "Choice",
                "Choices": [{"Variable": f"$.signal.{SIGNAL_FIELD}", "StringEquals": WAIT, "Next": "WaitAgain"}],
                "Default": "Drain",
            },
            "WaitAgain": {
                "Type": "Pass",
                "InputPath": "$.signal.timeout_seconds",
                "ResultPath": "$.timeout_seconds",
                "Next": "WaitForSignal",
            },
            "Drain": {
                **_invoke("drain", {"signal.$": f"$.signal.{SIGNAL_FIELD}"}),
                "ResultSelector": {"drained.$": "$.Payload.drained", "reason.$": "$.Payload.reason"},
                "ResultPath": "$.drain",
                "Retry": [_LAMBDA_RETRY, _ANY_RETRY],
                "Catch": [_TO_FAIL],
                "Next": "Drained?",
            },
            "Drained?": {
                "Type": "Choice",
                "Choices": [{"Variable": "$.drain.drained", "BooleanEquals": True, "Next": "Finalize"}],
                "Default": "WaitForRunningChunks",
            },
            "WaitForRunningChunks": {"Type": "Wait", "SecondsPath": "$.poll_seconds", "Next": "Drain"},
            "Finalize": {
                **_invoke("finalize", {"signal.$": "$.drain.reason"}),
                "ResultSelector": {"status.$": "$.Payload.status"},
                "ResultPath": "$.result",
                "Retry": [_LAMBDA_RETRY, _ANY_RETRY],
                "Catch": [_TO_FAIL],
                "End": True,
            },
            "Fail": {
                **_invoke("fail", {"error.$": "$.error"}),
                "ResultSelector": {"status.$": "$.Payload.status"},
                "ResultPath": "$.result",
                "Retry": [_LAMBDA_RETRY, _ANY_RETRY],
                "Next": "Failed",
            },
            "Failed": {
                "Type": "Fail",
                "Error": "BatchFailed",
                "Cause": "The batch could not be finalized; see its errors.",
            },
        },
    }


def definition_json() -> str:
    """The definition with the ``${WorkflowFunctionArn}`` placeholder (for CDK)."""
    return json.dumps(definition(), indent=2)


def render(function_arn: str) -> str:
    """The definition with the placeholder substituted (for the local deployment)."""
    return definition_json().replace("${" + FUNCTION_PLACEHOLDER + "}", function_arn)
