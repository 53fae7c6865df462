"""The ingest dead-letter consumer against the in-memory ports: each state a dead-lettered ingest
event can leave a batch in, ended or resumed; duplicates; faults; and the handler's parsing."""

import json

import pytest

from functions.core import lifecycle, schema
from functions.core.errors import Throttled
from functions.core.messages import WorkMessage
from functions.core.records import BatchRecord
from functions.core.settings import ModelRoute, Settings
from functions.ingest import logic
from functions.ingest_dlq import logic as ingest_dlq
from tests.builders import assert_fields, batch_record, cut, put_manifest
from tests.fakes.aws import fake_stores, throttle

CHAT = "/v1/chat/completions"
QUEUE = "https://sqs.local/work-chat"
NOW = 50_000
SETTINGS = Settings(table_name="t", bucket_name="b", models={"chat": ModelRoute(endpoints=(CHAT,), queue_url=QUEUE)})
#: What a tenant reads: one short error, no internals.
EXPECTED_ERROR = {
    "code": "ingest_failed",
    "message": "The batch's input file could not be processed. Submit the batch again; "
    "if this keeps happening, check that the file is a valid JSONL batch input.",
    "param": None,
    "line": None,
}


def setup(**over):
    stores = fake_stores()
    key = schema.batch_input_key("acme", "batch_1")
    row = json.dumps({"custom_id": "req-0", "method": "POST", "url": CHAT, "body": {"model": "chat"}}).encode() + b"\n"
    stores.objects.put(key, row)
    put_manifest(stores, cut([row], 1))
    stores.batches.put(batch_record(**{"created_at": NOW - 20_000, **over}))
    return stores


def handle(stores):
    return ingest_dlq.handle_dead_letter(stores, SETTINGS, "acme", "batch_1", now=NOW)


def current(stores) -> BatchRecord:
    return stores.batches.get("acme", "batch_1")


def test_a_validating_batch_whose_ingest_was_dead_lettered_fails_with_one_clear_error():
    stores = setup()
    assert handle(stores) == "failed"
    batch = current(stores)
    assert_fields(batch, status="failed", failed_at=NOW, errors=[EXPECTED_ERROR])
    assert len(EXPECTED_ERROR["message"]) < 200
    assert stores.events.types() == ["batch.failed"]
    (_, detail) = stores.events.published[0]
    assert detail["id"] == "batch_1" and detail["status"] == "failed"


def test_the_same_dead_letter_delivered_twice_changes_nothing_more():
    stores = setup()
    handle(stores)
    before = current(stores)
    assert ingest_dlq.handle_dead_letter(stores, SETTINGS, "acme", "batch_1", now=NOW + 60) == "failed"
    assert current(stores) == before  # failed_at not moved
    assert stores.events.types() == ["batch.failed"]  # published once


def test_a_batch_cancelled_before_it_started_ends_cancelled():
    stores = setup(status="cancelling", cancelling_at=NOW - 100)
    assert handle(stores) == "cancelled"
    assert_fields(current(stores), status="cancelled", cancelled_at=NOW)
    assert stores.events.types() == ["batch.cancelled"]
    assert stores.workflows.started == {} and stores.queues.queue(QUEUE).bodies() == []


def test_a_validated_batch_not_enqueued_is_fanned_out_and_started_once_more():
    stores = setup(status="in_progress", in_progress_at=NOW - 50, model="chat", total=1, chunk_count=1, accepting=True)
    assert handle(stores) == "in_progress"
    assert current(stores).enqueued
    (message,) = [WorkMessage.model_validate_json(b) for b in stores.queues.queue(QUEUE).bodies()]
    assert (message.batch_id, message.chunk) == ("batch_1", 0)
    assert list(stores.workflows.started) == ["batch_1"]


def test_a_cancelling_batch_not_enqueued_starts_its_workflow_without_work():
    stores = setup(status="cancelling", in_progress_at=NOW - 50, cancelling_at=NOW - 40, model="chat", chunk_count=1)
    handle(stores)
    assert current(stores).enqueued and list(stores.workflows.started) == ["batch_1"]
    assert stores.queues.queue(QUEUE).bodies() == []


