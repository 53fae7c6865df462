"""The output-token budget (docs/governance.md) on the fakes: counted chunks charge their
output tokens to the tenant's period item in the count itself (once, only for a tenant with a
budget); at the budget, ``reject`` refuses creates with 429 ``insufficient_quota`` and ``stop``
fails a batch at ingest with ``budget_exceeded`` before any of it runs."""

import json

import pytest

from functions.api import batches, files
from functions.api.protocol import CreateBatchBody
from functions.core import chunk_lifecycle, schema, tenants
from functions.core.chunk_lifecycle import Usage
from functions.core.errors import QuotaExceeded
from functions.core.messages import WorkMessage
from functions.core.results import Parts
from functions.core.settings import ModelRoute, Settings
from functions.core.tenants import TenantPolicy
from functions.ingest import logic as ingest
from tests.fakes.aws import fake_stores

CHAT = "/v1/chat/completions"
NOW = 1_796_083_200 + 3_600  # 2026-12-01 01:00 UTC
MONTH = "MONTH#2026-12"
SETTINGS = Settings(
    table_name="t",
    bucket_name="b",
    allowed_endpoints=(CHAT,),
    models={"m": ModelRoute(endpoints=(CHAT,), queue_url="q-m")},
)


def data(n: int = 3) -> bytes:
    return "".join(
        json.dumps({"custom_id": f"r{i}", "method": "POST", "url": CHAT, "body": {"model": "m"}}) + "\n"
        for i in range(n)
    ).encode()


def create(stores, now=NOW):
    f = files.create_file(
        stores, SETTINGS, "acme", filename="in.jsonl", content=data(), purpose="batch", expires_after=None, now=now
    )
    return batches.create_batch(
        stores, SETTINGS, "acme", CreateBatchBody(input_file_id=f.id, endpoint=CHAT, completion_window="24h"), now=now
    )


def ingested(stores, now=NOW):
    batch = create(stores, now)
    ingest.ingest(stores, SETTINGS, "acme", batch.id, now=now)
    return stores.batches.get("acme", batch.id)


def count(stores, batch_id: str, chunk: int, output_tokens: int, now=NOW):
    (body,) = [b for b in stores.queues.queue("q-m").bodies() if batch_id in b and f'"chunk":{chunk},' in b][:1]
    message = WorkMessage.model_validate_json(body)
    parts = Parts(attempt="a", completed=1, failed=0)
    return chunk_lifecycle.record_chunk(stores, message, parts=parts, usage=Usage(output_tokens=output_tokens), now=now)


def test_the_period_items_are_utc_calendar_days_and_months():
    assert tenants.budget_sk("month", NOW) == MONTH
    assert tenants.budget_sk("day", NOW) == "DAY#2026-12-01"
    assert tenants.budget_sk("day", NOW - 3_601) == "DAY#2026-11-30"


def test_counted_chunks_charge_the_budget_once():
    stores = fake_stores()
    stores.tenants.put(TenantPolicy(tenant="acme", output_token_budget=1_000))
    batch = ingested(stores)
    assert batch.budget_period == "month"
    assert WorkMessage.model_validate_json(stores.queues.queue("q-m").bodies()[0]).budget_period == "month"
    assert count(stores, batch.id, 0, 40).counted
    assert not count(stores, batch.id, 0, 40).counted  # a redelivered chunk: counted and charged once
    assert stores.batches.budget_used("acme", MONTH).output_tokens == 40
    assert stores.batches.budget_used("acme", MONTH).output_tokens == 40


def test_a_tenant_without_a_budget_is_charged_nothing():
    stores = fake_stores()
    batch = ingested(stores)
    assert batch.budget_period is None
    assert '"budget_period"' not in stores.queues.queue("q-m").bodies()[0]  # absent from the message
    count(stores, batch.id, 0, 40)
    assert stores.batches.budgets == {}


def test_reject_answers_429_insufficient_quota_at_the_budget_and_counts_no_creation():
    stores = fake_stores()
    stores.tenants.put(TenantPolicy(tenant="acme", output_token_budget=50, batches_per_hour=10))
    count(stores, ingested(stores).id, 0, 49)
    count(stores, ingested(stores).id, 0, 1)  # 49 < 50: admitted, and its chunk makes 50
    with pytest.raises(QuotaExceeded) as caught:
        create(stores)
    error = caught.value
    assert (error.status, error.body()["error"]["type"], error.code) == (
        429,
        "insufficient_quota",
        "insufficient_quota",
    )
    assert error.message.startswith("You exceeded your current quota")
    assert stores.tenants.counters[("acme", tenants.window_start(NOW))] == 2  # the refusal counted nothing
    create(stores, now=NOW + 31 * 86_400)  # next month: admitted again


def test_stop_fails_a_batch_at_ingest_once_the_budget_is_used_up():
    stores = fake_stores()
    stores.tenants.put(TenantPolicy(tenant="acme", output_token_budget=50, budget_action="stop"))
    first = ingested(stores)
    count(stores, first.id, 0, 50)
    sent = len(stores.queues.queue("q-m").bodies())
    second = ingested(stores)  # created (stop does not refuse creates), ended at ingest
    assert second.status == "failed"
    (error,) = second.errors
    assert error["code"] == "budget_exceeded" and "50 tokens per month" in error["message"]
    assert len(stores.queues.queue("q-m").bodies()) == sent  # nothing of it was enqueued
