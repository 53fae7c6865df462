"""Transient DynamoDB faults on moto, retried where they occur: the adapter (``dynamodb.Table``)
retries a write or transaction DynamoDB refused because the item was busy, so the counting
transaction on the busy batch item counts its chunk (and the worker never runs it again), and the
workflow's register does not fail the batch.

``AwsFaults`` makes the next calls of an operation answer with the error shapes DynamoDB sends
(``TransactionConflictException``; ``TransactionCanceledException`` with ``CancellationReasons``)
before the request leaves botocore: botocore's own retries are not involved, as when they have
given up or (for conflicts) never retry. The adapter's sleep is injected: nothing waits."""

from __future__ import annotations

import dataclasses
from collections import Counter, defaultdict
from types import SimpleNamespace
from typing import Any

import boto3
import pytest

from functions.core.aws.dynamodb import Table
from functions.core.aws.repos import BatchRepo
from functions.core.errors import Throttled, TransactionConflict
from functions.core.lifecycle import Change
from functions.core.ports import Stores
from functions.core.records import BatchRecord, ChunkRecord
from functions.core.settings import Settings
from functions.workflow import logic
from tests.builders import batch_record
from tests.fakes.engine import InProcessEngine
from tests.integration.batch_helpers import line, run_ingest, submit, take_work
from tests.integration.worker.harness import run_one_chunk


def conflict() -> dict[str, Any]:
    """DynamoDB's answer to a single-item write on an item a transaction holds."""
    return {
        "Error": {"Code": "TransactionConflictException", "Message": "Transaction is ongoing for the item"},
        "message": "Transaction is ongoing for the item",
    }


def cancelled(*reasons: str) -> dict[str, Any]:
    """DynamoDB's answer to a TransactWriteItems it cancelled, with one reason per item."""
    listed = ", ".join(reasons)
    return {
        "Error": {
            "Code": "TransactionCanceledException",
            "Message": f"Transaction cancelled, please refer cancellation reasons for specific reasons [{listed}]",
        },
        "Message": f"Transaction cancelled, please refer cancellation reasons for specific reasons [{listed}]",
        "CancellationReasons": [
            {"Code": r, **({"Message": "Transaction is ongoing for the item"} if r == "TransactionConflict" else {})}
            for r in reasons
        ],
    }


def conflicted_transaction() -> dict[str, Any]:
    return cancelled("None", "TransactionConflict")


class AwsFaults:
    """The next calls of an operation of ``client`` answer with scripted AWS errors (HTTP 400),
    parsed into botocore's modeled exceptions as real answers are. Counts every call."""

    def __init__(self, client: Any):
        self.client = client
        self.plan: dict[str, list[dict[str, Any]]] = defaultdict(list)
        self.calls: Counter[str] = Counter()
        client.meta.events.register("before-call.dynamodb", self._before_call)

    def fail(self, operation: str, error: dict[str, Any], times: int = 1) -> None:
        self.plan[operation].extend([error] * times)

    def _before_call(self, model: Any, **_: Any) -> Any:
        self.calls[model.name] += 1
        if self.plan[model.name]:
            parsed = {**self.plan[model.name].pop(0), "ResponseMetadata": {"HTTPStatusCode": 400}}
            return SimpleNamespace(status_code=400, headers={}, content=b""), parsed
        return None


@dataclasses.dataclass
class Faulty:
    """Stores whose batches sit on a table with scripted faults and a recorded (not slept) backoff."""

    stores: Stores
    faults: AwsFaults
    sleeps: list[float]


def faulty_stores(stores: Stores, settings: Settings, **table: Any) -> Faulty:
    resource = boto3.resource("dynamodb", region_name="us-east-1").Table(settings.table_name)
    sleeps: list[float] = []
    faults = AwsFaults(resource.meta.client)
    batches = BatchRepo(Table(resource, sleep=sleeps.append, **table))
    return Faulty(dataclasses.replace(stores, batches=batches), faults, sleeps)


@pytest.fixture
def faulty(stores: Stores, deployed: Settings) -> Faulty:
    return faulty_stores(stores, deployed)


def new_batch(**over: Any) -> BatchRecord:
    fields = dict(id="batch_f1", expires_at=200, status="in_progress", model="m", chunk_count=3, accepting=True)
    return batch_record(**{**fields, **over})


def marker(chunk: int) -> ChunkRecord:
    return ChunkRecord(
        tenant="acme",
        batch_id="batch_f1",
        chunk=chunk,
        attempt="a",
        completed=2,
        failed=1,
        input_tokens=7,
        recorded_at=1,
        expires_at=10**10,
    )


