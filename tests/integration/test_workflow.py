"""The batch workflow, executed by moto's Step Functions interpreter from infra/workflow.py, with
its Lambda tasks answered by our workflow handler; chunks run by the worker's accounting path."""

import json
import types

import pytest
from openai.types import Batch

from functions.core import clients, schema
from functions.core.wire import BatchOutputLine
from functions.workflow import logic
from tests.agreement import assert_api_agrees, assert_usage_agrees
from tests.chunks import open_attempt
from tests.fakes.engine import InProcessEngine, rejecting
from tests.integration.batch_helpers import (
    line,
    run_ingest,
    submit,
    take_work,
    wait_for_execution,
    wait_for_task_token,
)
from tests.integration.worker.harness import run_one_chunk, wait_until

pytestmark = [
    pytest.mark.workflow,
    pytest.mark.settings(chunk_max_lines=2, drain_poll_seconds=0, drain_grace_seconds=30),
]


@pytest.fixture
def events(deployed):
    """Every EventBridge event the system publishes, captured through a rule into a queue."""
    sqs, bridge = clients.client("sqs"), clients.client("events")
    url = sqs.create_queue(QueueName="captured-events")["QueueUrl"]
    arn = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
    bridge.put_rule(Name="all-batch-events", EventPattern=json.dumps({"source": ["batch-api"]}))
    bridge.put_targets(Rule="all-batch-events", Targets=[{"Id": "q", "Arn": arn}])

    def read() -> list[dict]:
        out = []
        while messages := sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10).get("Messages", []):
            for m in messages:
                out.append(json.loads(m["Body"]))
                sqs.delete_message(QueueUrl=url, ReceiptHandle=m["ReceiptHandle"])
        return out

    return read


def states_entered(settings, batch_id: str, until, timeout: float = 90.0) -> list[str]:
    """The states the batch's execution entered, once ``until(names)`` holds (waits for it)."""
    import time

    sfn = clients.client("stepfunctions")
    arn = f"{settings.state_machine_arn.replace(':stateMachine:', ':execution:')}:{batch_id}"
    deadline = time.monotonic() + timeout
    while True:
        events = sfn.get_execution_history(executionArn=arn, maxResults=1000)["events"]
        names = [e["stateEnteredEventDetails"]["name"] for e in events if "stateEnteredEventDetails" in e]
        if until(names):
            return names
        assert time.monotonic() < deadline, f"execution {batch_id} never got there: {names}"
        time.sleep(0.05)


def start(client, stores, lines, **kwargs):
    batch = submit(client, ("\n".join(lines) + "\n").encode(), **kwargs)
    run_ingest()
    wait_for_task_token(stores, "acme", batch.id)
    return batch


def read_file(client, file_id) -> list[BatchOutputLine]:
    if file_id is None:
        return []
    return [BatchOutputLine.model_validate_json(l) for l in client.files.content(file_id).content.splitlines()]


def assert_invariants(client, batch: Batch, custom_ids: list[str]):
    """DESIGN.md section 3: every input line in exactly one file, counts equal to the lines."""
    out, err = read_file(client, batch.output_file_id), read_file(client, batch.error_file_id)
    assert batch.request_counts.total == len(custom_ids)
    assert batch.request_counts.completed == len(out)
    assert batch.request_counts.failed == len(err)
    assert sorted(l.custom_id for l in out + err) == sorted(custom_ids)
    order = {c: i for i, c in enumerate(custom_ids)}
    assert [l.custom_id for l in out] == sorted((l.custom_id for l in out), key=order.get)  # input order
    assert [l.custom_id for l in err] == sorted((l.custom_id for l in err), key=order.get)
    assert len({l.id for l in out + err}) == len(out) + len(err)
    for l in out:
        assert l.error is None and l.response.status_code == 200 and l.response.body["object"] == "chat.completion"
    for f in (batch.output_file_id, batch.error_file_id):
        if f:
            meta = client.files.retrieve(f)
            assert meta.purpose == "batch_output" and meta.bytes > 0
    return out, err


