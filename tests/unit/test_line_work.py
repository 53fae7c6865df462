"""The work one line may ask (functions/core/work.py): what a body asks of the engine, the
deployment's and a tenant's bounds on it, enforced at ingest with the line number and OpenAI's
codes before anything runs; enqueued-request caps counting engine sequences; a token cap that
reserves the output lines ask for; and an input-token budget."""

import json

import pytest

from functions.core import schema, tenants
from functions.core.budgets import BudgetCaps, Spent
from functions.core.errors import QuotaExceeded
from functions.core.messages import WorkMessage
from functions.core.records import BatchRecord
from functions.core.settings import ModelRoute, Settings
from functions.core.tenants import TenantPolicy
from functions.core.work import Bounds, PolicyBounds, Work, work_of
from functions.ingest import logic as ingest
from tests.builders import assert_fields, batch_record
from tests.fakes.aws import fake_stores

CHAT, COMPLETIONS, EMBEDDINGS = "/v1/chat/completions", "/v1/completions", "/v1/embeddings"
NOW = 1_796_083_200  # 2026-12-01
QUEUE = "q-m"


def settings(**bounds) -> Settings:
    return Settings(
        table_name="t",
        bucket_name="b",
        line_bounds=Bounds(**bounds),
        models={
            "m": ModelRoute(endpoints=(CHAT, COMPLETIONS), queue_url=QUEUE),
            "e": ModelRoute(endpoints=(EMBEDDINGS,), queue_url="q-e"),
        },
    )


@pytest.mark.parametrize(
    ("endpoint", "body", "work"),
    [
        (CHAT, {"messages": []}, Work(n=1, inputs=1, output_limit=None)),
        (CHAT, {"n": 4, "max_tokens": 10}, Work(n=4, inputs=1, output_limit=10, output_field="max_tokens")),
        (
            CHAT,
            {"max_completion_tokens": 7, "max_tokens": 99},
            Work(n=1, inputs=1, output_limit=7, output_field="max_completion_tokens"),
        ),
        (
            COMPLETIONS,
            {"prompt": ["a", "b", "c"], "n": 2, "max_tokens": 5},
            Work(n=2, inputs=3, output_limit=5, output_field="max_tokens"),
        ),
        (COMPLETIONS, {"prompt": [1, 2, 3]}, Work(n=1, inputs=1, output_limit=None)),  # one prompt as token ids
        (
            COMPLETIONS,
            {"prompt": [[1, 2], [3]], "best_of": 3, "n": 2},
            Work(n=3, inputs=2, output_limit=None, n_field="best_of"),
        ),
        (EMBEDDINGS, {"input": ["a"] * 500}, Work(n=1, inputs=500, output_limit=0)),
        (EMBEDDINGS, {"input": "one"}, Work(n=1, inputs=1, output_limit=0)),
        ("/v1/rerank", {"query": "q", "documents": ["a", "b"]}, Work(n=1, inputs=2, output_limit=0)),
        ("/v1/score", {"text_1": "q", "text_2": ["a", "b", "c"]}, Work(n=1, inputs=3, output_limit=0)),
        (
            "/v1/responses",
            {"input": "hi", "max_output_tokens": 30},
            Work(n=1, inputs=1, output_limit=30, output_field="max_output_tokens"),
        ),
        (
            CHAT,
            {"n": True, "max_tokens": "9"},
            Work(n=1, inputs=1, output_limit=None),
        ),  # not integers: the engine judges them
    ],
)
def test_the_work_a_body_asks(endpoint, body, work):
    assert work_of(endpoint, body) == work


def test_a_tenant_bound_only_ever_tightens_the_deployment_bound():
    deployment = Bounds(max_n=8, max_inputs=100, max_output_tokens=1_000)
    assert deployment.tighter(PolicyBounds(max_n=16, max_output_tokens=500)) == Bounds(
        max_n=8, max_inputs=100, max_output_tokens=500
    )
    assert Bounds().tighter(PolicyBounds(max_output_tokens=64)).max_output_tokens == 64
    assert deployment.tighter(None) == deployment


def test_a_line_without_an_output_limit_gets_its_share_of_the_bound():
    bounds = Bounds(max_output_tokens=1_000)
    assert bounds.output_cap(Work(n=4, inputs=2, output_limit=None)) == 125
    assert bounds.output_cap(Work(n=1, inputs=1, output_limit=10)) is None  # its own limit stands (checked at ingest)
    assert Bounds().output_cap(Work(n=1, inputs=1, output_limit=None)) is None


# --- at ingest -------------------------------------------------------------------------------------
def line(i: int, body: dict, model: str = "m", url: str = CHAT) -> str:
    return json.dumps({"custom_id": f"r-{i}", "method": "POST", "url": url, "body": {"model": model, **body}})


def ingested(
    stores, rows: list[str], *, endpoint: str = CHAT, conf: Settings | None = None, batch_id: str = "b1"
) -> BatchRecord:
    key = schema.batch_input_key("acme", batch_id)
    stores.objects.put(key, ("\n".join(rows) + "\n").encode())
    stores.batches.put(batch_record(id=batch_id, endpoint=endpoint, created_at=NOW - 5, expires_at=NOW + 86_400))
    ingest.ingest(stores, conf or settings(), "acme", batch_id, now=NOW)
    return stores.batches.get("acme", batch_id)


