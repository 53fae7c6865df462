"""Ingest against the in-memory ports: OpenAI's validation codes, chunking and fan-out, the caps
(file size, 100 reported errors), a cancel between validation and fan-out, redelivered events and
a throttled send that a redelivery resumes."""

import itertools
import json

import pytest

from functions.core import lifecycle, schema
from functions.core.errors import Throttled
from functions.core.messages import ChunkManifest, WorkMessage
from functions.core.records import BatchRecord
from functions.core.settings import ModelRoute, Settings
from functions.ingest import logic
from tests.builders import assert_fields, batch_record
from tests.chunks import open_attempt
from tests.fakes.aws import fake_stores, throttle
from tests.helpers import with_changes

CHAT, EMBED = "/v1/chat/completions", "/v1/embeddings"
NOW = 1_000
QUEUE = "https://sqs.local/work-chat"
SETTINGS = Settings(
    table_name="t",
    bucket_name="b",
    chunk_max_lines=2,
    drain_poll_seconds=7,
    models={
        "chat": ModelRoute(endpoints=(CHAT,), queue_url=QUEUE),
        "embed": ModelRoute(endpoints=(EMBED,), queue_url="q-e"),
    },
)


def line(i: int, model: str = "chat", **over) -> str:
    obj = {"custom_id": f"req-{i}", "method": "POST", "url": CHAT, "body": {"model": model, "messages": []}}
    return json.dumps(with_changes(obj, over))


def setup(content: bytes | list[str], **batch_over):
    stores = fake_stores()
    if isinstance(content, list):
        content = ("\n".join(content) + "\n").encode()
    record = batch_record(**{"created_at": NOW - 10, **batch_over})
    stores.batches.put(record)
    stores.objects.put(record.input_key, content)
    return stores


def run(stores, settings=SETTINGS, **kwargs):
    return logic.ingest(stores, settings, "acme", "batch_1", now=NOW, **kwargs)


def current(stores) -> BatchRecord:
    return stores.batches.get("acme", "batch_1")


def sent(stores) -> list[WorkMessage]:
    return [WorkMessage.model_validate_json(b) for b in stores.queues.queue(QUEUE).bodies()]


def error_rows(stores):
    return [(e["code"], e["line"], e["param"]) for e in current(stores).errors]


def test_a_valid_batch_is_cut_into_chunks_fanned_out_and_its_workflow_started():
    content = ("\n".join(line(i) for i in range(5)) + "\n").encode()
    stores = setup(content)
    assert run(stores) == "in_progress"
    batch = current(stores)
    assert_fields(batch, status="in_progress", in_progress_at=NOW, model="chat", total=5, chunk_count=3)
    assert batch.accepting and batch.enqueued
    work = sent(stores)
    assert [(m.chunk, m.first_line, m.line_count) for m in work] == [(0, 1, 2), (1, 3, 2), (2, 5, 1)]
    assert work[0].byte_start == 0 and work[-1].byte_end == len(content)
    assert all(a.byte_end == b.byte_start for a, b in itertools.pairwise(work))  # contiguous, whole lines
    assert all(m.model == "chat" and m.expires_at == NOW - 10 + 86_400 for m in work)
    manifest = ChunkManifest.model_validate_json(stores.objects.get(schema.batch_manifest_key("acme", "batch_1")))
    assert [c.chunk for c in manifest.chunks] == [0, 1, 2]
    assert stores.workflows.started == {
        # the first wait for a signal lasts the reconcile period (300 s by default), not the window
        "batch_1": {
            "tenant": "acme",
            "batch_id": "batch_1",
            "timeout_seconds": 300,
            "poll_seconds": 7,
            "reconcile_seconds": 300,
        }
    }


@pytest.mark.parametrize(
    ("lines", "expected"),
    [
        ([line(0), "{not json", line(2)], [("invalid_json_line", 2, None)]),
        ([line(0), "[1, 2]"], [("invalid_json_line", 2, None)]),
        ([line(0, custom_id=None)], [("missing_required_parameter", 1, "custom_id")]),
        ([line(0, custom_id="")], [("invalid_value", 1, "custom_id")]),
        ([line(0), line(1), line(0)], [("duplicate_custom_id", 3, "custom_id")]),
        ([line(0), line(1, method="GET")], [("invalid_method", 2, "method")]),
        ([line(0), line(1, url=EMBED)], [("invalid_url", 2, "url")]),
        ([line(0), line(1, body=None)], [("missing_required_parameter", 2, "body")]),
        ([line(0), line(1, body_model=7)], [("missing_required_parameter", 2, "body.model")]),
        ([line(0), line(1, model="embed")], [("mismatched_model", 2, "body.model")]),
        ([line(0, model="gpt-4o")], [("model_not_found", 1, "body.model")]),
        ([line(0, model="embed")], [("model_not_found", 1, "body.model")]),  # served, not for chat
        ([line(0), line(1, body_stream=True)], [("invalid_value", 2, "body.stream")]),
        # vLLM's run-batch case: a string an engine reads as true; any non-boolean is refused
        ([line(0), line(1, body_stream="True")], [("invalid_type", 2, "body.stream")]),
        (
            [line(0, body_stream=1), line(1, body_stream="false")],
            [("invalid_type", 1, "body.stream"), ("invalid_type", 2, "body.stream")],
        ),
        ([line(0), "", line(2, method="PUT"), "{"], [("invalid_method", 3, "method"), ("invalid_json_line", 4, None)]),
        (["", "  "], [("empty_file", None, None)]),
    ],
)
def test_validation_codes_fail_the_batch_with_line_numbers(lines, expected):
    stores = setup(lines)
    assert run(stores) == "failed"
    assert error_rows(stores) == expected
    batch = current(stores)
    assert_fields(batch, failed_at=NOW, in_progress_at=None, enqueued=False)
    assert sent(stores) == [] and stores.workflows.started == {}
    assert stores.events.types() == ["batch.failed"]