def test_complete(client, stores, deployed, events):
    ids = [f"req-{i}" for i in range(5)]
    batch = start(client, stores, [line(i) for i in range(5)])
    work = take_work(deployed)
    assert len(work) == 3
    outcomes = [run_one_chunk(stores, m).outcome for m in work]
    assert [o.counted for o in outcomes] == [True, True, True] and outcomes[-1].last
    execution = wait_for_execution(deployed, batch.id)
    assert execution["status"] == "SUCCEEDED", execution
    done = client.batches.retrieve(batch.id)
    assert done.status == "completed"
    assert done.in_progress_at <= done.finalizing_at <= done.completed_at
    out, err = assert_invariants(client, done, ids)
    assert len(out) == 5 and err == [] and done.error_file_id is None
    assert done.usage.input_tokens == 50 and done.usage.output_tokens == 15 and done.usage.total_tokens == 65
    output = client.files.retrieve(done.output_file_id)
    assert output.filename == f"{batch.id}_output.jsonl" and output.expires_at == output.created_at + 30 * 86400
    (event,) = events()
    assert event["detail-type"] == "batch.completed" and event["detail"]["id"] == batch.id
    assert event["detail"]["request_counts"] == {"completed": 5, "failed": 0, "total": 5}


def test_engine_rejections_land_in_the_error_file(client, stores, deployed):
    lines = [line(0), json.dumps({**json.loads(line(1)), "custom_id": "reject-1"}), line(2)]
    engine = InProcessEngine(rejecting("hi 1"))
    batch = start(client, stores, lines, output_expires_after={"anchor": "created_at", "seconds": 7200})
    for m in take_work(deployed):
        run_one_chunk(stores, m, engine=engine)
    assert wait_for_execution(deployed, batch.id)["status"] == "SUCCEEDED"
    done = client.batches.retrieve(batch.id)
    _out, err = assert_invariants(client, done, ["req-0", "reject-1", "req-2"])
    assert done.status == "completed" and [l.custom_id for l in err] == ["reject-1"]
    assert err[0].response.status_code == 400 and err[0].response.body["error"]["message"] == "rejected"
    assert err[0].error is None
    error_file = client.files.retrieve(done.error_file_id)
    assert error_file.expires_at == error_file.created_at + 7200


def test_only_errors(client, stores, deployed):
    lines = [json.dumps({**json.loads(line(i)), "custom_id": f"reject-{i}"}) for i in range(3)]
    batch = start(client, stores, lines)
    for m in take_work(deployed):
        run_one_chunk(stores, m, engine=InProcessEngine(rejecting("hi 0", "hi 1", "hi 2")))
    assert wait_for_execution(deployed, batch.id)["status"] == "SUCCEEDED"
    done = client.batches.retrieve(batch.id)
    _out, err = assert_invariants(client, done, [f"reject-{i}" for i in range(3)])
    assert done.status == "completed" and done.output_file_id is None and len(err) == 3


def test_a_chunk_recorded_twice_counts_once(client, stores, deployed):
    batch = start(client, stores, [line(i) for i in range(4)])
    first, second = take_work(deployed)
    assert run_one_chunk(stores, first).outcome.counted
    again = run_one_chunk(stores, first)  # SQS delivered it twice: already counted, it runs nothing
    assert again.skipped and again.outcome is None
    assert stores.batches.get("acme", batch.id).completed == 2
    assert run_one_chunk(stores, second).outcome.last
    assert wait_for_execution(deployed, batch.id)["status"] == "SUCCEEDED"
    done = client.batches.retrieve(batch.id)
    assert_invariants(client, done, [f"req-{i}" for i in range(4)])
    assert done.request_counts.completed == 4


