"""SQS: the one queue adapter (port ``WorkQueue``), used by ingest to send work and by the GPU
worker and the local pollers to receive it. Calls are blocking; the worker runs them in threads
(the boto3 client is thread-safe).

Fair share (docs/governance.md "Fair share"): every message whose JSON body names a
``tenant`` (work messages, upload assembly messages) is sent with ``MessageGroupId`` = that tenant.
On a standard queue this turns on SQS fair queues: when one tenant's messages take a
disproportionate share of the in-flight messages, SQS delivers the other tenants' messages first
(https://docs.aws.amazon.com/AWSSimpleQueueService/latest/SQSDeveloperGuide/sqs-fair-queues.html).
Setting it here, in the one send path, covers ingest's fan-out and the sweeper's re-enqueue (which
re-runs ingest); SQS's own DLQ moves keep a message's group."""

from __future__ import annotations

import hashlib
import json
from typing import TYPE_CHECKING, Any

from botocore.exceptions import ClientError

from ..errors import Throttled
from ..ports import Received
from .errors import translate

if TYPE_CHECKING:
    from ..audit import AuditIntent

#: SQS's SendMessageBatch and ReceiveMessage take at most 10 messages.
SQS_BATCH_MAX = 10
#: A batch send retries the entries SQS refused this many times.
SEND_ATTEMPTS = 5
#: Codes of ChangeMessageVisibility for a receipt that no longer holds the message.
_STALE_RECEIPT = frozenset(
    {
        "ReceiptHandleIsInvalid",
        "MessageNotInflight",
        "AWS.SimpleQueueService.MessageNotInflight",
        "InvalidParameterValue",
    }
)


def message_group(body: str) -> str | None:
    """The fair-queue group of a message: the ``tenant`` its JSON body names, else None (SQS then
    treats the message as its own tenant)."""
    try:
        tenant = json.loads(body).get("tenant")
    except (ValueError, AttributeError):
        return None
    return tenant if isinstance(tenant, str) and tenant else None


def _entry(i: int, body: str) -> dict[str, str]:
    group = message_group(body)
    return {"Id": str(i), "MessageBody": body} | ({"MessageGroupId": group} if group else {})


class SqsQueue:
    def __init__(self, sqs: Any, url: str):
        self._sqs, self.url = sqs, url

    def send(self, bodies: list[str]) -> None:
        """Send in batches of ten, each with its tenant's ``MessageGroupId``; entries SQS refuses
        are retried, then Throttled."""
        for start in range(0, len(bodies), SQS_BATCH_MAX):
            entries = [_entry(i, b) for i, b in enumerate(bodies[start : start + SQS_BATCH_MAX])]
            for _ in range(SEND_ATTEMPTS):
                with translate():
                    resp = self._sqs.send_message_batch(QueueUrl=self.url, Entries=entries)
                failed = {f["Id"] for f in resp.get("Failed", [])}
                entries = [e for e in entries if e["Id"] in failed]
                if not entries:
                    break
            else:
                raise Throttled(f"SQS refused {len(entries)} messages after retries")

    def receive(self, max_messages: int, wait_seconds: int, visibility_seconds: int) -> list[Received]:
        resp = self._sqs.receive_message(
            QueueUrl=self.url,
            MaxNumberOfMessages=max(1, min(SQS_BATCH_MAX, max_messages)),
            WaitTimeSeconds=wait_seconds,
            VisibilityTimeout=visibility_seconds,
            MessageSystemAttributeNames=["ApproximateReceiveCount"],
        )
        return [
            Received(
                m["MessageId"],
                m["ReceiptHandle"],
                m["Body"],
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
            if exc.response.get("Error", {}).get("Code", "") in _STALE_RECEIPT:
                return False
            raise
        return True


class SqsQueues:
    """The port ``Queues``: a queue adapter by URL."""

    def __init__(self, sqs: Any):
        self._sqs = sqs

    def queue(self, url: str) -> SqsQueue:
        return SqsQueue(self._sqs, url)


class SqsAuditLog:
    """The ``AuditLog`` port on the audit queue (FIFO, infra/constructs/audit.py): one message per
    intent, its group the tenant (the appender works on one tenant's intents in order, one batch
    at a time, so a tenant's chain never sees two appenders race), its deduplication id the
    intent's dedupe key (SQS drops a resend within five minutes; the appender's marker keeps the
    chain from holding it twice after that)."""

    def __init__(self, sqs: Any, url: str):
        self._sqs, self.url = sqs, url

    def record(self, intent: AuditIntent) -> None:
        with translate():
            self._sqs.send_message(
                QueueUrl=self.url,
                MessageBody=intent.model_dump_json(),
                MessageGroupId=intent.tenant,
                # At most 128 characters of [A-Za-z0-9] and punctuation: a digest of the key.
                MessageDeduplicationId=hashlib.sha256(intent.dedupe.encode()).hexdigest(),
            )