def test_a_start_that_still_fails_is_left_to_the_sweeper_and_the_message_is_done():
    stores = setup(status="in_progress", in_progress_at=NOW - 50, model="chat", chunk_count=1, accepting=True)
    stores.faults.fail("workflows.start", throttle())
    assert handle(stores) == "in_progress"  # no raise: the message is not redelivered for this
    assert not current(stores).enqueued and stores.workflows.started == {}


@pytest.mark.parametrize(
    "over",
    [
        dict(status="in_progress", in_progress_at=NOW - 50, model="chat", chunk_count=1, enqueued=True),
        dict(status="completed", completed_at=NOW - 5),
        dict(status="failed", failed_at=NOW - 5, errors=[{"code": "x", "message": "y", "param": None, "line": 1}]),
    ],
)
def test_an_enqueued_or_terminal_batch_is_left_alone(over):
    stores = setup(**over)
    before = current(stores)
    handle(stores)
    assert current(stores) == before
    assert stores.events.published == [] and stores.workflows.started == {}
    assert stores.queues.queue(QUEUE).bodies() == []


def test_a_batch_that_does_not_exist_is_reported_missing():
    stores = fake_stores()
    assert ingest_dlq.handle_dead_letter(stores, SETTINGS, "acme", "nope", now=NOW) == ingest_dlq.MISSING


def test_a_store_error_reading_the_batch_propagates_so_the_message_is_redelivered():
    stores = setup()
    stores.faults.fail("batches.get", throttle())
    with pytest.raises(Throttled):
        handle(stores)
    assert handle(stores) == "failed"


def test_failing_a_stale_validating_record_never_overwrites_a_batch_ingest_moved_on():
    stores = setup()
    stale = current(stores)
    stores.batches.transition("acme", "batch_1", lifecycle.start(NOW, values={}))
    assert logic.fail_validating(stores, stale, NOW).status == "in_progress"
    assert current(stores).errors is None and stores.events.published == []


# --- the handler: a dead-lettered S3 notification -------------------------------------------------
def sqs_record(body: str) -> dict:
    return {
        "messageId": "m-1",
        "receiptHandle": "r",
        "body": body,
        "md5OfBody": "",
        "attributes": {
            "ApproximateReceiveCount": "1",
            "SentTimestamp": "0",
            "SenderId": "s",
            "ApproximateFirstReceiveTimestamp": "0",
        },
        "messageAttributes": {},
        "eventSource": "aws:sqs",
        "eventSourceARN": "arn:aws:sqs:us-east-1:1:q-dlq",
        "awsRegion": "us-east-1",
    }


def notification(key: str) -> str:
    return json.dumps(
        {
            "Records": [
                {
                    "eventVersion": "2.1",
                    "eventSource": "aws:s3",
                    "awsRegion": "us-east-1",
                    "eventTime": "2026-01-01T00:00:00.000Z",
                    "eventName": "ObjectCreated:Copy",
                    "s3": {
                        "s3SchemaVersion": "1.0",
                        "configurationId": "c",
                        "bucket": {"name": "b", "arn": "arn:aws:s3:::b"},
                        "object": {"key": key, "size": 10, "eTag": "e", "sequencer": "1"},
                    },
                }
            ]
        }
    )


def test_the_handler_ends_the_batch_a_dead_lettered_notification_names_and_drops_garbage(monkeypatch):
    from functions.core import deps
    from functions.ingest_dlq import handler as ingest_dlq_handler
    from infra.local.lambda_context import LocalLambdaContext

    stores = setup()
    monkeypatch.setattr(deps, "stores", lambda: stores)
    monkeypatch.setattr(deps, "settings", lambda: SETTINGS)
    deps.use_clock(lambda: NOW)
    try:
        event = {
            "Records": [
                sqs_record(notification("batches/acme/batch_1/input.jsonl")),
                {**sqs_record("{not json"), "messageId": "m-2"},
            ]
        }
        assert ingest_dlq_handler.handler(event, LocalLambdaContext("ingest-dlq")) == {"batchItemFailures": []}
    finally:
        deps.use_clock(None)
    assert current(stores).status == "failed" and current(stores).errors == [EXPECTED_ERROR]
