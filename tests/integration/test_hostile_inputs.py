"""Hostile batch input through the official SDK and the real ingest handler (issue 10, item 4):
each hostile line fails its batch with the right code, param and line, the errors stay bounded,
and the ingest handler never raises (its queue is empty afterwards, the batch is terminal)."""

import json

import pytest

from functions.core import clients
from tests.integration.batch_helpers import CHAT, executions, line, run_ingest, submit, take_work

#: The README's bounds, written out.
MESSAGE = 500
CUSTOM_ID = 512
DYNAMODB_ITEM = 400 * 1024
EVENTBRIDGE_EVENT = 256 * 1024


def ingest_queue_left() -> int:
    from infra.local.resources import ingest_queue_url
    from tests.conftest import PREFIX

    attrs = clients.client("sqs").get_queue_attributes(
        QueueUrl=ingest_queue_url(clients.client, PREFIX),
        AttributeNames=["ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible"],
    )["Attributes"]
    return int(attrs["ApproximateNumberOfMessages"]) + int(attrs["ApproximateNumberOfMessagesNotVisible"])


def with_fields(i: int, **fields) -> str:
    return json.dumps({**json.loads(line(i)), **fields})


def deep(i: int, depth: int = 5_000) -> str:
    obj = json.loads(line(i))
    text = json.dumps(obj)
    return text[:-1] + ', "nested": ' + "[" * depth + "]" * depth + "}"


def surrogate_in_body(i: int) -> str:
    obj = json.loads(line(i))
    obj["body"]["messages"][0]["content"] = "hi \udc00"
    return json.dumps(obj)


CASES = {
    "deep_nesting": (deep(1), ("invalid_json_line", None)),
    "lone_surrogate_custom_id": (with_fields(1, custom_id="\ud800"), ("invalid_value", "custom_id")),
    "lone_surrogate_in_body": (surrogate_in_body(1), ("invalid_json_line", None)),
    "lone_surrogate_key": (with_fields(1, **{"\udbff": 1}), ("invalid_json_line", None)),
    "custom_id_too_long": (with_fields(1, custom_id="c" * (CUSTOM_ID + 1)), ("invalid_value", "custom_id")),
    "huge_url": (with_fields(1, url="/v1/" + "u" * 400_000), ("invalid_url", "url")),
    "huge_method": (with_fields(1, method="M" * 400_000), ("invalid_method", "method")),
}


def fail_batch(client, content: bytes):
    batch = submit(client, content)
    run_ingest()
    assert ingest_queue_left() == 0  # the handler never raised: nothing left to redeliver
    return client.batches.retrieve(batch.id)


@pytest.mark.parametrize("case", list(CASES))
def test_a_hostile_line_fails_its_batch_with_its_code_and_line(client, deployed, case):
    hostile, (code, param) = CASES[case]
    content = (line(0) + "\n" + hostile + "\n" + line(2) + "\n").encode()
    failed = fail_batch(client, content)
    assert failed.status == "failed" and failed.failed_at is not None
    assert [(e.code, e.param, e.line) for e in failed.errors.data] == [(code, param, 2)]
    assert all(len(e.message) <= MESSAGE for e in failed.errors.data)
    assert take_work(deployed) == [] and executions(deployed) == []


def test_many_huge_echoed_values_keep_the_errors_bounded(client, deployed):
    # each echo today would be 8 KB: 100 of them overflow a DynamoDB item and an event
    lines = [with_fields(i, method="\U0001f4a5" * 2_000) for i in range(150)]
    failed = fail_batch(client, ("\n".join(lines) + "\n").encode())
    assert failed.status == "failed"
    assert [e.line for e in failed.errors.data] == list(range(1, 101))
    assert all(len(e.message) <= MESSAGE for e in failed.errors.data)
    size = len(json.dumps([e.model_dump() for e in failed.errors.data], ensure_ascii=False).encode())
    assert size < EVENTBRIDGE_EVENT < DYNAMODB_ITEM


def test_nul_characters_are_valid_input(client, deployed):
    obj = json.loads(line(0))
    obj["custom_id"] = "a\u0000b"
    obj["body"]["messages"][0]["content"] = "\u0000"
    batch = submit(client, (json.dumps(obj) + "\n" + line(1) + "\n").encode())
    run_ingest()
    assert ingest_queue_left() == 0
    current = client.batches.retrieve(batch.id)
    assert current.status == "in_progress" and current.request_counts.total == 2
    (work,) = take_work(deployed)
    assert (work.first_line, work.line_count) == (1, 2)