def test_cancel_mid_run_keeps_partial_output(client, stores, deployed, events):
    ids = [f"req-{i}" for i in range(5)]
    batch = start(client, stores, [line(i) for i in range(5)])
    first, second, third = take_work(deployed)
    run_one_chunk(stores, first)
    assert client.batches.cancel(batch.id).status == "cancelling"
    assert wait_for_execution(deployed, batch.id)["status"] == "SUCCEEDED"
    done = client.batches.retrieve(batch.id)
    assert done.status == "cancelled" and done.cancelled_at >= done.cancelling_at
    out, err = assert_invariants(client, done, ids)
    assert_api_agrees(client, done, ids)
    assert [l.custom_id for l in out] == ["req-0", "req-1"]
    assert {l.error.code for l in err} == {"batch_cancelled"} and len(err) == 3
    # a chunk that arrives after the batch closed is skipped, or not counted if it was running
    assert run_one_chunk(stores, second).skipped
    late = run_one_chunk(stores, third, started=True).outcome
    assert not late.counted
    assert client.batches.retrieve(batch.id) == done
    assert [e["detail-type"] for e in events()] == ["batch.cancelled"]


def test_cancel_waits_for_a_running_chunk(client, stores, deployed):
    batch = start(client, stores, [line(i) for i in range(4)])
    first, _second = take_work(deployed)
    assert open_attempt(stores, first)  # a worker is on it
    client.batches.cancel(batch.id)
    # the workflow drains: it polls again rather than finalize while the chunk runs
    entered = states_entered(deployed, batch.id, until=lambda names: names.count("Drain") >= 2 or "Finalize" in names)
    assert "Finalize" not in entered and "WaitForRunningChunks" in entered
    assert stores.batches.get("acme", batch.id).status == "cancelling"
    run_one_chunk(stores, first, started=True)  # the running chunk finishes within the grace period
    assert wait_for_execution(deployed, batch.id)["status"] == "SUCCEEDED"
    done = client.batches.retrieve(batch.id)
    out, err = assert_invariants(client, done, [f"req-{i}" for i in range(4)])
    assert [l.custom_id for l in out] == ["req-0", "req-1"] and {l.error.code for l in err} == {"batch_cancelled"}


@pytest.mark.settings(chunk_max_lines=2, drain_poll_seconds=0, drain_grace_seconds=1)
def test_a_chunk_that_never_finishes_is_abandoned_after_the_grace_period(client, stores, deployed):
    batch = start(client, stores, [line(i) for i in range(2)])
    (only,) = take_work(deployed)
    assert open_attempt(stores, only)  # and the worker dies
    client.batches.cancel(batch.id)
    assert wait_for_execution(deployed, batch.id)["status"] == "SUCCEEDED"
    done = client.batches.retrieve(batch.id)
    out, err = assert_invariants(client, done, ["req-0", "req-1"])
    assert done.status == "cancelled" and out == [] and {l.error.code for l in err} == {"batch_cancelled"}


@pytest.mark.settings(chunk_max_lines=2, drain_poll_seconds=0, drain_grace_seconds=1)
def test_a_cancel_keeps_the_checkpointed_lines_of_a_chunk_still_running(client, stores, deployed):
    """Nothing completed is lost: the worker on the second chunk answered req-2, checkpointed it
    (S3 object + run record) and hangs on req-3; the cancelled batch keeps req-2's answer and its
    usage, and only req-3 is batch_cancelled."""
    from functions.core import chunk_lifecycle, results

    ids = [f"req-{i}" for i in range(4)]
    batch = start(client, stores, [line(i) for i in range(4)])
    first, second = take_work(deployed)
    assert run_one_chunk(stores, first).outcome.counted
    assert open_attempt(stores, second)
    req2 = next(results.unrun_lines(stores.objects, second, "x", "x"))
    usage = {"prompt_tokens": 7, "completion_tokens": 5}
    answered = results.response_line(req2.custom_id, 200, {"object": "chat.completion", "usage": usage}, "r")
    chunk_lifecycle.add_segment(
        stores, second, "a1", results.write_checkpoint(stores.objects, second, 0, [answered]), None
    )
    before = stores.batches.get("acme", batch.id)
    client.batches.cancel(batch.id)
    assert wait_for_execution(deployed, batch.id)["status"] == "SUCCEEDED"
    done = client.batches.retrieve(batch.id)
    assert done.status == "cancelled"
    out, err = assert_api_agrees(client, done, ids)
    assert [l.custom_id for l in out] == ["req-0", "req-1", "req-2"] and out[2].id == answered.id
    assert [(l.custom_id, l.error.code) for l in err] == [("req-3", "batch_cancelled")]
    assert (done.request_counts.completed, done.request_counts.failed) == (3, 1)
    assert done.usage.input_tokens == before.input_tokens + 7 and done.usage.output_tokens == before.output_tokens + 5
    assert_usage_agrees(stores, "acme", batch.id)


