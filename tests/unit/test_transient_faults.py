"""Transient AWS faults, retried where they occur (the DynamoDB adapter's retry on transaction
conflicts and throttling botocore gave up on, with an injected sleep: nothing waits here), and the
short, clear error a tenant reads when the workflow fails a batch (the cause goes to the log).

The adapter is driven through a stand-in for the boto3 ``Table`` resource that raises botocore's
``ClientError`` with the shapes DynamoDB answers; the moto-level tests are in
tests/integration/test_aws_faults.py."""

from __future__ import annotations

import logging
from types import SimpleNamespace
from typing import Any

import pytest
from botocore.exceptions import ClientError

from functions.core.aws.dynamodb import Put, Table, Update
from functions.core.errors import ConditionFailed, Throttled, TransactionConflict
from functions.workflow import logic
from functions.workflow.tasks import TaskError
from tests.builders import batch_record
from tests.fakes.aws import fake_stores


def client_error(code: str, operation: str, **extra: Any) -> ClientError:
    """What botocore raises for an AWS error answer (``extra``: modeled fields, e.g. CancellationReasons)."""
    return ClientError({"Error": {"Code": code, "Message": code}, **extra}, operation)


def conflict_error() -> ClientError:
    return client_error("TransactionConflictException", "UpdateItem")


def cancelled(*reasons: str) -> ClientError:
    return client_error(
        "TransactionCanceledException",
        "TransactWriteItems",
        CancellationReasons=[{"Code": r} for r in reasons],
    )


class ScriptedResource:
    """A boto3 Table resource whose next calls raise the scripted errors, then succeed."""

    name = "t"

    def __init__(self, *errors: ClientError):
        self.errors = list(errors)
        self.calls: list[str] = []
        self.meta = SimpleNamespace(client=SimpleNamespace(transact_write_items=self._op("transact_write_items")))
        self.update_item = self._op("update_item", {"Attributes": {"pk": "p", "sk": "s"}})
        self.put_item = self._op("put_item")
        self.get_item = self._op("get_item", {"Item": {"pk": "p", "sk": "s"}})

    def _op(self, name: str, result: dict[str, Any] | None = None):
        def call(**_: Any) -> dict[str, Any]:
            self.calls.append(name)
            if self.errors:
                raise self.errors.pop(0)
            return result or {}

        return call


def table(resource: ScriptedResource, sleeps: list[float], **kwargs: Any) -> Table:
    return Table(resource, sleep=sleeps.append, **kwargs)


OPS = [
    Put({"pk": "m", "sk": "s"}, if_absent=True),
    Update("p", "s", add={"chunks_done": 1}, expect={"accepting": True}),
]


# --- retried where the fault occurs -------------------------------------------------------------
@pytest.mark.parametrize(
    "fault",
    [
        cancelled("None", "TransactionConflict"),
        cancelled("TransactionConflict", "None"),
        conflict_error(),
        cancelled("None", "ThrottlingError"),
        client_error("ProvisionedThroughputExceededException", "TransactWriteItems"),
        client_error("ThrottlingException", "TransactWriteItems"),
    ],
    ids=[
        "cancelled-conflict",
        "cancelled-conflict-first",
        "conflict",
        "cancelled-throttling",
        "throughput",
        "throttling",
    ],
)
def test_a_busy_transaction_is_retried_until_it_goes_through(fault):
    resource, sleeps = ScriptedResource(fault, fault), []
    table(resource, sleeps).transact(OPS)  # no error: the third attempt went through
    assert resource.calls == ["transact_write_items"] * 3
    assert len(sleeps) == 2 and all(s >= 0 for s in sleeps)


def test_conditional_writes_are_retried_on_a_conflict_too():
    resource, sleeps = ScriptedResource(conflict_error(), conflict_error()), []
    t = table(resource, sleeps)
    assert t.update(Update("p", "s", values={"status": "failed"}, expect={"status": "in_progress"})) == {
        "pk": "p",
        "sk": "s",
    }
    resource.errors = [conflict_error()]
    t.put({"pk": "p", "sk": "s"}, if_absent=True)
    assert resource.calls == ["update_item"] * 3 + ["put_item"] * 2 and len(sleeps) == 3


def test_a_conflict_that_outlasts_the_attempts_is_a_typed_error_after_the_last():
    resource, sleeps = ScriptedResource(*[cancelled("None", "TransactionConflict")] * 10), []
    with pytest.raises(TransactionConflict) as raised:
        table(resource, sleeps, attempts=4).transact(OPS)
    assert isinstance(raised.value, Throttled)  # the API answers it as 503, retryable
    assert resource.calls == ["transact_write_items"] * 4 and len(sleeps) == 3
    assert len(resource.errors) == 6  # nothing called after the last attempt


def test_throttling_that_outlasts_the_attempts_is_throttled():
    resource, sleeps = ScriptedResource(*[client_error("ProvisionedThroughputExceededException", "GetItem")] * 9), []
    with pytest.raises(Throttled) as raised:
        table(resource, sleeps, attempts=3).get("p", "s")
    assert not isinstance(raised.value, TransactionConflict)
    assert resource.calls == ["get_item"] * 3 and len(sleeps) == 2


