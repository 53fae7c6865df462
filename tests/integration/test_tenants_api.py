"""Tenant policy through the official SDK, on moto (docs/governance.md): the hourly creation
limit answers 429 ``rate_limit_error`` with ``Retry-After``; a batch whose model the tenant may not use ends
``failed`` with ``model_not_allowed``; a tenant without a record keeps the defaults."""

import openai
import pytest

from functions.core.tenants import TenantPolicy
from tests.integration.batch_helpers import line, run_ingest, submit

#: 25 minutes into a clock hour (1_699_956_000 is 10:00:00 UTC): 35 minutes (2,100 s) remain.
HOUR = 1_699_956_000


def test_over_the_hourly_limit_is_429_rate_limit_error_with_retry_after(client, other_client, stores, clock):
    clock.now = HOUR + 25 * 60
    stores.tenants.put(TenantPolicy(tenant="acme", batches_per_hour=1))
    content = (line(1) + "\n").encode()
    submit(client, content)

    with pytest.raises(openai.RateLimitError) as info:
        submit(client, content)

    error = info.value
    assert error.status_code == 429
    assert error.type == "rate_limit_error" and error.code == "rate_limit_exceeded"
    assert "1 per hour" in error.message
    assert error.response.headers["retry-after"] == str(35 * 60)
    assert len(client.batches.list().data) == 1
    submit(other_client, content)  # another tenant has no policy: no limit
    submit(other_client, content)
    clock.now = HOUR + 3600  # the next hour
    submit(client, content)


def test_a_batch_with_a_model_not_allowed_ends_failed_with_model_not_allowed(client, stores):
    stores.tenants.put(TenantPolicy(tenant="acme", allowed_models=["some-other-model"]))
    batch = submit(client, (line(1) + "\n" + line(2) + "\n").encode())
    run_ingest()

    failed = client.batches.retrieve(batch.id)
    assert failed.status == "failed"
    assert [(e.code, e.line, e.param) for e in failed.errors.data] == [
        ("model_not_allowed", 1, "body.model"),
        ("model_not_allowed", 2, "body.model"),
    ]
    assert "test-chat" in failed.errors.data[0].message


def test_an_allowed_model_and_no_policy_run_as_today(client, other_client, stores):
    stores.tenants.put(TenantPolicy(tenant="acme", allowed_models=["test-chat"]))
    mine = submit(client, (line(1) + "\n").encode())
    theirs = submit(other_client, (line(1) + "\n").encode())
    run_ingest()
    assert client.batches.retrieve(mine.id).status == "in_progress"
    assert other_client.batches.retrieve(theirs.id).status == "in_progress"