@pytest.mark.settings(chunk_max_lines=2, drain_poll_seconds=0, drain_grace_seconds=30, completion_windows=("2s",))
def test_expire_mid_run(client, stores, deployed, events, monkeypatch):
    ids = [f"req-{i}" for i in range(4)]
    # A worker finishes the first chunk after the fan-out but before the workflow starts: it is
    # counted inside the window however slow the machine (the workflow then waits at least 1 s,
    # ingest's floor), and the second chunk never runs before the window ends.
    real_start, left = stores.workflows.start, []

    def start_after_the_first_chunk(name, payload):
        first, second = take_work(deployed)
        assert run_one_chunk(stores, first).outcome.counted
        left.append(second)
        real_start(name, payload)

    monkeypatch.setattr(stores.workflows, "start", start_after_the_first_chunk)
    batch = submit(client, ("\n".join(line(i) for i in range(4)) + "\n").encode(), window="2s")
    run_ingest()
    (second,) = left
    execution = wait_for_execution(deployed, batch.id)
    assert execution["status"] == "SUCCEEDED"
    done = client.batches.retrieve(batch.id)
    assert done.status == "expired" and done.expired_at >= done.finalizing_at
    out, err = assert_invariants(client, done, ids)
    assert_api_agrees(client, done, ids)  # both files, counts line by line
    assert [l.custom_id for l in out] == ["req-0", "req-1"]
    assert [(l.custom_id, l.error.code) for l in err] == [("req-2", "batch_expired"), ("req-3", "batch_expired")]
    assert run_one_chunk(stores, second).skipped  # too late
    assert [e["detail-type"] for e in events()] == ["batch.expired"]


def test_finalize_failure_lands_in_failed(client, stores, deployed, events, monkeypatch):
    from moto.stepfunctions.parser.asl.component.common.retry import retrier_decl

    # No real backoff between the state machine's retries (only the retrier's own `time` is
    # replaced: patching time.sleep itself would turn every wait loop into a busy loop).
    monkeypatch.setattr(retrier_decl, "time", types.SimpleNamespace(sleep=lambda _: None))
    batch = start(client, stores, [line(0)])
    stores.objects.delete(schema.batch_manifest_key("acme", batch.id))  # finalize cannot work now
    (only,) = take_work(deployed)
    run_one_chunk(stores, only)
    execution = wait_for_execution(deployed, batch.id)
    assert execution["status"] == "FAILED" and execution["error"] == "BatchFailed"
    done = client.batches.retrieve(batch.id)
    assert done.status == "failed" and done.failed_at is not None
    (error,) = done.errors.data
    assert error.code == "batch_failed" and "could not be finalized" in error.message
    assert [e["detail-type"] for e in events()] == ["batch.failed"]


