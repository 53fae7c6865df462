"""The sweeper on moto (docs/lifecycle.md, "Liveness: every batch ends"): a batch left with no
workflow (StartExecution failing after the batch reached in_progress) would never complete and
never expire without it. The real handlers, the
real state machine run by moto's interpreter, the clock moved by the test (``clock``)."""

import json
import types

import pytest
from botocore.exceptions import ClientError

from functions.core import clients
from functions.ingest import logic as ingest_logic
from functions.sweeper import handler as sweeper_handler
from infra.local.lambda_context import LocalLambdaContext
from tests.agreement import assert_api_agrees
from tests.integration.batch_helpers import (
    executions,
    line,
    run_ingest,
    submit,
    take_work,
    wait_for_execution,
    wait_for_task_token,
)
from tests.integration.worker.harness import run_one_chunk

pytestmark = [
    pytest.mark.workflow,
    pytest.mark.settings(chunk_max_lines=2, drain_poll_seconds=0, drain_grace_seconds=30),
]

#: The deployment's defaults (Settings): a batch not enqueued 300 s after it moved is restarted;
#: an open batch 900 s past its expiry is finalized by the sweeper.
ENQUEUE_GRACE = 300
EXPIRY_GRACE = 900
#: An all-counted batch left open by its workflow is finalized after a reconcile period (300 s)
#: plus the expiry grace (900 s) of quiet.
COMPLETION_GRACE = 300 + 900


def sweep() -> dict:
    return sweeper_handler.handler({"source": "aws.events"}, LocalLambdaContext("sweeper"))


@pytest.fixture
def start_fails(stores, monkeypatch):
    """StartExecution answers ServiceUnavailable the next ``failures[0]`` times (then works)."""
    real = stores.workflows.start
    failures = [0]

    def start(name, payload):
        if failures[0] > 0:
            failures[0] -= 1
            raise ClientError({"Error": {"Code": "ServiceUnavailable", "Message": "try again"}}, "StartExecution")
        return real(name, payload)

    monkeypatch.setattr(stores.workflows, "start", start)
    return failures


def test_a_batch_whose_workflow_start_kept_failing_is_started_by_the_sweeper_and_completes(
    client, stores, deployed, clock, start_fails
):
    start_fails[0] = 2  # ingest's attempt, and the sweeper's first
    batch = submit(client, ("\n".join(line(i) for i in range(3)) + "\n").encode())
    assert run_ingest() == 0  # the event failed (redelivered in 60 s): StartExecution kept failing
    moved = stores.batches.get("acme", batch.id)
    assert (moved.status, moved.enqueued) == ("in_progress", False) and executions(deployed) == []
    first_work = take_work(deployed)  # the fan-out went out before the start failed
    assert len(first_work) == 2

    clock.now = moved.in_progress_at + ENQUEUE_GRACE - 1
    assert sweep()["actions"] == {}  # ingest's own retry may still do it
    clock.now = moved.in_progress_at + ENQUEUE_GRACE
    assert sweep() == {"looked": 1, "actions": {}, "errors": 1}  # the start failed again: next sweep
    clock.now += 300
    assert sweep()["actions"] == {"restarted": 1}
    (execution,) = executions(deployed)
    assert execution["name"] == batch.id
    assert stores.batches.get("acme", batch.id).enqueued
    clock.now += 300
    assert sweep()["actions"] == {}  # started once: later sweeps leave it to its workflow

    again = take_work(deployed)  # the fan-out was redone by both sweeps: duplicates, counted once
    assert [m.chunk for m in again] == [0, 0, 1, 1]
    outcomes = [run_one_chunk(stores, m).outcome for m in [*first_work, *again]]
    assert [bool(o and o.counted) for o in outcomes] == [True, True, False, False, False, False]
    assert wait_for_execution(deployed, batch.id)["status"] == "SUCCEEDED"
    done = client.batches.retrieve(batch.id)
    assert done.status == "completed"
    output, errors = assert_api_agrees(client, done, [f"req-{i}" for i in range(3)])
    assert len(output) == 3 and errors == []


def test_execution_already_exists_with_another_input_counts_as_started(client, stores, deployed):
    """The sweeper's restart names the execution after the batch: StartExecution with the same
    name and another input (a later ``timeout_seconds``) answers ExecutionAlreadyExists, which
    the adapter takes as started."""
    batch = submit(client, (line(0) + "\n").encode())
    run_ingest()
    (execution,) = executions(deployed)
    described = clients.client("stepfunctions").describe_execution(executionArn=execution["executionArn"])
    other = {**json.loads(described["input"]), "timeout_seconds": 17}
    with pytest.raises(ClientError, match="ExecutionAlreadyExists"):
        clients.client("stepfunctions").start_execution(
            stateMachineArn=deployed.state_machine_arn,
            name=batch.id,
            input=json.dumps(other),
        )
    stores.workflows.start(batch.id, other)  # no raise: already started
    assert [e["name"] for e in executions(deployed)] == [batch.id]
    (work,) = take_work(deployed)
    run_one_chunk(stores, work)  # the one execution finishes the batch
    assert wait_for_execution(deployed, batch.id)["status"] == "SUCCEEDED"