def test_the_backoff_is_exponential_capped_and_jittered():
    resource, sleeps = ScriptedResource(*[conflict_error()] * 10), []
    with pytest.raises(TransactionConflict):
        table(resource, sleeps, attempts=7, backoff_base=0.1, backoff_cap=1.0, jitter=lambda: 1.0).transact(OPS)
    assert sleeps == pytest.approx([0.1, 0.2, 0.4, 0.8, 1.0, 1.0])
    resource, halved = ScriptedResource(*[conflict_error()] * 3), []
    table(resource, halved, attempts=7, backoff_base=0.1, backoff_cap=1.0, jitter=lambda: 0.5).transact(OPS)
    assert halved == pytest.approx([0.05, 0.1, 0.2])


def test_the_default_policy_waits_a_few_seconds_at_most():
    resource, sleeps = ScriptedResource(*[conflict_error()] * 50), []
    with pytest.raises(TransactionConflict):
        table(resource, sleeps, jitter=lambda: 1.0).transact(OPS)
    assert 3 <= len(resource.calls) <= 10 and 0 < sum(sleeps) <= 5


@pytest.mark.parametrize(
    "fault",
    [
        cancelled("None", "ConditionalCheckFailed"),
        cancelled("ConditionalCheckFailed", "TransactionConflict"),
        cancelled("TransactionConflict", "ConditionalCheckFailed"),
    ],
)
def test_a_transaction_cancelled_by_a_condition_fails_at_once(fault):
    resource, sleeps = ScriptedResource(fault, fault), []
    with pytest.raises(ConditionFailed):
        table(resource, sleeps).transact(OPS)
    assert resource.calls == ["transact_write_items"] and sleeps == []


def test_a_conditional_check_failure_is_never_retried():
    resource, sleeps = ScriptedResource(client_error("ConditionalCheckFailedException", "UpdateItem")), []
    with pytest.raises(ConditionFailed):
        table(resource, sleeps).update(Update("p", "s", values={"x": 1}))
    assert resource.calls == ["update_item"] and sleeps == []


@pytest.mark.parametrize("code", ["ValidationException", "ResourceNotFoundException"])
def test_other_errors_are_not_retried(code):
    resource, sleeps = ScriptedResource(client_error(code, "TransactWriteItems")), []
    with pytest.raises(ClientError):
        table(resource, sleeps).transact(OPS)
    assert resource.calls == ["transact_write_items"] and sleeps == []


def test_a_transaction_cancelled_for_another_reason_is_not_retried():
    resource, sleeps = ScriptedResource(cancelled("None", "ValidationError")), []
    with pytest.raises(ClientError):
        table(resource, sleeps).transact(OPS)
    assert resource.calls == ["transact_write_items"] and sleeps == []


# --- the tenant's error when the workflow fails a batch -----------------------------------------
ACCOUNT = "123456789012"
CAUSE = (
    '{"errorMessage": "An error occurred (AccessDeniedException) when calling the GetObject operation: '
    f'User: arn:aws:sts::{ACCOUNT}:assumed-role/batch-api-workflow/fn is not authorized", '
    '"errorType": "ClientError", "stackTrace": ["  File \\"/var/task/functions/workflow/logic.py\\", line 120, in finalize\\n"]}'
)


def running_batch():
    stores = fake_stores()
    stores.batches.put(batch_record(status="in_progress", model="m", chunk_count=1, accepting=True))
    return stores


class Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@pytest.fixture
def logged():
    handler = Records()
    logic.logger.addHandler(handler)
    yield handler.records
    logic.logger.removeHandler(handler)


def test_a_failed_batch_tells_the_tenant_briefly_and_never_the_cause(logged):
    stores = running_batch()
    assert logic.fail(stores, "acme", "batch_1", TaskError(Error="States.TaskFailed", Cause=CAUSE), 500) == {
        "status": "failed"
    }
    (error,) = stores.batches.get("acme", "batch_1").errors
    assert error["code"] == "batch_failed" and error["param"] is None and error["line"] is None
    message = error["message"]
    assert "internal error" in message and len(message) <= 200
    for leak in (ACCOUNT, "arn:", "stackTrace", "Traceback", "States.", "AccessDenied", "/var/task", "logic.py"):
        assert leak not in message
    # The full cause is in the log, with the batch it belongs to.
    (record,) = [r for r in logged if r.levelno >= logging.ERROR]
    assert CAUSE in record.getMessage() and record.batch_id == "batch_1" and record.tenant == "acme"
    assert record.cause == CAUSE and record.error == "States.TaskFailed"


def test_a_failed_batch_without_a_cause_reads_the_same(logged):
    stores = running_batch()
    logic.fail(stores, "acme", "batch_1", TaskError(), 500)
    (error,) = stores.batches.get("acme", "batch_1").errors
    assert error["code"] == "batch_failed" and "internal error" in error["message"]
    assert "unknown error" in logged[0].getMessage()
