"""Fair share on the work queues (docs/governance.md, "Fair share"): the SQS adapter sends each message with its
tenant as ``MessageGroupId``, and the local stand-in (infra/local/fair_queues.py) receives from a
standard queue as SQS fair queues do: a tenant with fewer messages in flight first."""

import json
from collections.abc import Iterator

import boto3
import pytest
from moto import mock_aws

from functions.core.aws.sqs import SqsQueue, message_group
from infra.local import fair_queues


def body(tenant: str, i: int) -> str:
    return json.dumps({"tenant": tenant, "chunk": i})


@pytest.fixture
def queue() -> Iterator[tuple[object, SqsQueue]]:
    with mock_aws():
        sqs = boto3.client("sqs", region_name="us-east-1")
        url = sqs.create_queue(QueueName="work")["QueueUrl"]
        yield sqs, SqsQueue(sqs, url)
    fair_queues.install(False)


def test_each_message_carries_its_tenant_as_message_group(queue) -> None:
    sqs, q = queue
    q.send([body("acme", 0), body("zeta", 1), "not json"])
    got = sqs.receive_message(QueueUrl=q.url, MaxNumberOfMessages=10, MessageSystemAttributeNames=["MessageGroupId"])
    groups = {
        json.loads(m["Body"]).get("tenant") if m["Body"] != "not json" else None: m.get("Attributes", {}).get(
            "MessageGroupId"
        )
        for m in got["Messages"]
    }
    assert groups == {"acme": "acme", "zeta": "zeta", None: None}


def test_message_group_is_the_tenant_or_none() -> None:
    assert message_group(body("acme", 1)) == "acme"
    assert message_group('{"tenant": ""}') is None
    assert message_group("[1, 2]") is None
    assert message_group("{") is None


def _giant_then_small(q: SqsQueue) -> list[str]:
    """A sends 30 chunks and a worker takes 10 of them (in flight); then B sends 2. Who comes next?"""
    q.send([body("a", i) for i in range(30)])
    first = q.receive(10, 0, 300)
    assert {json.loads(r.body)["tenant"] for r in first} == {"a"}
    q.send([body("b", i) for i in range(2)])
    return [json.loads(r.body)["tenant"] for r in q.receive(3, 0, 300)]


def test_fair_queue_serves_the_quiet_tenant_first(queue) -> None:
    fair_queues.install(True)
    assert _giant_then_small(queue[1]) == ["b", "b", "a"]


def test_without_the_emulation_moto_serves_by_arrival(queue) -> None:
    """What moto itself does with MessageGroupId on a standard queue: nothing (the reason for the emulation)."""
    fair_queues.install(False)
    assert _giant_then_small(queue[1]) == ["a", "a", "a"]


def test_fair_order_is_stable_within_a_count() -> None:
    class M:
        def __init__(self, group: str | None, n: int):
            self.group_id, self.n = group, n

    ms = [M("a", 0), M("b", 1), M(None, 2), M("a", 3), M("c", 4)]
    from collections import Counter

    assert [m.n for m in fair_queues.fair_order(ms, Counter({"a": 5, "b": 1}))] == [2, 4, 1, 0, 3]
