"""Ingest: OpenAI's line validation, chunking into work messages, idempotency, cancel races."""

import json

import pytest

from functions.core import clients, schema
from functions.core.lines import iter_lines
from functions.ingest import logic
from functions.ingest.events import IngestRecord, snapshot_keys
from tests.helpers import with_changes
from tests.integration.batch_helpers import CHAT, executions, line, run_ingest, submit, take_work


def lines_of(content: bytes, start: int, end: int, first: int):
    return [
        l
        for l in iter_lines([content[start:end]], max_line_bytes=10**9, start=start, first_number=first)
        if not l.blank
    ]


@pytest.mark.settings(chunk_max_lines=100)
def test_valid_batch_is_cut_into_chunks_and_fanned_out(client, deployed, stores):
    content = ("\n".join(line(i) for i in range(250)) + "\n").encode()
    batch = submit(client, content)
    assert run_ingest() == 1
    current = client.batches.retrieve(batch.id)
    assert current.status == "in_progress" and current.in_progress_at is not None
    assert current.model == "test-chat" and current.request_counts.total == 250
    work = take_work(deployed)
    # Under 8 full chunks: spread over 8 chunks of ceil(250 / 8) = 32 lines (docs/lifecycle.md, "Live progress").
    assert [(m.chunk, m.line_count, m.first_line) for m in work] == [(i, 32, 1 + 32 * i) for i in range(7)] + [
        (7, 26, 225)
    ]
    seen = []
    for m in work:
        assert m.batch_id == batch.id and m.tenant == "acme" and m.endpoint == CHAT and m.model == "test-chat"
        assert m.input_key == schema.batch_input_key("acme", batch.id) and m.expires_at == batch.expires_at
        got = lines_of(content, m.byte_start, m.byte_end, m.first_line)
        assert len(got) == m.line_count
        seen += [json.loads(l.text)["custom_id"] for l in got]
    assert seen == [f"req-{i}" for i in range(250)]
    assert work[-1].byte_end == len(content)
    (execution,) = executions(deployed)
    assert execution["name"] == batch.id


def test_same_event_twice_changes_nothing(client, deployed, stores):
    batch = submit(client, (line(0) + "\n" + line(1) + "\n").encode())
    sqs = clients.client("sqs")
    from infra.local.resources import ingest_queue_url
    from tests.conftest import PREFIX

    url = ingest_queue_url(clients.client, PREFIX)
    (message,) = sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10)["Messages"]
    sqs.send_message(QueueUrl=url, MessageBody=message["Body"])  # a duplicate delivery
    sqs.change_message_visibility(QueueUrl=url, ReceiptHandle=message["ReceiptHandle"], VisibilityTimeout=0)
    assert run_ingest() == 2
    before = client.batches.retrieve(batch.id)
    assert run_ingest() == 0
    assert len(take_work(deployed)) == 1
    assert len(executions(deployed)) == 1
    assert client.batches.retrieve(batch.id) == before
    # and a third delivery, after everything happened, still changes nothing
    sqs.send_message(QueueUrl=url, MessageBody=message["Body"])
    assert run_ingest() == 1
    assert take_work(deployed) == [] and len(executions(deployed)) == 1
    assert client.batches.retrieve(batch.id) == before


@pytest.mark.settings(chunk_max_bytes=600, chunk_max_lines=1000)
def test_chunks_are_bounded_by_bytes_and_never_split_a_line(client, deployed):
    lines = [line(i) for i in range(20)] + [line(99, padding="x" * 2000)] + [line(i) for i in range(100, 105)]
    content = ("\n".join(lines) + "\n").encode()
    submit(client, content)
    run_ingest()
    work = take_work(deployed)
    total = 0
    for m in work:
        got = lines_of(content, m.byte_start, m.byte_end, m.first_line)
        assert len(got) == m.line_count >= 1
        assert m.byte_end - m.byte_start <= 600 or m.line_count == 1  # an oversized line rides alone
        assert content[m.byte_start - 1 : m.byte_start] in (b"", b"\n")  # starts at a line start
        assert content[m.byte_end - 1 : m.byte_end] == b"\n"
        total += m.line_count
    assert total == 26
    assert any(m.line_count == 1 and m.byte_end - m.byte_start > 2000 for m in work)


def test_bom_crlf_and_blank_lines(client, deployed):
    content = (
        b"\xef\xbb\xbf"
        + b"\r\n".join([line(0).encode(), b"", b"   ", line(1).encode(), line(2).encode()])
        + b"\r\n\r\n"
    )
    batch = submit(client, content)
    run_ingest()
    current = client.batches.retrieve(batch.id)
    assert current.status == "in_progress" and current.request_counts.total == 3
    (m,) = take_work(deployed)
    assert (m.first_line, m.line_count, m.byte_start) == (1, 3, 0)
    assert [json.loads(l.text)["custom_id"] for l in lines_of(content, m.byte_start, m.byte_end, 1)] == [
        "req-0",
        "req-1",
        "req-2",
    ]