@pytest.mark.parametrize("task", ["drain", "finalize"])
def test_a_batch_whose_workflow_keeps_failing_ends_failed_with_its_completed_lines(
    client, stores, deployed, events, monkeypatch, task
):
    """Nothing completed is lost (docs/reliability.md): Drain or Finalize fails on every retry, the
    state machine takes its failure path, and Fail keeps the lines that ran: the batch ends
    ``failed`` with its output file, and the requests that never ran are error lines."""
    from moto.stepfunctions.parser.asl.component.common.retry import retrier_decl

    monkeypatch.setattr(retrier_decl, "time", types.SimpleNamespace(sleep=lambda _: None))
    calls = []

    def broken(*args, **kwargs):
        calls.append(task)
        raise TimeoutError("the table did not answer")

    monkeypatch.setattr(logic, task, broken)
    ids = [f"req-{i}" for i in range(5)]
    batch = start(client, stores, [line(i) for i in range(5)])
    first, second, _third = take_work(deployed)
    assert run_one_chunk(stores, first).outcome.counted and run_one_chunk(stores, second).outcome.counted
    client.batches.cancel(batch.id)
    execution = wait_for_execution(deployed, batch.id)
    assert execution["status"] == "FAILED" and execution["error"] == "BatchFailed"
    assert len(calls) >= 4  # the first try and its retries, before the failure path
    done = client.batches.retrieve(batch.id)
    assert done.status == "failed" and done.failed_at is not None
    out, err = assert_api_agrees(client, done, ids)
    assert_invariants(client, done, ids)
    assert [l.custom_id for l in out] == ["req-0", "req-1", "req-2", "req-3"]
    assert [(l.custom_id, l.error.code) for l in err] == [("req-4", "batch_failed")]
    (error,) = done.errors.data
    assert error.code == "batch_failed" and "TimeoutError" not in error.message and "table" not in error.message
    assert [e["detail-type"] for e in events()] == ["batch.failed"]


def test_finalize_is_idempotent(client, stores, deployed):
    batch = start(client, stores, [line(i) for i in range(3)])
    for m in take_work(deployed):
        run_one_chunk(stores, m)
    wait_for_execution(deployed, batch.id)
    done = client.batches.retrieve(batch.id)
    assert logic.finalize(stores, "acme", batch.id, "complete", now=done.completed_at + 5) == {"status": "completed"}
    assert client.batches.retrieve(batch.id) == done
    assert len([f for f in client.files.list() if f.purpose == "batch_output"]) == 1


def test_two_workers_racing_on_one_chunk_cannot_change_the_counted_results(client, stores, deployed):
    """A chunk redelivered while its first worker still runs: both write parts, one is counted,
    and the files hold exactly the counted attempt's lines."""
    from functions.core import chunk_lifecycle, results

    batch = start(client, stores, [line(0), line(1)])
    (message,) = take_work(deployed)
    ok = [results.response_line(f"req-{i}", 200, {"object": "chat.completion", "i": i}, "a") for i in range(2)]
    failed = [results.error_line(f"req-{i}", "server_error", "engine died") for i in range(2)]
    first = results.write_parts(stores.objects, message, ok)
    second = results.write_parts(stores.objects, message, failed)  # written after, by the other worker
    assert chunk_lifecycle.record_chunk(stores, message, parts=first, usage=chunk_lifecycle.Usage(), now=0).counted
    assert not chunk_lifecycle.record_chunk(stores, message, parts=second, usage=chunk_lifecycle.Usage(), now=0).counted
    assert wait_for_execution(deployed, batch.id)["status"] == "SUCCEEDED"
    done = client.batches.retrieve(batch.id)
    out, err = assert_invariants(client, done, ["req-0", "req-1"])
    assert [l.response.body["i"] for l in out] == [0, 1] and err == [] and done.error_file_id is None


