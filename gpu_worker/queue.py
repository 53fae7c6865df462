"""The work queue as the worker sees it: receive, extend, release, delete (boto3 SQS).

Besides ``functions.core.stores`` this is the only worker code that touches boto3. Calls are
blocking; the loop runs them in its queue threads (the SQS client is thread-safe).
"""

from dataclasses import dataclass
from typing import Any

from botocore.exceptions import ClientError


@dataclass(frozen=True)
class Received:
    message_id: str
    receipt: str
    body: str
    #: How often SQS has delivered this message (1 on the first delivery).
    receive_count: int


class WorkQueue:
    def __init__(self, sqs: Any, queue_url: str):
        self._sqs, self.url = sqs, queue_url

    def receive(self, max_messages: int, wait_seconds: int, visibility_seconds: int) -> list[Received]:
        resp = self._sqs.receive_message(
            QueueUrl=self.url,
            MaxNumberOfMessages=max(1, min(10, max_messages)),
            WaitTimeSeconds=wait_seconds,
            VisibilityTimeout=visibility_seconds,
            MessageSystemAttributeNames=["ApproximateReceiveCount"],
        )
        return [
            Received(
                m["MessageId"], m["ReceiptHandle"], m["Body"],
                int(m.get("Attributes", {}).get("ApproximateReceiveCount", "1")),
            )
            for m in resp.get("Messages", [])
        ]

    def extend(self, receipt: str, seconds: int) -> bool:
        """Keep a message invisible ``seconds`` more; False if the receipt is no longer valid
        (the message was deleted, or its visibility already ran out and someone else has it)."""
        return self._change_visibility(receipt, seconds)

    def release(self, receipt: str, after_seconds: int = 0) -> bool:
        """Make a message visible again (at once, or after ``after_seconds``) for another worker."""
        return self._change_visibility(receipt, after_seconds)

    def delete(self, receipt: str) -> None:
        self._sqs.delete_message(QueueUrl=self.url, ReceiptHandle=receipt)

    def _change_visibility(self, receipt: str, seconds: int) -> bool:
        try:
            self._sqs.change_message_visibility(QueueUrl=self.url, ReceiptHandle=receipt, VisibilityTimeout=seconds)
        except ClientError as exc:
            code = exc.response.get("Error", {}).get("Code", "")
            if code in ("ReceiptHandleIsInvalid", "MessageNotInflight", "AWS.SimpleQueueService.MessageNotInflight", "InvalidParameterValue"):
                return False
            raise
        return True