@pytest.mark.parametrize(
    "fault",
    [conflicted_transaction(), cancelled("TransactionConflict", "None"), conflict()],
    ids=["cancelled-marker-free", "cancelled-marker-busy", "conflict"],
)
def test_counting_a_chunk_retries_a_conflicted_transaction(faulty: Faulty, fault):
    faulty.stores.batches.create(new_batch())
    faulty.faults.fail("TransactWriteItems", fault, times=2)
    assert faulty.stores.batches.count_chunk(marker(0))  # counted, no error
    assert faulty.faults.calls["TransactWriteItems"] == 3 and len(faulty.sleeps) == 2
    batch = faulty.stores.batches.get("acme", "batch_f1")
    assert (batch.chunks_done, batch.completed, batch.failed, batch.input_tokens) == (1, 2, 1, 7)  # once
    assert faulty.stores.batches.counted_chunk("acme", "batch_f1", 0) is not None


def test_a_conflict_that_outlasts_the_attempts_counts_nothing_and_a_retry_counts_once(stores, deployed):
    faulty = faulty_stores(stores, deployed, attempts=3)
    faulty.stores.batches.create(new_batch())
    faulty.faults.fail("TransactWriteItems", conflicted_transaction(), times=3)
    with pytest.raises(TransactionConflict):
        faulty.stores.batches.count_chunk(marker(0))
    assert faulty.faults.calls["TransactWriteItems"] == 3 and len(faulty.sleeps) == 2
    assert faulty.stores.batches.get("acme", "batch_f1").chunks_done == 0
    assert faulty.stores.batches.counted_chunk("acme", "batch_f1", 0) is None
    assert faulty.stores.batches.count_chunk(marker(0))
    assert faulty.stores.batches.get("acme", "batch_f1").chunks_done == 1


def test_a_transaction_cancelled_by_its_condition_is_not_retried(faulty: Faulty):
    faulty.stores.batches.create(new_batch(accepting=False))
    assert not faulty.stores.batches.count_chunk(marker(0))  # moto's own ConditionalCheckFailed
    faulty.faults.fail("TransactWriteItems", cancelled("TransactionConflict", "ConditionalCheckFailed"))
    assert not faulty.stores.batches.count_chunk(marker(1))  # a condition failed: nothing to retry
    assert faulty.faults.calls["TransactWriteItems"] == 2 and faulty.sleeps == []
    assert faulty.stores.batches.counted_chunks("acme", "batch_f1") == {}


def test_a_conditional_update_retries_a_conflict_and_applies_once(faulty: Faulty):
    faulty.stores.batches.create(new_batch())
    faulty.faults.fail("UpdateItem", conflict(), times=2)
    updated = faulty.stores.batches.transition(
        "acme", "batch_f1", Change(add={"completed": 3}, expect={"status": "in_progress"})
    )
    assert updated.completed == 3 and faulty.faults.calls["UpdateItem"] == 3 and len(faulty.sleeps) == 2


def test_throttling_botocore_gave_up_on_is_retried_then_throttled(stores, deployed):
    faulty = faulty_stores(stores, deployed, attempts=2)
    faulty.stores.batches.create(new_batch())
    throttled = {"Error": {"Code": "ProvisionedThroughputExceededException", "Message": "Rate exceeded"}}
    faulty.faults.fail("GetItem", throttled)
    assert faulty.stores.batches.get("acme", "batch_f1").id == "batch_f1"
    faulty.faults.fail("GetItem", throttled, times=2)
    with pytest.raises(Throttled):
        faulty.stores.batches.get("acme", "batch_f1")
    assert faulty.faults.calls["GetItem"] == 4 and len(faulty.sleeps) == 2


def test_the_workflow_registers_through_a_conflict(faulty: Faulty):
    faulty.stores.batches.create(new_batch())
    faulty.faults.fail("UpdateItem", conflict(), times=2)
    assert logic.register(faulty.stores, "acme", "batch_f1", "tok-1") == {"registered": True}
    batch = faulty.stores.batches.get("acme", "batch_f1")
    assert (batch.status, batch.task_token) == ("in_progress", "tok-1")


@pytest.mark.settings(chunk_max_lines=2)
def test_the_worker_counts_its_chunk_through_conflicts_and_runs_it_once(client, stores, deployed):
    batch = submit(client, (line(0) + "\n" + line(1) + "\n").encode())
    run_ingest()
    (only,) = take_work(deployed)
    faulty = faulty_stores(stores, deployed)
    faulty.faults.fail("TransactWriteItems", conflicted_transaction(), times=3)
    engine = InProcessEngine()
    report = run_one_chunk(faulty.stores, only, engine=engine)
    assert report.outcome.counted and report.outcome.last
    assert len(engine.requests) == 2  # each line ran once: no chunk redone for a conflict
    # The attempt's opening (3 conflicts, then through) and the count: transactions both.
    assert faulty.faults.calls["TransactWriteItems"] == 5 and len(faulty.sleeps) == 3
    record = stores.batches.get("acme", batch.id)
    assert (record.chunks_done, record.completed, record.failed) == (1, 2, 0)
