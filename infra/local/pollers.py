"""SQS -> Lambda, as an event source mapping does it: receive up to 10 messages, hand them to the
handler as one SQS event, delete the ones not reported in ``batchItemFailures`` (those, and all of
them if the handler raises, become visible again after the visibility timeout)."""

import logging
import threading
from collections.abc import Callable
from typing import Any

from .lambda_context import LocalLambdaContext

log = logging.getLogger("infra.local.pollers")

Handler = Callable[[dict[str, Any], Any], Any]


def sqs_event(messages: list[dict[str, Any]], queue_arn: str) -> dict[str, Any]:
    return {
        "Records": [
            {
                "messageId": m["MessageId"],
                "receiptHandle": m["ReceiptHandle"],
                "body": m["Body"],
                "attributes": m.get("Attributes", {}),
                "messageAttributes": m.get("MessageAttributes", {}),
                "md5OfBody": m.get("MD5OfBody", ""),
                "eventSource": "aws:sqs",
                "eventSourceARN": queue_arn,
                "awsRegion": queue_arn.split(":")[3] if queue_arn.count(":") >= 3 else "us-east-1",
            }
            for m in messages
        ]
    }


def queue_arn_of(sqs: Any, queue_url: str) -> str:
    return sqs.get_queue_attributes(QueueUrl=queue_url, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]


def poll_once(
    sqs: Any, queue_url: str, handler: Handler, *, name: str, wait_seconds: int = 0, queue_arn: str | None = None
) -> int:
    """One receive + invoke + delete round; returns how many messages were handled successfully.
    The receive is a long poll of ``wait_seconds``: it returns as soon as a message arrives (moto
    wakes its waiting receives on send, as SQS does), so a poller adds no wait to a message's way;
    ``queue_arn`` (else read per round) saves a request on that way."""
    received = sqs.receive_message(
        QueueUrl=queue_url, MaxNumberOfMessages=10, WaitTimeSeconds=wait_seconds, AttributeNames=["All"]
    ).get("Messages", [])
    if not received:
        return 0
    queue_arn = queue_arn or queue_arn_of(sqs, queue_url)
    try:
        result = handler(sqs_event(received, queue_arn), LocalLambdaContext(name)) or {}
    except Exception:
        log.exception("%s handler failed; %d messages will be retried", name, len(received))
        return 0
    failed = {f["itemIdentifier"] for f in result.get("batchItemFailures", [])}
    done = [m for m in received if m["MessageId"] not in failed]
    if done:
        sqs.delete_message_batch(
            QueueUrl=queue_url,
            Entries=[{"Id": str(i), "ReceiptHandle": m["ReceiptHandle"]} for i, m in enumerate(done)],
        )
    return len(done)


def drain_queue(sqs: Any, queue_url: str, handler: Handler, *, name: str) -> int:
    """Handle messages until a round handles none (tests use this instead of a thread)."""
    total = 0
    while handled := poll_once(sqs, queue_url, handler, name=name):
        total += handled
    return total


#: A poller's long-poll wait. moto returns a waiting receive as soon as a message is sent, so the
#: wait costs a message no time; a longer one costs fewer empty receives (six pollers at 1 s
#: were most of the idle deployment's CPU). Stopping does not wait for a receive in progress.
POLL_WAIT_SECONDS = 10
#: How long a stop waits for a handler in progress (an ingest of a large batch may take this long).
STOP_HANDLER_SECONDS = 30


class Poller:
    """Background threads long-polling one queue into one handler (a local component): one by
    default; ``threads`` run that many receive-and-invoke rounds at once, as an event source
    mapping runs concurrent invocations (the webhook queue's: a slow receiver in one round does
    not hold up the next message)."""

    def __init__(
        self,
        name: str,
        sqs_factory: Callable[[], Any],
        queue_url: Callable[[], str],
        handler: Handler,
        *,
        threads: int = 1,
    ):
        self.name = name
        self._sqs_factory, self._queue_url, self._handler = sqs_factory, queue_url, handler
        self._threads_wanted = threads
        self._stop = threading.Event()
        #: Per thread, set while it runs the handler (not while it waits in a receive).
        self._handling: list[threading.Event] = []
        self._threads: list[threading.Thread] = []

    def start(self) -> None:
        self._stop.clear()
        sqs, url = self._sqs_factory(), self._queue_url()
        arn = queue_arn_of(sqs, url)

        def run(handling: threading.Event) -> None:
            def handle(event: dict[str, Any], context: Any) -> Any:
                handling.set()
                return self._handler(event, context)

            while not self._stop.is_set():
                try:
                    handling.clear()
                    poll_once(sqs, url, handle, name=self.name, wait_seconds=POLL_WAIT_SECONDS, queue_arn=arn)
                except Exception:
                    if self._stop.is_set():
                        return  # moto stopped under a receive in progress: the deployment is stopping
                    log.exception("%s poller error", self.name)
                    self._stop.wait(1.0)

        self._handling = [threading.Event() for _ in range(self._threads_wanted)]
        many = self._threads_wanted > 1
        self._threads = [
            threading.Thread(
                target=run, args=(handling,), name=f"poller-{self.name}" + (f"-{i}" if many else ""), daemon=True
            )
            for i, handling in enumerate(self._handling)
        ]
        for thread in self._threads:
            thread.start()

    def stop(self) -> None:
        """Ask the threads to stop. A handler in progress is waited for (its messages then end as
        they would); a thread waiting in a receive is not (a daemon thread: a receive cut short by
        moto's stop ends it quietly), so six idle pollers stop at once, not 0.5 s each."""
        self._stop.set()
        for thread, handling in zip(self._threads, self._handling, strict=True):
            if handling.is_set():
                thread.join(timeout=STOP_HANDLER_SECONDS)
        self._threads, self._handling = [], []
