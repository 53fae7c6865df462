"""Enqueued caps (docs/governance.md) on the fakes: ingest reserves a batch's requests and
prompt-token estimate on its (tenant, model) counter in the move to in_progress, refuses a batch
that would pass a cap (``token_limit_exceeded``), and every terminal write releases the reservation
exactly once (completed, failed, expired, cancelled; finalize or fail repeated; ingest repeated)."""

import json

import pytest

from functions.core import lifecycle, schema, tenants
from functions.core.lifecycle import Signal
from functions.core.records import BatchRecord
from functions.core.settings import ModelRoute, Settings
from functions.core.tenants import TenantPolicy
from functions.ingest import logic as ingest
from functions.sweeper import logic as sweeper
from functions.workflow import logic as workflow
from functions.workflow.tasks import TaskError
from tests.builders import assert_fields, batch_record
from tests.fakes.aws import fake_stores
from tests.unit.chunk_steps import run_chunk

CHAT = "/v1/chat/completions"
NOW = 1_000
QUEUE = "https://sqs.local/work-chat"
SETTINGS = Settings(
    table_name="t",
    bucket_name="b",
    chunk_max_lines=2,
    models={
        "chat": ModelRoute(endpoints=(CHAT,), queue_url=QUEUE),
        "other": ModelRoute(endpoints=(CHAT,), queue_url="q-o"),
    },
)


def content(n: int, model: str = "chat") -> bytes:
    rows = [
        json.dumps(
            {
                "custom_id": f"req-{i}",
                "method": "POST",
                "url": CHAT,
                "body": {"model": model, "messages": [{"role": "user", "content": "hello there"}]},
            }
        )
        for i in range(n)
    ]
    return ("\n".join(rows) + "\n").encode()


