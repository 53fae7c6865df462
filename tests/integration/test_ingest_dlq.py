"""The ingest dead-letter queue has a consumer (docs/lifecycle.md, "Liveness: every batch ends"):
an ingest event that keeps raising (a line whose body nests a few thousand levels deep, say) is
retried for hours and then dead-lettered, and without a consumer its batch would stay validating
forever, and a cancel would leave it cancelling forever. On moto:
the ingest queue redrives after INGEST_MAX_RECEIVES receives, the real handlers run."""

import json

import pytest
from aws_lambda_powertools.utilities.batch.exceptions import BatchProcessingError

from functions.core import clients
from functions.ingest import handler as ingest_handler
from functions.ingest import logic
from functions.ingest_dlq import handler as ingest_dlq_handler
from infra.local.lambda_context import LocalLambdaContext
from infra.local.pollers import drain_queue, sqs_event
from infra.local.resources import ingest_dlq_url, ingest_queue_url
from tests.conftest import PREFIX
from tests.integration.batch_helpers import executions, line, submit, take_work

#: The error a tenant reads: one clear, short error; never internals.
INGEST_FAILED = {
    "code": "ingest_failed",
    "message": "The batch's input file could not be processed. Submit the batch again; "
    "if this keeps happening, check that the file is a valid JSONL batch input.",
    "param": None,
    "line": None,
}


def nested(depth: int) -> str:
    """A request line whose body nests ``depth`` levels deep (valid JSON)."""
    body = "[" * depth + "]" * depth
    return (
        json.dumps(
            {"custom_id": "deep", "method": "POST", "url": "/v1/chat/completions", "body": {"model": "test-chat"}}
        )[:-2]
        + ', "x": '
        + body
        + "}}"
    )


@pytest.fixture
def ingest_always_raises(monkeypatch):
    """Ingest raises on this input whatever it is (as it did on a deeply nested body: RecursionError)."""

    def boom(*_, **__):
        raise RecursionError("maximum recursion depth exceeded while decoding a JSON array")

    monkeypatch.setattr(logic, "validate", boom)


def deliver_until_dead_lettered() -> int:
    """Deliver the ingest queue's messages to the ingest handler, each redelivered at once when it
    fails, until the queue has dead-lettered them; returns how many deliveries failed."""
    sqs, url = clients.client("sqs"), ingest_queue_url(clients.client, PREFIX)
    arn = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
    failures = 0
    for _ in range(50):
        received = sqs.receive_message(
            QueueUrl=url, MaxNumberOfMessages=10, VisibilityTimeout=0, AttributeNames=["All"]
        ).get("Messages", [])
        if not received:
            return failures
        try:
            result = ingest_handler.handler(sqs_event(received, arn), LocalLambdaContext("ingest"))
        except BatchProcessingError:  # every record failed: Lambda retries them all
            failures += len(received)
        else:
            failures += len(result["batchItemFailures"])
    raise AssertionError("the ingest queue never dead-lettered its message")


def run_ingest_dlq() -> int:
    return drain_queue(
        clients.client("sqs"), ingest_dlq_url(clients.client, PREFIX), ingest_dlq_handler.handler, name="ingest-dlq"
    )


def test_a_batch_whose_ingest_always_raises_ends_failed_with_one_clear_error(client, deployed, ingest_always_raises):
    batch = submit(client, (nested(5_000) + "\n" + line(1) + "\n").encode())
    assert deliver_until_dead_lettered() == 5  # INGEST_MAX_RECEIVES, then the redrive
    assert client.batches.retrieve(batch.id).status == "validating"  # the old end of the story
    assert run_ingest_dlq() == 1
    done = client.batches.retrieve(batch.id)
    assert done.status == "failed" and done.failed_at is not None
    assert [e.model_dump() for e in done.errors.data] == [INGEST_FAILED]
    assert "Recursion" not in done.model_dump_json()  # the cause stays in the logs
    assert take_work(deployed) == [] and executions(deployed) == []
    assert run_ingest_dlq() == 0  # consumed: nothing is redelivered


def test_a_batch_cancelled_after_its_ingest_was_dead_lettered_ends_cancelled(client, deployed, ingest_always_raises):
    batch = submit(client, (line(0) + "\n").encode())
    deliver_until_dead_lettered()
    # cancelled after its event was dead-lettered: no ingest event is left to finish the cancel
    assert client.batches.cancel(batch.id).status == "cancelling"
    run_ingest_dlq()
    done = client.batches.retrieve(batch.id)
    assert done.status == "cancelled" and done.cancelled_at is not None
    assert take_work(deployed) == [] and executions(deployed) == []


def test_the_same_dead_letter_twice_ends_the_batch_once(client, deployed, stores, ingest_always_raises):
    batch = submit(client, (line(0) + "\n").encode())
    deliver_until_dead_lettered()
    sqs, url = clients.client("sqs"), ingest_dlq_url(clients.client, PREFIX)
    (message,) = sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10, VisibilityTimeout=0)["Messages"]
    sqs.send_message(QueueUrl=url, MessageBody=message["Body"])  # a duplicate delivery
    assert run_ingest_dlq() == 2
    first = stores.batches.get("acme", batch.id)
    assert first.status == "failed" and first.errors == [INGEST_FAILED]
    sqs.send_message(QueueUrl=url, MessageBody=message["Body"])
    assert run_ingest_dlq() == 1
    assert stores.batches.get("acme", batch.id) == first  # nothing moved (failed_at included)
    assert stores.batches.open_batches() == []  # and it left the open-batch index