def bad(i, **changes):
    return json.dumps(with_changes(json.loads(line(i)), changes))


def body_without_model(i):
    obj = json.loads(line(i))
    del obj["body"]["model"]
    return json.dumps(obj)


@pytest.mark.parametrize(
    ("lines", "expected"),
    [
        ([line(0), "{not json", line(2)], [("invalid_json_line", 2, None)]),
        ([line(0), "[1, 2]"], [("invalid_json_line", 2, None)]),
        ([bad(0, custom_id=None)], [("missing_required_parameter", 1, "custom_id")]),
        ([bad(0, custom_id=7)], [("invalid_value", 1, "custom_id")]),
        ([line(0), line(1), line(0)], [("duplicate_custom_id", 3, "custom_id")]),
        ([line(0), bad(1, method="GET")], [("invalid_method", 2, "method")]),
        ([line(0), bad(1, url="/v1/embeddings")], [("invalid_url", 2, "url")]),
        ([line(0), body_without_model(1)], [("missing_required_parameter", 2, "body.model")]),
        ([line(0), bad(1, body=None)], [("missing_required_parameter", 2, "body")]),
        ([line(0), line(1, model="test-embed")], [("mismatched_model", 2, "body.model")]),
        ([line(0, model="gpt-4o")], [("model_not_found", 1, "body.model")]),
        ([line(0, model="test-embed")], [("model_not_found", 1, "body.model")]),  # not served for chat
        ([line(0), bad(1, body_stream=True)], [("invalid_value", 2, "body.stream")]),
        ([line(0), "", bad(2, method="PUT"), "{"], [("invalid_method", 3, "method"), ("invalid_json_line", 4, None)]),
        (["", "  "], [("empty_file", None, None)]),
    ],
)
def test_validation_errors_fail_the_batch_with_line_numbers(client, deployed, lines, expected):
    batch = submit(client, ("\n".join(lines) + "\n").encode())
    run_ingest()
    failed = client.batches.retrieve(batch.id)
    assert failed.status == "failed" and failed.failed_at is not None and failed.in_progress_at is None
    assert [(e.code, e.line, e.param) for e in failed.errors.data] == expected
    assert all(e.message for e in failed.errors.data)
    assert failed.errors.object == "list"
    assert take_work(deployed) == [] and executions(deployed) == []


def test_non_utf8_line(client, deployed):
    content = line(0).encode() + b"\n" + b'{"custom_id": "\xff\xfe"}\n'
    batch = submit(client, content)
    run_ingest()
    assert [(e.code, e.line) for e in client.batches.retrieve(batch.id).errors.data] == [("invalid_json_line", 2)]


@pytest.mark.settings(max_line_bytes=200)
def test_line_over_the_size_limit(client, deployed):
    batch = submit(client, (line(0) + "\n" + line(1, padding="y" * 300) + "\n").encode())
    run_ingest()
    assert [(e.code, e.line) for e in client.batches.retrieve(batch.id).errors.data] == [("line_too_large", 2)]


@pytest.mark.settings(max_batch_lines=3)
def test_too_many_requests(client, deployed):
    batch = submit(client, ("\n".join(line(i) for i in range(5)) + "\n").encode())
    run_ingest()
    assert [(e.code, e.line) for e in client.batches.retrieve(batch.id).errors.data] == [("too_many_tasks", 4)]


def test_cancelled_while_validating_is_never_enqueued(client, deployed):
    batch = submit(client, (line(0) + "\n").encode())
    client.batches.cancel(batch.id)
    run_ingest()
    done = client.batches.retrieve(batch.id)
    assert done.status == "cancelled" and done.cancelled_at is not None and done.in_progress_at is None
    assert take_work(deployed) == [] and executions(deployed) == []


def test_crash_between_state_change_and_fan_out_is_resumed(client, deployed, stores, settings, monkeypatch):
    batch = submit(client, ("\n".join(line(i) for i in range(3)) + "\n").encode())

    class DeadQueue:
        def send(self, *_, **__):
            raise ConnectionError("died")

    monkeypatch.setattr(stores.queues, "queue", lambda url: DeadQueue())
    with pytest.raises(ConnectionError):
        logic.ingest(stores, deployed, "acme", batch.id, now=batch.created_at)
    assert client.batches.retrieve(batch.id).status == "in_progress"
    monkeypatch.undo()
    logic.ingest(stores, deployed, "acme", batch.id, now=batch.created_at)
    assert len(take_work(deployed)) == 1 and len(executions(deployed)) == 1
    assert stores.batches.get("acme", batch.id).enqueued