def tokens_of(data: bytes) -> int:
    """The documented estimate: ceil(bytes of each line, newline included, / 4), summed."""
    return sum(-(-(len(row) + 1) // 4) for row in data.splitlines())


def add_batch(stores, batch_id: str, data: bytes) -> None:
    key = schema.batch_input_key("acme", batch_id)
    stores.batches.put(batch_record(id=batch_id, created_at=NOW - 10))
    stores.objects.put(key, data)


def capped(stores, **caps) -> None:
    stores.tenants.put(TenantPolicy(tenant="acme", **caps))


def run(stores, batch_id: str = "b1") -> str:
    return ingest.ingest(stores, SETTINGS, "acme", batch_id, now=NOW)


def batch(stores, batch_id: str = "b1") -> BatchRecord:
    return stores.batches.get("acme", batch_id)


def counter(stores, model: str = "chat") -> tuple[int, int]:
    return stores.batches.enqueued("acme", model)


def test_ingest_reserves_requests_and_tokens_with_the_move_to_in_progress():
    stores = fake_stores()
    data = content(3)
    add_batch(stores, "b1", data)
    capped(stores, max_enqueued_tokens={"chat": 10_000}, max_enqueued_requests={"chat": 10})
    assert run(stores) == "in_progress"
    b = batch(stores)
    assert_fields(
        b, reserved_model="chat", reserved_requests=3, reserved_tokens=tokens_of(data), holds_reservation=True
    )
    assert counter(stores) == (3, tokens_of(data))


def test_a_tenant_without_caps_for_the_model_writes_no_counter():
    stores = fake_stores()
    add_batch(stores, "b1", content(3))
    capped(stores, max_enqueued_tokens={"other": 1})  # a cap on another model only
    changes, transition = [], stores.batches.transition
    stores.batches.transition = lambda tenant, batch_id, change, **kw: (
        changes.append(change),
        transition(tenant, batch_id, change, **kw),
    )[1]
    assert run(stores) == "in_progress"
    assert stores.batches.counters == {} and batch(stores).holds_reservation is None
    assert changes and all(change.counter is None for change in changes)  # no counter in any write


@pytest.mark.parametrize(
    ("caps", "wording"),
    [
        (
            {"max_enqueued_tokens": {"chat": 20}},
            "Enqueued token limit reached for chat in organization acme. "
            "Limit: 20 enqueued tokens. Please try again once some in_progress batches have been completed.",
        ),
        (
            {"max_enqueued_requests": {"chat": 2}},
            "Enqueued request limit reached for chat in organization acme. "
            "Limit: 2 enqueued requests. Please try again once some in_progress batches have been completed.",
        ),
    ],
)
def test_a_batch_over_a_cap_fails_at_validation_with_token_limit_exceeded(caps, wording):
    stores = fake_stores()
    add_batch(stores, "b1", content(3))
    capped(stores, **caps)
    assert run(stores) == "failed"
    b = batch(stores)
    assert b.errors == [{"code": "token_limit_exceeded", "message": wording, "param": None, "line": None}]
    assert b.failed_at == NOW and b.holds_reservation is None
    assert counter(stores) == (0, 0) and stores.queues.queue(QUEUE).bodies() == []
    assert stores.events.types() == ["batch.failed"]


def test_the_cap_counts_batches_in_progress_and_frees_up_when_one_completes():
    stores = fake_stores()
    data = content(2)
    capped(stores, max_enqueued_tokens={"chat": tokens_of(data) + 5})  # room for one such batch
    for batch_id in ("b1", "b2", "b3"):
        add_batch(stores, batch_id, data)
    assert run(stores, "b1") == "in_progress"
    assert run(stores, "b2") == "failed"  # b1 holds the room
    assert batch(stores, "b2").errors[0]["code"] == "token_limit_exceeded"
    run_chunk(stores, 0, now=NOW, batch_id="b1")
    assert workflow.finalize(stores, "acme", "b1", Signal.COMPLETE, NOW) == {"status": "completed"}
    assert counter(stores) == (0, 0)
    assert run(stores, "b3") == "in_progress"
    assert counter(stores) == (2, tokens_of(data))


def test_ingest_twice_reserves_once():
    stores = fake_stores()
    add_batch(stores, "b1", content(3))
    capped(stores, max_enqueued_requests={"chat": 5})
    assert run(stores) == "in_progress"
    assert run(stores) == "in_progress"  # a redelivered event
    # and one that raced the first: validated too, its move refused (the batch is not validating)
    stale = batch(stores).model_copy(update={"status": "validating"})
    assert ingest._validate_and_move(stores, SETTINGS, stale, NOW).status == "in_progress"
    assert counter(stores)[0] == 3


def started(stores, lines: int = 4) -> None:
    add_batch(stores, "b1", content(lines))
    capped(stores, max_enqueued_requests={"chat": 100}, max_enqueued_tokens={"chat": 100_000})
    assert run(stores) == "in_progress" and counter(stores)[0] == lines


def cancel(stores):
    if batch(stores).status == "in_progress":
        lifecycle.request_cancel(stores, batch(stores), NOW)
    return workflow.finalize(stores, "acme", "b1", Signal.CANCEL, NOW)


@pytest.mark.parametrize(
    ("end", "status"),
    [
        (lambda s: workflow.finalize(s, "acme", "b1", Signal.COMPLETE, NOW), "completed"),
        (lambda s: workflow.finalize(s, "acme", "b1", Signal.EXPIRE, NOW), "expired"),
        (cancel, "cancelled"),
        (lambda s: workflow.fail(s, "acme", "b1", TaskError(Error="States.TaskFailed"), NOW), "failed"),
    ],
)
def test_every_terminal_status_releases_once(end, status):
    stores = fake_stores()
    started(stores)
    run_chunk(stores, 0, now=NOW, batch_id="b1")
    run_chunk(stores, 1, now=NOW, batch_id="b1")
    assert end(stores) == {"status": status}
    assert counter(stores) == (0, 0) and batch(stores).holds_reservation is None
    # the same terminal task again (at-least-once), and a fail after it: nothing more released
    assert end(stores) == {"status": status}
    workflow.fail(stores, "acme", "b1", TaskError(Error="States.TaskFailed"), NOW + 1)
    assert counter(stores) == (0, 0)
    b = batch(stores)
    assert_fields(b, status=status, reserved_model="chat", reserved_requests=4)  # the record keeps what it held


def test_the_sweeper_expiring_a_stuck_batch_releases_it():
    stores = fake_stores()
    started(stores)
    late = NOW - 10 + 86_400 + SETTINGS.expiry_grace_seconds
    sweeper.sweep(stores, SETTINGS, now=late)
    assert batch(stores).status == "expired" and counter(stores) == (0, 0)
    sweeper.sweep(stores, SETTINGS, now=late + 60)
    assert counter(stores) == (0, 0)


def test_estimate_rounds_each_line_up():
    assert [tenants.estimate_tokens(n) for n in (0, 1, 4, 5, 8)] == [0, 1, 1, 2, 2]