def test_an_open_batch_past_expiry_and_grace_with_no_workflow_ends_expired_with_its_files(
    client, stores, deployed, clock, start_fails, monkeypatch
):
    start_fails[0] = 10**6  # its workflow never starts, ever
    batch = submit(client, ("\n".join(line(i) for i in range(4)) + "\n").encode(), window="30s")
    run_ingest()
    work = take_work(deployed)
    assert run_one_chunk(stores, work[0]).outcome.counted  # one chunk ran; the other never will
    assert executions(deployed) == []
    clock.now = batch.expires_at + EXPIRY_GRACE - 1
    # within the grace, a restart is tried (and fails): the batch stays open
    assert sweep()["errors"] == 1 and client.batches.retrieve(batch.id).status == "in_progress"
    clock.now = batch.expires_at + EXPIRY_GRACE
    assert sweep()["actions"] == {"expired": 1}
    done = client.batches.retrieve(batch.id)
    assert done.status == "expired" and done.expired_at == batch.expires_at + EXPIRY_GRACE
    output, errors = assert_api_agrees(client, done, [f"req-{i}" for i in range(4)])
    assert [l.custom_id for l in output] == ["req-0", "req-1"]
    assert [(l.custom_id, l.error.code) for l in errors] == [("req-2", "batch_expired"), ("req-3", "batch_expired")]
    assert stores.batches.open_batches() == []
    assert sweep() == {"looked": 0, "actions": {}, "errors": 0}


def test_a_batch_stuck_validating_past_its_deadline_fails_with_the_clear_error(
    client, stores, deployed, clock, monkeypatch
):
    """Its ingest event was lost (never delivered): the sweeper's validating deadline ends it."""
    batch = submit(client, (line(0) + "\n").encode())
    lose_ingest_events()  # the S3 notification is lost
    clock.now = batch.created_at + 5 * 3600 + 15 * 60 - 1
    assert sweep()["actions"] == {}
    clock.now += 1
    assert sweep()["actions"] == {"failed_validating": 1}
    done = client.batches.retrieve(batch.id)
    assert done.status == "failed" and [e.code for e in done.errors.data] == ["ingest_failed"]


def lose_ingest_events() -> None:
    from infra.local.resources import ingest_queue_url
    from tests.conftest import PREFIX

    sqs, url = clients.client("sqs"), ingest_queue_url(clients.client, PREFIX)
    while messages := sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10).get("Messages", []):
        for m in messages:
            sqs.delete_message(QueueUrl=url, ReceiptHandle=m["ReceiptHandle"])


def test_a_batch_cancelled_before_it_started_with_no_ingest_left_ends_cancelled(client, stores, deployed, clock):
    batch = submit(client, (line(0) + "\n").encode())
    lose_ingest_events()  # its ingest event is gone
    cancelling = client.batches.cancel(batch.id)
    assert cancelling.status == "cancelling"
    clock.now = cancelling.cancelling_at + ENQUEUE_GRACE
    assert sweep()["actions"] == {"cancelled": 1}
    assert client.batches.retrieve(batch.id).status == "cancelled"
    assert executions(deployed) == []


def test_an_all_counted_batch_whose_workflow_died_is_finalized_completed_by_the_sweeper(
    client, stores, deployed, clock, monkeypatch
):
    """Every chunk is counted, then the execution fails without finalizing: Finalize and Fail hit
    a transient error on every retry (Fail raises it for its own retry, which runs out). The
    sweeper finalizes the batch ``completed`` a reconcile period plus the expiry grace after it went
    quiet, long before its expiry."""
    from moto.stepfunctions.parser.asl.component.common.retry import retrier_decl

    from functions.workflow import logic as workflow_logic

    monkeypatch.setattr(retrier_decl, "time", types.SimpleNamespace(sleep=lambda _: None))
    calls = []

    def down(*args, **kwargs):
        calls.append(1)
        raise TimeoutError("the table did not answer")

    with monkeypatch.context() as broken:
        broken.setattr(workflow_logic, "finalize", down)
        broken.setattr(workflow_logic, "fail", down)
        batch = submit(client, ("\n".join(line(i) for i in range(4)) + "\n").encode())
        run_ingest()
        wait_for_task_token(stores, "acme", batch.id)
        for work in take_work(deployed):
            assert run_one_chunk(stores, work).outcome.counted
        execution = wait_for_execution(deployed, batch.id)
        assert execution["status"] == "FAILED" and len(calls) >= 8  # Finalize's and Fail's every retry
    counted = stores.batches.get("acme", batch.id)
    assert counted.status == "in_progress" and counted.chunks_done == counted.chunk_count == 2
    quiet = max(
        [m.recorded_at for m in stores.batches.counted_chunks("acme", batch.id).values()] + [counted.in_progress_at]
    )
    clock.now = quiet + COMPLETION_GRACE - 1
    assert sweep()["actions"] == {}  # a live workflow's time
    clock.now = quiet + COMPLETION_GRACE
    assert sweep()["actions"] == {"completed": 1}
    done = client.batches.retrieve(batch.id)
    assert done.status == "completed" and done.completed_at == quiet + COMPLETION_GRACE < done.expires_at - 80_000
    output, errors = assert_api_agrees(client, done, [f"req-{i}" for i in range(4)])
    assert len(output) == 4 and errors == []
    assert stores.batches.open_batches() == []
