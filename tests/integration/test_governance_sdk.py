"""Enqueued caps and the output-token budget through the official SDK on moto
(docs/governance.md): ingest (the real handler, the real DynamoDB transactions) fails a batch over
an enqueued cap with ``token_limit_exceeded`` and reserves one under it; a used-up budget with
``budget_action="reject"`` answers creates 429 ``insufficient_quota`` (``openai.RateLimitError``)
without ``Retry-After``."""

import openai
import pytest

from functions.core.records import ChunkRecord
from functions.core.tenants import TenantPolicy, budget_sk
from tests.builders import batch_record
from tests.integration.batch_helpers import count_and_charge, line, run_ingest, submit, take_work

NOW = 1_796_083_200 + 3_600  # 2026-12-01 01:00 UTC


def test_over_the_requests_cap_fails_and_under_it_reserves(client, stores, deployed):
    stores.tenants.put(TenantPolicy(tenant="acme", max_enqueued_requests={"test-chat": 2}))
    over = submit(client, "".join(line(i) + "\n" for i in range(3)).encode())
    run_ingest()
    failed = client.batches.retrieve(over.id)
    assert failed.status == "failed"
    (error,) = failed.errors.data
    assert (error.code, error.line, error.param) == ("token_limit_exceeded", None, None)
    assert error.message == (
        "Enqueued request limit reached for test-chat in organization acme. Limit: 2 enqueued "
        "requests. Please try again once some in_progress batches have been completed."
    )
    assert stores.batches.enqueued("acme", "test-chat") == (0, 0)

    under = submit(client, "".join(line(i) + "\n" for i in range(2)).encode())
    run_ingest()
    assert client.batches.retrieve(under.id).status == "in_progress"
    requests, tokens = stores.batches.enqueued("acme", "test-chat")
    assert requests == 2 and tokens == stores.batches.get("acme", under.id).reserved_tokens > 0
    assert all(m.budget_period is None for m in take_work(deployed))  # no budget: none in the messages


def test_a_used_up_budget_with_reject_is_429_insufficient_quota(client, other_client, stores, appender, clock):
    clock.now = NOW
    stores.tenants.put(TenantPolicy(tenant="acme", output_token_budget=10))
    stores.batches.create(
        batch_record(
            id="b0", created_at=1, expires_at=10**10, input_key="k", status="in_progress", accepting=True, chunk_count=1
        )
    )
    content = (line(1) + "\n").encode()
    submit(client, content)  # nothing charged yet
    assert count_and_charge(
        stores,
        appender,
        ChunkRecord(
            tenant="acme",
            batch_id="b0",
            chunk=0,
            attempt="a",
            completed=1,
            failed=0,
            output_tokens=10,
            recorded_at=NOW,
            expires_at=10**10,
            budget_period="month",
        ),
    )
    assert stores.batches.budget_used("acme", budget_sk("month", NOW)).output_tokens == 10

    with pytest.raises(openai.RateLimitError) as info:
        submit(client, content)
    error = info.value
    assert (error.status_code, error.type, error.code) == (429, "insufficient_quota", "insufficient_quota")
    assert error.body["message"].startswith("You exceeded your current quota")
    assert "retry-after" not in error.response.headers
    submit(other_client, content)  # another tenant: no budget
