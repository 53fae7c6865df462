"""The batch workflow as plain ASL (JSONPath), defined once.

The CDK stack substitutes ``${WorkflowFunctionArn}`` (``DefinitionBody.from_string`` with
definition substitutions); the local deployment substitutes the local function's ARN and runs the
same definition on moto's Step Functions interpreter.

Execution input: ``{"tenant", "batch_id", "timeout_seconds", "poll_seconds"}``: seconds until the
batch's ``expires_at``, and how often draining checks for running chunks.
"""

import json
from typing import Any

from functions.core.accounting import SIGNAL_FIELD, Signal

FUNCTION_PLACEHOLDER = "WorkflowFunctionArn"
_LAMBDA_RETRY = {
    "ErrorEquals": ["Lambda.ServiceException", "Lambda.AWSLambdaException", "Lambda.SdkClientException", "Lambda.TooManyRequestsException"],
    "IntervalSeconds": 1,
    "MaxAttempts": 5,
    "BackoffRate": 2,
}
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
        "Comment": "One execution per batch: wait for completion, cancel or expiry; drain; finalize.",
        "StartAt": "WaitForSignal",
        "States": {
            "WaitForSignal": {
                **_invoke("register", {"token.$": "$$.Task.Token"}, wait_for_token=True),
                "TimeoutSecondsPath": "$.timeout_seconds",
                "ResultPath": "$.signal",
                "Retry": [_LAMBDA_RETRY],
                "Catch": [
                    {"ErrorEquals": ["States.Timeout"], "ResultPath": "$.timeout", "Next": "Expired"},
                    _TO_FAIL,
                ],
                "Next": "Drain",
            },
            "Expired": {"Type": "Pass", "Result": Signal.EXPIRE.output(), "ResultPath": "$.signal", "Next": "Drain"},
            "Drain": {
                **_invoke("drain", {"signal.$": f"$.signal.{SIGNAL_FIELD}"}),
                "ResultSelector": {"drained.$": "$.Payload.drained", "reason.$": "$.Payload.reason"},
                "ResultPath": "$.drain",
                "Retry": [_LAMBDA_RETRY],
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
                "Retry": [_LAMBDA_RETRY, {"ErrorEquals": ["States.ALL"], "IntervalSeconds": 2, "MaxAttempts": 3, "BackoffRate": 2}],
                "Catch": [_TO_FAIL],
                "End": True,
            },
            "Fail": {
                **_invoke("fail", {"error.$": "$.error"}),
                "ResultSelector": {"status.$": "$.Payload.status"},
                "ResultPath": "$.result",
                "Retry": [_LAMBDA_RETRY, {"ErrorEquals": ["States.ALL"], "IntervalSeconds": 2, "MaxAttempts": 3, "BackoffRate": 2}],
                "Next": "Failed",
            },
            "Failed": {"Type": "Fail", "Error": "BatchFailed", "Cause": "The batch could not be finalized; see its errors."},
        },
    }


def definition_json() -> str:
    """The definition with the ``${WorkflowFunctionArn}`` placeholder (for CDK)."""
    return json.dumps(definition(), indent=2)


def render(function_arn: str) -> str:
    """The definition with the placeholder substituted (for the local deployment)."""
    return definition_json().replace("${" + FUNCTION_PLACEHOLDER + "}", function_arn)