def test_stream_false_or_null_and_a_last_line_without_its_newline_are_accepted():
    null_stream = json.loads(line(1))
    null_stream["body"]["stream"] = None
    content = (line(0, body_stream=False) + "\n" + json.dumps(null_stream)).encode()  # curator writes no final newline
    stores = setup(content)
    assert run(stores) == "in_progress"
    assert current(stores).total == 2
    assert sent(stores)[-1].byte_end == len(content)


def test_a_line_over_the_size_limit_and_a_non_utf8_line():
    stores = setup(line(0).encode() + b"\n" + line(1, body_pad="y" * 300).encode() + b'\n{"custom_id": "\xff"}\n')
    run(stores, SETTINGS.model_copy(update={"max_line_bytes": 200}))
    assert error_rows(stores) == [("line_too_large", 2, None), ("invalid_json_line", 3, None)]


def test_too_many_requests_stops_at_the_first_line_over():
    stores = setup([line(i) for i in range(5)])
    run(stores, SETTINGS.model_copy(update={"max_batch_lines": 3}))
    assert error_rows(stores) == [("too_many_tasks", 4, None)]


def test_an_input_over_the_batch_file_limit_fails_as_file_too_large():
    content = ("\n".join(line(i) for i in range(3)) + "\n").encode()
    stores = setup(content)
    run(stores, SETTINGS.model_copy(update={"max_batch_file_bytes": len(content) - 1}))
    (error,) = current(stores).errors
    assert (error["code"], error["line"]) == ("file_too_large", None) and str(len(content)) in error["message"]
    # exactly at the limit is accepted
    stores = setup(content)
    assert run(stores, SETTINGS.model_copy(update={"max_batch_file_bytes": len(content)})) == "in_progress"


def test_at_most_100_errors_are_reported():
    stores = setup([line(0)] + ["{bad"] * 150)
    run(stores)
    rows = error_rows(stores)
    assert len(rows) == 100
    assert rows == [("invalid_json_line", n, None) for n in range(2, 102)]  # the first 100, in order


def test_an_event_for_a_record_not_visible_yet_waits_then_retries():
    stores = setup([line(0)])
    record = stores.batches.items.pop(("acme", "batch_1"))
    waits = []

    def wait():
        waits.append(1)
        if len(waits) == 2:
            stores.batches.items[("acme", "batch_1")] = record  # the API's write becomes visible

    assert run(stores, wait=wait, attempts=5) == "in_progress"
    assert len(waits) == 2 and stores.faults.calls["batches.get"] == 3
    gone = fake_stores()
    with pytest.raises(logic.BatchNotVisibleYet):
        logic.ingest(gone, SETTINGS, "acme", "batch_1", now=NOW, wait=lambda: None, attempts=4)
    assert gone.faults.calls["batches.get"] == 4


def test_a_redelivered_event_changes_nothing():
    stores = setup([line(i) for i in range(3)])
    run(stores)
    before = (current(stores), stores.objects.data.copy(), sent(stores), dict(stores.workflows.started))
    assert run(stores) == "in_progress"
    assert run(stores) == "in_progress"
    assert (current(stores), stores.objects.data, sent(stores), stores.workflows.started) == before
    assert stores.faults.calls["queue.send"] == 1 and stores.faults.calls["workflows.start"] == 1


@pytest.mark.parametrize("lines", [[line(0), "{bad"], [line(0), line(1)]])
def test_a_duplicate_event_racing_the_first_moves_the_state_once(lines):
    """Both deliveries read the batch as validating; the second's conditional write loses and it
    carries on from the state the first wrote (no second event, no second fan-out)."""
    stores = setup(lines)
    stale = current(stores)
    run(stores)
    after = current(stores)
    real_get = stores.batches.get
    reads = []

    def get(tenant, batch_id):  # the duplicate's first read predates the first delivery's write
        reads.append(1)
        return stale if len(reads) == 1 else real_get(tenant, batch_id)

    stores.batches.get = get
    assert run(stores) == after.status
    assert current(stores) == after
    assert stores.events.types() == (["batch.failed"] if after.status == "failed" else [])
    assert stores.faults.calls["queue.send"] == (0 if after.status == "failed" else 1)


