"""Rows of the fault-injection suite (docs/reliability.md, "Fault-injection suite") on moto, where
the in-memory fakes cannot be trusted: the real adapters (Step Functions, S3, DynamoDB) facing
the error shapes AWS answers, injected before the request leaves botocore (as
tests/integration/test_aws_faults.py does for DynamoDB; what it covers is not repeated here):

- a redelivered last chunk signals a token that no longer waits: ``SendTaskSuccess`` answers
  ``TaskTimedOut``/``InvalidToken``/``TaskDoesNotExist`` and the chunk ends quietly (the fake just
  returns False); a throttled ``SendTaskSuccess`` raises (the message comes back and signals);
- a redelivered ingest starts the workflow again: ``StartExecution`` answers
  ``ExecutionAlreadyExists`` (the fake's start never raises) and ingest finishes the fan-out;
- S3 answers ``SlowDown`` (HTTP 503) to a result part's PUT: the chunk is retried and counted
  once;
- DynamoDB cancels finalize's finishing transaction (files + terminal state) for a conflict: the
  adapter retries it and the batch completes with its files once."""

from __future__ import annotations

from collections import Counter, defaultdict
from types import SimpleNamespace
from typing import Any

import pytest

from functions.core import clients
from functions.core.errors import Throttled
from functions.core.ports import Stores
from functions.ingest import logic as ingest_logic
from functions.workflow import logic as workflow
from tests.agreement import assert_stores_agree
from tests.builders import set_batch
from tests.fakes.engine import InProcessEngine
from tests.integration.batch_helpers import line, run_ingest, submit, take_work
from tests.integration.test_aws_faults import cancelled
from tests.integration.worker.harness import run_one_chunk


class BotocoreFaults:
    """The next calls of an operation of a boto3 ``client`` answer with a scripted AWS answer
    (an error shape, parsed into botocore's modeled exception as a real answer is, or a success),
    before the request leaves botocore. Counts every call."""

    def __init__(self, client: Any):
        self.plan: dict[str, list[tuple[int, dict[str, Any]]]] = defaultdict(list)
        self.calls: Counter[str] = Counter()
        client.meta.events.register(f"before-call.{client.meta.service_model.endpoint_prefix}", self._before_call)

    def answer(self, operation: str, parsed: dict[str, Any], status: int = 400, times: int = 1) -> None:
        self.plan[operation].extend([(status, parsed)] * times)

    def error(self, operation: str, code: str, message: str = "", status: int = 400, times: int = 1) -> None:
        self.answer(operation, {"Error": {"Code": code, "Message": message or code}}, status, times)

    def _before_call(self, model: Any, **_: Any) -> Any:
        self.calls[model.name] += 1
        if self.plan[model.name]:
            status, parsed = self.plan[model.name].pop(0)
            return SimpleNamespace(status_code=status, headers={}, content=b""), {
                **parsed,
                "ResponseMetadata": {"HTTPStatusCode": status},
            }
        return None


def one_chunk_batch(client: Any, stores: Stores, deployed: Any, token: str | None = None):
    """A validated batch of two chat lines in one chunk, waiting on ``token``; its work message."""
    batch = submit(client, (line(0) + "\n" + line(1) + "\n").encode())
    run_ingest()
    (message,) = take_work(deployed)
    if token is not None:
        set_batch(stores, "acme", batch.id, task_token=token)
    return batch, message


@pytest.mark.parametrize("code", ["TaskTimedOut", "InvalidToken", "TaskDoesNotExist"])
@pytest.mark.settings(chunk_max_lines=2)
def test_chunk_signal_to_a_token_that_no_longer_waits_ends_the_redelivered_chunk_quietly(
    client, stores, deployed, code
):
    sfn = BotocoreFaults(clients.client("stepfunctions"))
    batch, message = one_chunk_batch(client, stores, deployed, token="tok-1")
    sfn.answer("SendTaskSuccess", {}, status=200)  # the first delivery's signal resumes the workflow
    first = run_one_chunk(stores, message)
    assert first.outcome.counted and first.outcome.last
    # The worker died before deleting the message; the redelivery signals again, on a token that
    # Step Functions no longer knows as waiting.
    sfn.error("SendTaskSuccess", code, "Provided task does not exist anymore")
    engine = InProcessEngine()
    again = run_one_chunk(stores, message, engine=engine)  # no exception: the message is deleted
    assert again.skipped and engine.requests == []
    assert sfn.calls["SendTaskSuccess"] == 2
    record = stores.batches.get("acme", batch.id)
    assert (record.chunks_done, record.completed, record.failed) == (1, 2, 0)


