"""Step Functions: the ``Workflows`` port (start a batch's execution, resume its waiting task)."""

import json
from typing import Any

from botocore.exceptions import ClientError


class StepFunctions:
    """Starts batch workflows and signals their waiting task."""

    def __init__(self, sfn: Any, state_machine_arn: str):
        self._sfn = sfn
        self._arn = state_machine_arn

    def start(self, name: str, payload: dict[str, Any]) -> None:
        """Start the execution ``name``; starting it again is a no-op."""
        try:
            self._sfn.start_execution(stateMachineArn=self._arn, name=name, input=json.dumps(payload))
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") != "ExecutionAlreadyExists":
                raise

    def signal(self, token: str, output: dict[str, Any]) -> bool:
        """Resume the waiting task; False if the token is no longer valid (already resumed)."""
        try:
            self._sfn.send_task_success(taskToken=token, output=json.dumps(output))
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") in ("TaskTimedOut", "InvalidToken", "TaskDoesNotExist"):
                return False
            raise
        return True