@pytest.mark.parametrize("op", ["queue.send", "workflows.start", "batches.transition"])
def test_a_throttled_step_raises_and_the_redelivery_resumes(op):
    stores = setup([line(i) for i in range(3)])
    stores.faults.fail(op, throttle())
    with pytest.raises(Throttled):
        run(stores)
    assert not current(stores).enqueued
    assert run(stores) == "in_progress"
    batch = current(stores)
    assert batch.enqueued and batch.chunk_count == 2 and "batch_1" in stores.workflows.started
    # every chunk is in the queue (a resend after a partial fan-out duplicates; workers count once)
    assert {m.chunk for m in sent(stores)} == {0, 1}


def test_cancelled_while_validating_is_never_enqueued():
    stores = setup([line(0)], status="cancelling", cancelling_at=NOW - 5)
    assert run(stores) == "cancelled"
    batch = current(stores)
    assert_fields(batch, cancelled_at=NOW, in_progress_at=None)
    assert sent(stores) == [] and stores.workflows.started == {} and stores.events.types() == ["batch.cancelled"]


def test_cancel_between_validation_and_fan_out_still_starts_the_workflow_without_work():
    """Ingest validated and moved the batch to in_progress, then died before fanning out; the
    user cancelled meanwhile. The redelivery must start the workflow (which finalizes the cancel)
    but send no work."""
    stores = setup([line(i) for i in range(3)])
    real_get = stores.objects.get

    def get(key):  # reading the manifest back, just before the send, throttles once
        if key == schema.batch_manifest_key("acme", "batch_1") and stores.faults.calls["manifest"] == 0:
            stores.faults.calls["manifest"] += 1
            raise throttle()
        return real_get(key)

    stores.objects.get = get
    with pytest.raises(Throttled):
        run(stores)
    assert current(stores).status == "in_progress" and stores.workflows.started == {}
    lifecycle.request_cancel(stores, current(stores), NOW + 1)  # the API's cancel
    assert run(stores) == "cancelling"
    assert sent(stores) == []
    assert "batch_1" in stores.workflows.started and current(stores).enqueued


def test_cancel_during_fan_out_leaves_work_the_workers_skip():
    """The cancel lands while ingest sends the chunks: the workflow still starts, and the chunks
    already sent open no attempt (the batch is no longer in progress)."""
    stores = setup([line(i) for i in range(3)])
    queue = stores.queues.queue(QUEUE)
    real_send = queue.send

    def send_then_cancel(bodies):
        real_send(bodies)
        lifecycle.request_cancel(stores, current(stores), NOW + 1)

    queue.send = send_then_cancel
    run(stores)
    assert "batch_1" in stores.workflows.started and current(stores).enqueued
    assert [open_attempt(stores, m) for m in sent(stores)] == [None, None]


def test_the_ingest_lambda_waits_for_a_record_briefly_first_then_up_to_its_patience(monkeypatch):
    """The snapshot's event can beat the batch record's write (the create handler copies first):
    the first pauses are short, and the whole patience stays about 1.8 s."""
    from functions.ingest import handler as ingest_handler

    slept = []
    monkeypatch.setattr(ingest_handler.time, "sleep", slept.append)
    wait = ingest_handler._record_waits()
    for _ in range(ingest_handler.RECORD_ATTEMPTS - 1):
        wait()
    assert slept[0] <= 0.02 and slept == sorted(slept)
    assert 1.5 <= sum(slept) <= 2.0


def test_an_audio_line_on_a_host_not_allowed_is_refused_with_its_line_number():
    audio = "/v1/audio/transcriptions"
    settings = SETTINGS.model_copy(
        update={
            "models": {"whisper": ModelRoute(endpoints=(audio,), queue_url=QUEUE)},
            "allowed_media_domains": ("media.example.com",),
        }
    )

    def audio_line(i: int, url: str) -> str:
        body = {"model": "whisper", "file_url": url}
        return json.dumps({"custom_id": f"a-{i}", "method": "POST", "url": audio, "body": body})

    stores = setup(
        [audio_line(0, "https://media.example.com/a.wav"), audio_line(1, "https://evil.example.net/a.wav?sig=s3cr3t")],
        endpoint=audio,
    )
    assert run(stores, settings) == "failed"
    assert error_rows(stores) == [("invalid_value", 2, "body.file_url")]
    message = current(stores).errors[0]["message"]
    assert "'evil.example.net' is not an allowed media domain" in message and "s3cr3t" not in message
    accepted = setup(
        [audio_line(0, "https://media.example.com/a.wav"), audio_line(1, "data:audio/wav;base64,AAAA")], endpoint=audio
    )
    assert run(accepted, settings) == "in_progress"