def test_a_failure_mid_assembly_aborts_the_multipart_upload(stores, deployed, monkeypatch):
    """Finalize on real (moto) S3: the output's multipart upload has started when a part turns
    out missing; the upload is aborted (no object, no upload left open) and the batch is not
    finished; a retry once the part is back converges."""
    from functions.core import chunk_lifecycle, results
    from functions.core.aws.s3 import MultipartWriter
    from tests.builders import batch_record, cut, put_manifest

    monkeypatch.setattr(MultipartWriter, "PART_BYTES", 1024)  # parts start after 1 KiB
    s3_errors = clients.client("s3").exceptions
    batch_id, rows = "batch_01m8n7xjx1bekcr5r3de2q3dfw", [line(i, padding="p" * 600).encode() + b"\n" for i in range(4)]
    input_key = schema.batch_input_key("acme", batch_id)
    stores.objects.put(input_key, b"".join(rows))
    chunks = put_manifest(stores, cut(rows, 2), batch_id=batch_id).chunks
    record = batch_record(
        id=batch_id,
        input_file_id="file-x",
        status="in_progress",
        model="test-chat",
        total=4,
        chunk_count=2,
        accepting=True,
    )
    stores.batches.create(record)
    parts = {}
    for chunk in chunks:
        message = record.work_message(chunk)
        ok = [
            results.response_line(f"req-{i}", 200, {"object": "chat.completion", "pad": "o" * 800}, "r")
            for i in range(chunk.first_line - 1, chunk.first_line + 1)
        ]
        parts[chunk.chunk] = results.write_parts(stores.objects, message, ok)
        assert chunk_lifecycle.record_chunk(
            stores, message, parts=parts[chunk.chunk], usage=chunk_lifecycle.Usage(), now=200
        ).counted
    second_out = schema.chunk_part_key("acme", batch_id, 1, parts[1].attempt, "out")
    saved = stores.objects.get(second_out)
    stores.objects.delete(second_out)

    with pytest.raises(s3_errors.NoSuchKey):
        logic.finalize(stores, "acme", batch_id, "complete", now=300)
    s3 = clients.client("s3")
    assert s3.list_multipart_uploads(Bucket=deployed.bucket_name).get("Uploads", []) == []
    planned = stores.batches.get("acme", batch_id)
    assert planned.status == "finalizing" and planned.output_file_id is None
    assert stores.objects.list_keys(schema.file_key("acme", planned.planned_output_file_id)) == []

    stores.objects.put(second_out, saved)
    monkeypatch.undo()  # whole-size parts again (moto, like S3, refuses small non-last parts)
    assert logic.finalize(stores, "acme", batch_id, "complete", now=301) == {"status": "completed"}
    done = stores.batches.get("acme", batch_id)
    assert done.output_file_id == planned.planned_output_file_id
    output = stores.objects.get(schema.file_key("acme", done.output_file_id))
    assert [BatchOutputLine.model_validate_json(l).custom_id for l in output.splitlines()] == [
        f"req-{i}" for i in range(4)
    ]


# --- lost signals: the reconciling wait (docs/lifecycle.md, "Lost signals") ---------------------
class _LostSignals:
    """A Workflows port whose signals are lost on the way (the caller believes they were sent)."""

    def __init__(self, real):
        self.real, self.lost = real, []

    def start(self, name, payload):
        self.real.start(name, payload)

    def signal(self, token, output):
        self.lost.append(output)
        return True


@pytest.mark.settings(chunk_max_lines=2, drain_poll_seconds=0, drain_grace_seconds=30, reconcile_seconds=1)
def test_a_lost_completion_signal_is_recovered_by_the_next_check(client, stores, deployed, events):
    """The worker counts the last chunk and dies before signalling (or the signal fails) after
    its message is gone: nobody sends it again, the workflow's own check finds the batch done."""
    import dataclasses

    batch = start(client, stores, [line(i) for i in range(4)])
    first, last = take_work(deployed)
    assert run_one_chunk(stores, first).outcome.counted
    lossy = _LostSignals(stores.workflows)
    assert run_one_chunk(dataclasses.replace(stores, workflows=lossy), last).outcome.last
    assert lossy.lost == [{"outcome": "complete"}]  # the one completion signal, lost
    execution = wait_for_execution(deployed, batch.id, timeout=30)  # not the 24 h window
    assert execution["status"] == "SUCCEEDED", execution
    done = client.batches.retrieve(batch.id)
    assert done.status == "completed"
    out, err = assert_invariants(client, done, [f"req-{i}" for i in range(4)])
    assert len(out) == 4 and err == []
    assert "Check" in states_entered(deployed, batch.id, until=lambda names: "Finalize" in names)
    assert [e["detail-type"] for e in events()] == ["batch.completed"]