def test_missing_record_is_retried_not_dropped(stores, deployed):
    with pytest.raises(logic.BatchNotVisibleYet):
        logic.ingest(stores, deployed, "acme", "batch_01m8n7xjx1bekcr5r3de2q3dfv", now=0, attempts=2)


def test_only_snapshot_created_events_are_ingested():
    def body(name: str, key: str) -> str:
        """An S3 notification as S3 sends it (URL-encoded key)."""
        return json.dumps(
            {
                "Records": [
                    {
                        "eventVersion": "2.1",
                        "eventSource": "aws:s3",
                        "awsRegion": "us-east-1",
                        "eventTime": "2026-01-01T00:00:00.000Z",
                        "eventName": name,
                        "userIdentity": {"principalId": "AWS:X"},
                        "requestParameters": {"sourceIPAddress": "127.0.0.1"},
                        "responseElements": {"x-amz-request-id": "1", "x-amz-id-2": "2"},
                        "s3": {
                            "s3SchemaVersion": "1.0",
                            "configurationId": "c",
                            "bucket": {"name": "b", "ownerIdentity": {"principalId": "X"}, "arn": "arn:aws:s3:::b"},
                            "object": {"key": key, "size": 10, "eTag": "e", "sequencer": "1"},
                        },
                    }
                ]
            }
        )

    def keys(body: str) -> list[str]:
        record = IngestRecord.model_validate(
            {
                "messageId": "m",
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
                "eventSourceARN": "arn:aws:sqs:us-east-1:1:q",
                "awsRegion": "us-east-1",
            }
        )
        return snapshot_keys(record.body)

    def event(key, name="ObjectCreated:Put"):
        return body(name, key)

    assert keys(json.dumps({"Service": "Amazon S3", "Event": "s3:TestEvent", "Time": "t", "Bucket": "b"})) == []
    assert keys(event("batches/acme/batch_1/input.jsonl")) == ["batches/acme/batch_1/input.jsonl"]
    assert keys(event("batches/acme%2Bco/batch_1/input.jsonl")) == ["batches/acme+co/batch_1/input.jsonl"]
    assert keys(event("batches/acme/batch_1/parts/000001.out.jsonl")) == []
    assert keys(event("batches/acme/batch_1/input.jsonl", "ObjectRemoved:Delete")) == []


def test_a_record_that_fails_is_reported_for_redelivery_and_the_others_are_not(client, deployed, stores, monkeypatch):
    """Through the real handler: the event of a batch whose record is not visible (yet), and the
    event of a batch whose workflow start is throttled, come back in batchItemFailures (SQS
    redelivers them); the batch beside them is ingested; the redelivery resumes the throttled one."""
    from functions.core.errors import Throttled
    from functions.ingest import handler as ingest_handler
    from infra.local.lambda_context import LocalLambdaContext
    from infra.local.pollers import sqs_event
    from infra.local.resources import ingest_queue_url
    from tests.conftest import PREFIX

    sqs, url = clients.client("sqs"), ingest_queue_url(clients.client, PREFIX)
    ok = submit(client, (line(0) + "\n").encode())
    throttled = submit(client, (line(0) + "\n").encode())
    bodies = [
        m["Body"] for m in sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10, VisibilityTimeout=0)["Messages"]
    ]
    ghost = "batch_01m8n7xjx1bekcr5r3de2q3dfv"
    sqs.send_message(QueueUrl=url, MessageBody=bodies[0].replace(ok.id, ghost).replace(throttled.id, ghost))
    received = sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10, AttributeNames=["All"])["Messages"]
    assert len(received) == 3
    arn = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
    by_batch = {next(b for b in (ok.id, throttled.id, ghost) if b in m["Body"]): m["MessageId"] for m in received}

    real_start = stores.workflows.start

    def start(name, payload):
        if name == throttled.id:
            raise Throttled("Rate exceeded")
        return real_start(name, payload)

    monkeypatch.setattr(ingest_handler, "RECORD_ATTEMPTS", 1)
    monkeypatch.setattr(stores.workflows, "start", start)
    result = ingest_handler.handler(sqs_event(received, arn), LocalLambdaContext("ingest"))
    failed = {f["itemIdentifier"] for f in result["batchItemFailures"]}
    assert failed == {by_batch[ghost], by_batch[throttled.id]}
    assert stores.batches.get("acme", ok.id).enqueued
    assert not stores.batches.get("acme", throttled.id).enqueued

    monkeypatch.setattr(stores.workflows, "start", real_start)  # the throttling passed
    again = [m for m in received if m["MessageId"] in failed]
    result = ingest_handler.handler(sqs_event(again, arn), LocalLambdaContext("ingest"))
    assert [f["itemIdentifier"] for f in result["batchItemFailures"]] == [by_batch[ghost]]
    assert stores.batches.get("acme", throttled.id).enqueued
    assert sorted(e["name"] for e in executions(deployed)) == sorted([ok.id, throttled.id])
