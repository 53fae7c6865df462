"""Tenant policy (docs/governance.md) against the in-memory ports: the hourly creation limit at
batch create (429 with Retry-After, window roll-over, a refused create counts nothing and stores nothing), the
model allowlist at ingest, and the defaults (no record: no limits)."""

import json

import pytest

from functions.api import batches, files
from functions.api.protocol import CreateBatchBody
from functions.core.errors import InvalidRequest, RateLimited
from functions.core.settings import ModelRoute, Settings
from functions.core.tenants import TenantPolicy
from functions.ingest import logic
from tests.builders import batch_record
from tests.fakes.aws import fake_stores

CHAT = "/v1/chat/completions"
#: 10:00:00 UTC on 2023-11-14 plus 20 minutes: 40 minutes (2,400 s) left in the hour.
HOUR = 1_699_956_000
NOW = HOUR + 20 * 60
SETTINGS = Settings(
    table_name="t",
    bucket_name="b",
    allowed_endpoints=(CHAT,),
    models={
        "m": ModelRoute(endpoints=(CHAT,), queue_url="q-m"),
        "other": ModelRoute(endpoints=(CHAT,), queue_url="q-o"),
    },
)


@pytest.fixture
def stores():
    return fake_stores()


def create(stores, *, now=NOW, tenant="acme"):
    f = files.create_file(
        stores, SETTINGS, tenant, filename="in.jsonl", content=b"{}\n", purpose="batch", expires_after=None, now=now
    )
    body = CreateBatchBody(input_file_id=f.id, endpoint=CHAT, completion_window="24h")
    return batches.create_batch(stores, SETTINGS, tenant, body, now=now)


def test_no_record_means_no_limit(stores):
    for _ in range(20):
        create(stores)
    assert stores.faults.calls["tenants.count_creation"] == 0  # nothing counted without a limit


def test_under_the_limit_then_429_with_the_seconds_to_the_end_of_the_hour(stores):
    stores.tenants.put(TenantPolicy(tenant="acme", batches_per_hour=2))
    create(stores)
    create(stores, now=NOW + 5)
    before = set(stores.objects.list_keys("batches/"))
    with pytest.raises(RateLimited) as caught:
        create(stores, now=NOW + 10)
    error = caught.value
    assert (error.status, error.type, error.code) == (429, "rate_limit_error", "rate_limit_exceeded")
    assert error.retry_after == 40 * 60 - 10
    assert "2 per hour" in error.message
    assert set(stores.objects.list_keys("batches/")) == before  # no snapshot, no batch
    assert len(stores.batches.list("acme", after=None, limit=100)[0]) == 2


def test_the_window_rolls_over_on_the_hour(stores):
    stores.tenants.put(TenantPolicy(tenant="acme", batches_per_hour=1))
    create(stores)
    with pytest.raises(RateLimited) as caught:
        create(stores, now=HOUR + 3599)
    assert caught.value.retry_after == 1
    create(stores, now=HOUR + 3600)  # a new hour: admitted again
    with pytest.raises(RateLimited) as caught:
        create(stores, now=HOUR + 3600)
    assert caught.value.retry_after == 3600


def test_the_limit_is_per_tenant(stores):
    stores.tenants.put(TenantPolicy(tenant="acme", batches_per_hour=1))
    create(stores)
    create(stores, tenant="globex")
    create(stores, tenant="globex")
    with pytest.raises(RateLimited):
        create(stores)


def test_zero_per_hour_refuses_every_create(stores):
    stores.tenants.put(TenantPolicy(tenant="acme", batches_per_hour=0))
    with pytest.raises(RateLimited):
        create(stores)


def test_a_create_refused_for_another_reason_counts_nothing(stores):
    stores.tenants.put(TenantPolicy(tenant="acme", batches_per_hour=1))
    with pytest.raises(InvalidRequest):
        batches.create_batch(
            stores,
            SETTINGS,
            "acme",
            CreateBatchBody(input_file_id="file-x", endpoint="/v1/nope", completion_window="24h"),
            now=NOW,
        )
    create(stores)  # the one create of the hour is still available


def test_policy_round_trip_and_defaults():
    policy = TenantPolicy(
        tenant="acme",
        allowed_models=["m"],
        batches_per_hour=3,
        max_enqueued_requests={"m": 10},
        output_token_budget=1_000_000,
        budget_period="day",
    )
    assert TenantPolicy.from_item(policy.to_item()) == policy
    assert TenantPolicy(tenant="acme").allows("anything")
    assert policy.allows("m") and not policy.allows("other")
    with pytest.raises(ValueError):
        TenantPolicy(tenant="acme", batches_per_hour=-1)
    with pytest.raises(ValueError):
        TenantPolicy(tenant="no spaces")


# --- the allowlist, at ingest -----------------------------------------------------------------
def ingest(stores, models):
    content = "".join(
        json.dumps({"custom_id": f"r{i}", "method": "POST", "url": CHAT, "body": {"model": m, "messages": []}}) + "\n"
        for i, m in enumerate(models)
    ).encode()
    record = batch_record(created_at=NOW)
    stores.batches.put(record)
    stores.objects.put(record.input_key, content)
    logic.ingest(stores, SETTINGS, "acme", "batch_1", now=NOW)
    return stores.batches.get("acme", "batch_1")


def test_a_model_not_allowed_fails_the_batch_with_model_not_allowed(stores):
    stores.tenants.put(TenantPolicy(tenant="acme", allowed_models=["other"]))
    batch = ingest(stores, ["m", "m"])
    assert batch.status == "failed"
    assert [(e["code"], e["line"], e["param"]) for e in batch.errors] == [
        ("model_not_allowed", 1, "body.model"),
        ("model_not_allowed", 2, "body.model"),
    ]
    assert stores.queues.queue("q-m").bodies() == []  # nothing enqueued
    assert stores.faults.calls["tenants.get"] == 1  # the policy is read once per batch


def test_an_allowed_model_and_no_record_ingest_as_today(stores):
    stores.tenants.put(TenantPolicy(tenant="acme", allowed_models=["m"]))
    assert ingest(stores, ["m", "m"]).status == "in_progress"
    other = fake_stores()
    assert ingest(other, ["other"]).status == "in_progress"


def test_an_unserved_model_is_still_model_not_found_whatever_the_allowlist(stores):
    stores.tenants.put(TenantPolicy(tenant="acme", allowed_models=["ghost"]))
    assert [e["code"] for e in ingest(stores, ["ghost"]).errors] == ["model_not_found"]