@pytest.mark.settings(chunk_max_lines=2, drain_poll_seconds=0, drain_grace_seconds=30, reconcile_seconds=1)
def test_a_lost_cancel_signal_is_recovered_by_the_next_check(client, stores, deployed, events, monkeypatch):
    batch = start(client, stores, [line(i) for i in range(4)])
    first, _ = take_work(deployed)
    run_one_chunk(stores, first)
    lost = []
    monkeypatch.setattr(stores.workflows, "signal", lambda token, output: lost.append(output) or True)
    assert client.batches.cancel(batch.id).status == "cancelling"
    monkeypatch.undo()  # only the API's cancel signal is lost; the workflow's own calls go through
    assert lost == [{"outcome": "cancel"}]
    assert wait_for_execution(deployed, batch.id, timeout=30)["status"] == "SUCCEEDED"
    done = client.batches.retrieve(batch.id)
    assert done.status == "cancelled"
    out, err = assert_invariants(client, done, [f"req-{i}" for i in range(4)])
    assert [l.custom_id for l in out] == ["req-0", "req-1"] and {l.error.code for l in err} == {"batch_cancelled"}
    assert [e["detail-type"] for e in events()] == ["batch.cancelled"]


@pytest.mark.settings(chunk_max_lines=2, drain_poll_seconds=0, drain_grace_seconds=30, reconcile_seconds=1)
def test_a_batch_waits_across_reconcile_periods_until_its_signal(client, stores, deployed):
    """Checks that find nothing to act on wait again (with a fresh token); the real signal still
    ends the wait."""
    batch = start(client, stores, [line(i) for i in range(2)])
    (only,) = take_work(deployed)
    entered = states_entered(deployed, batch.id, until=lambda names: names.count("WaitForSignal") >= 3)
    assert "Drain" not in entered and entered.count("Check") >= 2
    assert stores.batches.get("acme", batch.id).status == "in_progress"
    assert run_one_chunk(stores, only).outcome.last
    assert wait_for_execution(deployed, batch.id, timeout=30)["status"] == "SUCCEEDED"
    assert client.batches.retrieve(batch.id).status == "completed"


@pytest.mark.parametrize(
    "task",
    [
        "register",
        pytest.param(
            "check",
            marks=pytest.mark.settings(
                chunk_max_lines=2, drain_poll_seconds=0, drain_grace_seconds=30, reconcile_seconds=1
            ),
        ),
        "drain",
    ],
)
def test_a_transient_task_failure_is_retried_before_the_failure_path(client, stores, deployed, monkeypatch, task):
    from moto.stepfunctions.parser.asl.component.common.retry import retrier_decl

    monkeypatch.setattr(retrier_decl, "time", types.SimpleNamespace(sleep=lambda _: None))
    real, calls = getattr(logic, task), []

    def flaky(*args, **kwargs):
        calls.append(task)
        if len(calls) == 1:
            raise TimeoutError("the table did not answer")  # not a Lambda service error
        return real(*args, **kwargs)

    monkeypatch.setattr(logic, task, flaky)
    batch = submit(client, ("\n".join(line(i) for i in range(2)) + "\n").encode())
    run_ingest()
    wait_for_task_token(stores, "acme", batch.id)
    (only,) = take_work(deployed)
    if task == "check":  # the first check fails, its retry waits again
        wait_until(lambda: len(calls) >= 2, what="a retried check")
    run_one_chunk(stores, only)
    assert wait_for_execution(deployed, batch.id)["status"] == "SUCCEEDED"
    assert client.batches.retrieve(batch.id).status == "completed" and len(calls) >= 2
