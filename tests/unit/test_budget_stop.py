"""``budget_action="stop"`` stops the lines of batches already running (docs/governance.md
"Output-token budget"): ingest snapshots the budget into the work messages; the worker's
``BudgetWatch`` reads the period's charged tokens (at most every few seconds per tenant) and a line
that would enter the engine once the budget is used up becomes a ``budget_exceeded`` error line,
never sent; the chunk is still counted exactly once and charges only what ran."""

import asyncio
import json

from functions.core import schema, tenants
from functions.core.budgets import BudgetCaps
from functions.core.messages import WorkMessage
from functions.core.tenants import TenantPolicy
from gpu_worker.admission import Admission
from gpu_worker.budget import BudgetWatch
from tests.builders import delivered, running_batch, work_message
from tests.chunks import part_bytes, process_chunk
from tests.fakes.aws import fake_stores
from tests.fakes.engine import InProcessEngine, chat_answer
from tests.unit.test_output_budget import MONTH, NOW, ingested

CHAT = "/v1/chat/completions"


async def direct(fn, *args, **kwargs):
    return fn(*args, **kwargs)


def seed(stores, n: int, *, budget_stop: int | None, batch_id: str = "batch_1") -> WorkMessage:
    caps = BudgetCaps(output_tokens=budget_stop) if budget_stop is not None else None
    lines = [
        json.dumps(
            {
                "custom_id": f"req-{i}",
                "method": "POST",
                "url": CHAT,
                "body": {"model": "test-chat", "messages": [{"role": "user", "content": f"line {i}"}]},
            }
        )
        + "\n"
        for i in range(n)
    ]
    key = schema.batch_input_key("acme", batch_id)
    data = "".join(lines).encode()
    stores.objects.put(key, data)
    batch = running_batch(
        id=batch_id, created_at=NOW, total=n, model="test-chat", budget_period="month", budget_stop=caps
    )
    stores.batches.put(batch)
    return delivered(work_message(batch, byte_end=len(data), line_count=n, budget_period="month", budget_stop=caps))


def run(stores, message, engine, watch, admission=None):
    return asyncio.run(
        process_chunk(
            stores,
            message,
            engine,
            io=direct,
            max_line_bytes=1 << 20,
            now=lambda: NOW,
            budget=watch,
            admission=admission,
            owner="m",
        )
    )


def parts(stores, batch_id: str = "batch_1") -> dict[str, list[dict]]:
    marker = stores.batches.counted_chunk("acme", batch_id, 0)
    out = {}
    for kind in ("out", "err"):
        raw = part_bytes(stores.objects, "acme", batch_id, 0, marker.attempt, kind) if marker else b""
        out[kind] = [json.loads(x) for x in raw.splitlines()]
    return out


def test_ingest_snapshots_a_stop_budget_into_the_work_messages_and_a_reject_budget_not():
    stores = fake_stores()
    stores.tenants.put(TenantPolicy(tenant="acme", output_token_budget=500, budget_action="stop"))
    batch = ingested(stores)
    assert batch.budget_stop == BudgetCaps(output_tokens=500)
    assert {WorkMessage.model_validate_json(b).budget_stop for b in stores.queues.queue("q-m").bodies()} == {
        BudgetCaps(output_tokens=500)
    }

    stores = fake_stores()
    stores.tenants.put(TenantPolicy(tenant="acme", output_token_budget=500, budget_action="reject"))
    ingested(stores)
    assert all('"budget_stop"' not in b for b in stores.queues.queue("q-m").bodies())  # absent, not null


def test_a_used_up_budget_sends_no_line_and_the_chunk_still_counts_once():
    stores = fake_stores()
    stores.batches.charge("acme", MONTH, output_tokens=100)
    message = seed(stores, 4, budget_stop=100)
    engine = InProcessEngine()
    report = run(stores, message, engine, BudgetWatch(stores, direct, now=lambda: NOW))
    assert engine.requests == []
    assert (report.completed, report.failed) == (0, 4) and report.outcome.counted
    err = parts(stores)["err"]
    assert [(e["custom_id"], e["error"]["code"]) for e in err] == [
        (f"req-{i}", tenants.BUDGET_EXCEEDED) for i in range(4)
    ]
    assert "100 tokens per month" in err[0]["error"]["message"]
    assert stores.batches.budget_used("acme", MONTH).output_tokens == 100  # nothing ran, nothing charged


def test_the_budget_reached_while_a_chunk_runs_stops_its_remaining_lines():
    """One line in the engine at a time; another chunk of the tenant is charged 30 tokens each
    time this one's line is answered (as if it were counted then): at 100 the rest stop."""
    stores = fake_stores()
    message = seed(stores, 8, budget_stop=100)

    def respond(path, body, seen):
        stores.batches.charge("acme", MONTH, output_tokens=30)
        return 200, chat_answer(body, completion_tokens=5)

    engine = InProcessEngine(respond)
    watch = BudgetWatch(stores, direct, now=lambda: NOW, every=0)  # read before every line
    report = run(stores, message, engine, watch, admission=Admission(1))
    assert len(engine.requests) == 4  # 0, 30, 60, 90 charged before each: the 5th sees 120
    got = parts(stores)
    assert [o["custom_id"] for o in got["out"]] == ["req-0", "req-1", "req-2", "req-3"]
    assert [e["custom_id"] for e in got["err"]] == ["req-4", "req-5", "req-6", "req-7"]
    assert {e["error"]["code"] for e in got["err"]} == {tenants.BUDGET_EXCEEDED}
    assert report.usage.output_tokens == 20  # only the lines that ran are charged by this chunk


def test_the_worker_reads_a_tenants_budget_item_at_most_once_per_interval():
    stores = fake_stores()
    first, second = seed(stores, 6, budget_stop=10_000), seed(stores, 6, budget_stop=10_000, batch_id="batch_2")
    clock = [NOW]
    watch = BudgetWatch(stores, direct, now=lambda: clock[0], every=5.0)
    engine = InProcessEngine()
    run(stores, first, engine, watch)
    run(stores, second, engine, watch)
    assert len(engine.requests) == 12 and watch.reads == 1
    clock[0] += 5
    assert asyncio.run(watch.stop_reason(first)) is None and watch.reads == 2


def test_a_batch_without_a_stop_budget_never_reads_the_budget():
    stores = fake_stores()
    message = seed(stores, 3, budget_stop=None)
    watch = BudgetWatch(stores, direct, now=lambda: NOW)
    report = run(stores, message, InProcessEngine(), watch)
    assert report.completed == 3 and watch.reads == 0
    assert stores.faults.calls["batches.budget_used"] == 0
