"""The DLQ logic against the in-memory ports: a dead-lettered chunk of an unknown batch, of a
closed batch, already counted by a worker, or recorded as failed lines (and the last one signals)."""

import json

from functions.chunk_dlq import logic
from functions.core import schema
from functions.core.messages import WorkMessage
from functions.core.wire import BatchOutputLine
from tests.builders import assert_fields, batch_record
from tests.fakes.aws import fake_stores

CHAT = "/v1/chat/completions"
INPUT_KEY = schema.batch_input_key("acme", "batch_1")
ROWS = [
    json.dumps({"custom_id": f"req-{i}", "method": "POST", "url": CHAT, "body": {"model": "m"}}).encode() + b"\n"
    for i in range(4)
]
SPLIT = len(ROWS[0]) + len(ROWS[1])


def setup(**over):
    stores = fake_stores()
    stores.objects.put(INPUT_KEY, b"".join(ROWS[:2]) + b"\n" + b"".join(ROWS[2:]) + b"not json\n")
    fields = dict(status="in_progress", model="m", total=5, chunk_count=2, accepting=True, task_token="tok")
    stores.batches.put(batch_record(**{**fields, **over}))
    return stores


def message(chunk: int, batch_id: str = "batch_1") -> WorkMessage:
    start, end, first, count = (0, SPLIT, 1, 2) if chunk == 0 else (SPLIT, len(b"".join(ROWS)) + 1 + 9, 3, 3)
    return WorkMessage(
        batch_id=batch_id,
        tenant="acme",
        chunk=chunk,
        input_key=INPUT_KEY,
        byte_start=start,
        byte_end=end,
        first_line=first,
        line_count=count,
        endpoint=CHAT,
        model="m",
        expires_at=100 + 86_400,
    )


def test_a_chunk_of_an_unknown_batch_is_dropped():
    stores = setup()
    assert logic.fail_chunk(stores, message(0, batch_id="batch_gone"), now=7) == logic.DeadLetterOutcome("no_batch")
    assert stores.batches.markers == {} and stores.faults.calls["objects.put"] == 1  # only setup's input


def test_a_closed_batch_is_left_alone():
    stores = setup(status="finalizing", accepting=False)
    assert logic.fail_chunk(stores, message(0), now=7).action == "batch_closed"
    assert (
        stores.batches.markers == {}
        and stores.objects.list_keys(schema.batch_prefix("acme", "batch_1") + "parts/") == []
    )


def test_a_chunk_a_worker_already_counted_keeps_its_results():
    stores = setup()
    first = logic.fail_chunk(stores, message(0), now=7)
    assert first == logic.DeadLetterOutcome("recorded", failed=2, last=False)
    marker, parts = (
        stores.batches.markers[("acme", "batch_1", 0)],
        stores.objects.list_keys(schema.batch_prefix("acme", "batch_1")),
    )
    again = logic.fail_chunk(stores, message(0), now=8)
    assert again.action == "already_counted"
    assert stores.batches.markers[("acme", "batch_1", 0)] == marker
    assert stores.objects.list_keys(schema.batch_prefix("acme", "batch_1")) == parts  # no second attempt's parts
    assert stores.batches.get("acme", "batch_1").failed == 2


def test_a_recorded_chunk_fails_every_line_and_the_last_signals():
    stores = setup()
    logic.fail_chunk(stores, message(0), now=7)
    outcome = logic.fail_chunk(stores, message(1), now=7)
    assert outcome == logic.DeadLetterOutcome("recorded", failed=3, last=True)
    marker = stores.batches.markers[("acme", "batch_1", 1)]
    assert (marker.completed, marker.failed, marker.recorded_at) == (0, 3, 7)
    err = stores.objects.get(schema.chunk_part_key("acme", "batch_1", 1, marker.attempt, "err"))
    lines = [BatchOutputLine.model_validate_json(l) for l in err.splitlines()]
    # the blank line is no request; a line without a usable custom_id gets line-<n>
    assert [l.custom_id for l in lines] == ["req-2", "req-3", "line-6"]
    assert {(l.error.code, l.response) for l in lines} == {("server_error", None)}
    assert "dead-lettered" in lines[0].error.message and "chunk 1" in lines[0].error.message
    batch = stores.batches.get("acme", "batch_1")
    assert_fields(batch, failed=5, chunks_done=2)
    assert stores.workflows.signals == [("tok", {"outcome": "complete"})]


def test_a_dead_lettered_chunk_keeps_its_checkpointed_lines():
    """Its workers checkpointed the first request line before the chunk was dead-lettered: that
    line keeps its answer (and its usage counts); only the others fail."""
    from functions.core import results
    from functions.core.records import ChunkRunRecord

    stores = setup()
    answer = results.response_line("req-2", 200, {"usage": {"prompt_tokens": 10, "completion_tokens": 3}}, "req_x")
    results.write_checkpoint(stores.objects, message(1), 0, [answer])
    stores.batches.save_chunk_run(
        ChunkRunRecord(
            tenant="acme", batch_id="batch_1", chunk=1, version=1, segments=[[0, 1]], failures=2, expires_at=10**10
        )
    )
    outcome = logic.fail_chunk(stores, message(1), now=7)
    assert outcome == logic.DeadLetterOutcome("recorded", failed=2, last=False)
    marker = stores.batches.markers[("acme", "batch_1", 1)]
    out = stores.objects.get(schema.chunk_part_key("acme", "batch_1", 1, marker.attempt, "out"))
    err = stores.objects.get(schema.chunk_part_key("acme", "batch_1", 1, marker.attempt, "err"))
    assert [BatchOutputLine.model_validate_json(l).custom_id for l in out.splitlines()] == ["req-2"]
    assert [BatchOutputLine.model_validate_json(l).custom_id for l in err.splitlines()] == ["req-3", "line-6"]
    batch = stores.batches.get("acme", "batch_1")
    assert_fields(batch, completed=1, failed=2, input_tokens=10, output_tokens=3)