@pytest.mark.parametrize(
    ("body", "code", "param", "message"),
    [
        (
            {"n": 129},
            "integer_above_max_value",
            "body.n",
            "Invalid 'body.n': integer above maximum value. Expected a value <= 128, but got 129 instead.",
        ),
        ({"n": 2, "max_tokens": 600}, "integer_above_max_value", "body.max_tokens", "(1200 in all)"),
    ],
)
def test_a_line_over_a_bound_fails_the_batch_at_ingest_with_its_line_and_openais_code(body, code, param, message):
    stores = fake_stores()
    batch = ingested(stores, [line(0, {}), line(1, body), line(2, {})], conf=settings(max_output_tokens=1_000))
    assert batch.status == "failed"
    (error,) = batch.errors
    assert (error["code"], error["param"], error["line"]) == (code, param, 2) and message in error["message"]
    assert stores.queues.queue(QUEUE).bodies() == []  # nothing ran


def test_an_embeddings_input_list_over_the_bound_is_array_above_max_length():
    stores = fake_stores()
    batch = ingested(stores, [line(0, {"input": ["x"] * 2049}, model="e", url=EMBEDDINGS)], endpoint=EMBEDDINGS)
    (error,) = batch.errors
    assert (error["code"], error["param"], error["line"]) == ("array_above_max_length", "body.input", 1)
    assert "maximum length 2048, but got an array with length 2049" in error["message"]


def test_a_tenants_tighter_bound_applies_to_its_lines_only():
    stores = fake_stores()
    stores.tenants.put(TenantPolicy(tenant="acme", line_bounds=PolicyBounds(max_n=2)))
    assert ingested(stores, [line(0, {"n": 3})]).errors[0]["code"] == "integer_above_max_value"
    other = fake_stores()
    assert ingested(other, [line(0, {"n": 3})]).status == "in_progress"


def test_the_output_bound_rides_in_every_work_message():
    stores = fake_stores()
    stores.tenants.put(TenantPolicy(tenant="acme", line_bounds=PolicyBounds(max_output_tokens=300)))
    ingested(stores, [line(i, {}) for i in range(3)], conf=settings(max_output_tokens=1_000))
    assert {WorkMessage.model_validate_json(b).max_line_output_tokens for b in stores.queues.queue(QUEUE).bodies()} == {
        300
    }


def test_the_enqueued_request_cap_counts_engine_sequences():
    stores = fake_stores()
    stores.tenants.put(TenantPolicy(tenant="acme", max_enqueued_requests={"m": 10}))
    batch = ingested(stores, [line(0, {"n": 4}), line(1, {"n": 4})])
    assert_fields(batch, status="in_progress", reserved_requests=8)  # 2 lines, 8 sequences
    over = ingested(stores, [line(0, {"n": 3})], batch_id="b2")  # 8 + 3 > 10
    assert over.status == "failed" and over.errors[0]["code"] == "token_limit_exceeded"
    assert "10 enqueued requests" in over.errors[0]["message"]


def test_a_token_cap_reserves_the_output_lines_ask_for_when_the_policy_says_so():
    rows = [line(0, {"max_tokens": 100, "n": 2}), line(1, {})]  # 200, and the bound's 500 for the line without a limit
    prompt = sum(-(-(len(r) + 1) // 4) for r in rows)
    plain, reserving = fake_stores(), fake_stores()
    plain.tenants.put(TenantPolicy(tenant="acme", max_enqueued_tokens={"m": 100_000}))
    reserving.tenants.put(TenantPolicy(tenant="acme", max_enqueued_tokens={"m": 100_000}, reserve_output_tokens=True))
    assert (
        ingested(plain, rows, conf=settings(max_output_tokens=500)).reserved_tokens == prompt
    )  # prompts only, as OpenAI
    assert ingested(reserving, rows, conf=settings(max_output_tokens=500)).reserved_tokens == prompt + 200 + 500


def test_an_input_token_budget_refuses_creates_when_used_up_like_the_output_budget():
    stores = fake_stores()
    policy = TenantPolicy(tenant="acme", input_token_budget=100)
    stores.tenants.put(policy)
    assert tenants.admit_creation(stores.tenants, "acme", now=NOW, budget_used=stores.batches.budget_used) == policy
    stores.batches.charge("acme", tenants.budget_sk("month", NOW), input_tokens=100)
    with pytest.raises(QuotaExceeded) as caught:
        tenants.admit_creation(stores.tenants, "acme", now=NOW, budget_used=stores.batches.budget_used)
    assert "input-token budget (100 tokens per month) is used up" in caught.value.message


def test_a_stop_budget_snapshot_holds_both_kinds_and_names_the_one_reached():
    caps = BudgetCaps(output_tokens=50, input_tokens=10)
    assert caps.reached(Spent(output_tokens=49, input_tokens=9)) is None
    assert caps.reached(Spent(output_tokens=0, input_tokens=10)) == "input_tokens"
    stores = fake_stores()
    stores.tenants.put(TenantPolicy(tenant="acme", output_token_budget=50, input_token_budget=10, budget_action="stop"))
    assert ingested(stores, [line(0, {})]).budget_stop == caps
    stores.batches.charge("acme", tenants.budget_sk("month", NOW), input_tokens=10)
    refused = ingested(stores, [line(0, {})], batch_id="b2")
    assert refused.status == "failed" and "input-token budget (10 tokens per month)" in refused.errors[0]["message"]