@pytest.mark.settings(chunk_max_lines=2)
def test_chunk_a_throttled_signal_raises_and_the_redelivery_signals(client, stores, deployed):
    sfn = BotocoreFaults(clients.client("stepfunctions"))
    batch, message = one_chunk_batch(client, stores, deployed, token="tok-1")
    sfn.error("SendTaskSuccess", "ThrottlingException", "Rate exceeded")  # as after botocore's retries gave up
    with pytest.raises(Exception) as raised:
        run_one_chunk(stores, message)
    assert "ThrottlingException" in repr(raised.value) or isinstance(raised.value, Throttled)
    assert stores.batches.counted_chunk("acme", batch.id, 0) is not None  # counted before the signal
    sfn.answer("SendTaskSuccess", {}, status=200)
    engine = InProcessEngine()
    again = run_one_chunk(stores, message, engine=engine)  # the redelivery: skipped, signals
    assert again.skipped and engine.requests == []
    assert sfn.calls["SendTaskSuccess"] == 2  # the throttled one and the redelivery's
    record = stores.batches.get("acme", batch.id)
    assert (record.chunks_done, record.completed, record.failed) == (1, 2, 0)


@pytest.mark.settings(chunk_max_lines=2)
def test_ingest_redelivered_after_the_start_meets_execution_already_exists_and_finishes(client, stores, deployed):
    sfn = BotocoreFaults(clients.client("stepfunctions"))
    table = BotocoreFaults(clients.dynamodb_table(deployed.table_name).meta.client)
    batch = submit(client, (line(0) + "\n" + line(1) + "\n").encode())
    # The first ingest moves the batch on, sends its work and starts its workflow, then dies
    # before marking the batch enqueued (a non-transient error on that last write).
    real_transition = stores.batches.transition
    calls = Counter()

    def transition(tenant: str, batch_id: str, change: Any, **kwargs: Any):
        if change.values.get("enqueued"):
            calls["enqueued"] += 1
            if calls["enqueued"] == 1:
                raise RuntimeError("the ingest Lambda died here")
        return real_transition(tenant, batch_id, change, **kwargs)

    stores.batches.transition = transition  # type: ignore[method-assign]
    try:
        with pytest.raises(RuntimeError):
            ingest_logic.ingest(stores, deployed, "acme", batch.id, now=batch.created_at + 1)
        assert sfn.calls["StartExecution"] == 1
        # Redelivered later: the same execution name with a later clock; Step Functions refuses it.
        sfn.error("StartExecution", "ExecutionAlreadyExists", f"Execution Already Exists: '{batch.id}'")
        status = ingest_logic.ingest(stores, deployed, "acme", batch.id, now=batch.created_at + 120)
    finally:
        stores.batches.transition = real_transition  # type: ignore[method-assign]
    assert status == "in_progress"
    assert sfn.calls["StartExecution"] == 2 and table.calls["UpdateItem"] >= 1
    record = stores.batches.get("acme", batch.id)
    assert record.enqueued and record.status == "in_progress"
    work = take_work(deployed)
    assert [m.chunk for m in work] == [0, 0]  # sent by both deliveries: the marker dedupes them


@pytest.mark.settings(chunk_max_lines=2)
def test_chunk_s3_slow_down_on_a_part_is_retried_by_redelivery_and_counted_once(client, stores, deployed):
    s3 = BotocoreFaults(clients.client("s3"))
    batch, message = one_chunk_batch(client, stores, deployed)
    s3.error("PutObject", "SlowDown", "Please reduce your request rate.", status=503)
    with pytest.raises(Throttled):  # the adapter's translation of S3's throttling
        run_one_chunk(stores, message)
    assert stores.batches.counted_chunk("acme", batch.id, 0) is None
    report = run_one_chunk(stores, message)  # redelivered
    assert report.outcome.counted and (report.completed, report.failed) == (2, 0)
    record = stores.batches.get("acme", batch.id)
    assert (record.chunks_done, record.completed, record.failed) == (1, 2, 0)


@pytest.mark.settings(chunk_max_lines=2)
def test_chunk_s3_slow_down_on_a_part_does_not_spend_the_poison_budget(client, stores, deployed):
    s3 = BotocoreFaults(clients.client("s3"))
    batch, message = one_chunk_batch(client, stores, deployed)
    s3.error("PutObject", "SlowDown", "Please reduce your request rate.", status=503)
    with pytest.raises(Throttled):
        run_one_chunk(stores, message)
    engine = InProcessEngine()
    run_one_chunk(stores, message, engine=engine)
    run = stores.batches.chunk_run("acme", batch.id, 0)
    assert run is None or run.failures == 0, f"a store error counted as a real failure: {run}"


@pytest.mark.settings(chunk_max_lines=2)
def test_finalize_finish_transaction_cancelled_for_a_conflict_is_retried_and_completes(client, stores, deployed):
    batch, message = one_chunk_batch(client, stores, deployed)
    run_one_chunk(stores, message)
    table = BotocoreFaults(clients.dynamodb_table(deployed.table_name).meta.client)
    # The finish transaction writes the batch and its file records: the batch item is busy.
    table.answer("TransactWriteItems", cancelled("TransactionConflict", "None", "None"), times=2)
    now = batch.created_at + 60
    assert workflow.finalize(stores, "acme", batch.id, "complete", now) == {"status": "completed"}
    assert table.calls["TransactWriteItems"] == 3
    output, errors = assert_stores_agree(stores, "acme", batch.id, ["req-0", "req-1"], now=now)
    assert [l.custom_id for l in output] == ["req-0", "req-1"] and errors == []
