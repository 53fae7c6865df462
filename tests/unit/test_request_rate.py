"""Per-tenant request rate limits against the in-memory ports (``tenants.admit_request``): one
conditional counter per (tenant, minute); over it a 429 in OpenAI's request-rate shape whose
``Retry-After`` is the seconds to the window's end; a refused request counts nothing; tenants are
counted apart; the policy is cached for its per-request read; a disabled tenant is refused."""

import json

import pytest

from functions.api import errors
from functions.core.errors import AccountDeactivated, RateLimited, Throttled
from functions.core.tenants import PolicyCache, TenantPolicy, admit_request
from tests.fakes.aws import fake_stores, throttle

#: 2023-11-14 22:13:00 UTC plus 15 s: 45 s left in the minute.
MINUTE = 1_700_000_000 - 1_700_000_000 % 60
NOW = MINUTE + 15


@pytest.fixture
def stores():
    return fake_stores()


def admit(stores, tenant="acme", now=NOW):
    admit_request(stores.tenants, stores.tenants.get(tenant), now=now)


def test_no_policy_or_no_limit_counts_nothing(stores):
    for _ in range(50):
        admit(stores)
    stores.tenants.put(TenantPolicy(tenant="acme", batches_per_hour=3))
    for _ in range(50):
        admit(stores)
    assert stores.faults.calls["tenants.count_request"] == 0


def test_over_the_limit_is_a_429_in_openai_s_shape_with_the_seconds_to_the_window_s_end(stores):
    stores.tenants.put(TenantPolicy(tenant="acme", requests_per_minute=3))
    for offset in range(3):
        admit(stores, now=NOW + offset)
    with pytest.raises(RateLimited) as caught:
        admit(stores, now=NOW + 5)
    error = caught.value
    assert (error.status, error.type, error.code, error.param) == (429, "requests", "rate_limit_exceeded", None)
    assert error.retry_after == 60 - 20
    assert error.message == (
        "Rate limit reached for requests in organization acme on requests per min (RPM): "
        "Limit 3, Used 3, Requested 1. Please try again in 40s."
    )
    assert stores.tenants.requests[("acme", MINUTE)] == 3  # the refusal counted nothing
    response = errors.proxy_response(error)
    assert response["statusCode"] == 429
    assert response["multiValueHeaders"]["Retry-After"] == ["40"]
    assert json.loads(response["body"]) == {
        "error": {"message": error.message, "type": "requests", "param": None, "code": "rate_limit_exceeded"}
    }


def test_the_last_second_of_a_window_waits_one_second_and_the_next_window_admits(stores):
    stores.tenants.put(TenantPolicy(tenant="acme", requests_per_minute=1))
    admit(stores, now=MINUTE + 59)
    with pytest.raises(RateLimited) as caught:
        admit(stores, now=MINUTE + 59)
    assert caught.value.retry_after == 1
    admit(stores, now=MINUTE + 60)  # the window Retry-After pointed to


def test_tenants_are_counted_apart(stores):
    stores.tenants.put(TenantPolicy(tenant="acme", requests_per_minute=2))
    stores.tenants.put(TenantPolicy(tenant="globex", requests_per_minute=2))
    admit(stores), admit(stores)
    with pytest.raises(RateLimited):
        admit(stores)
    admit(stores, "globex"), admit(stores, "globex")
    for _ in range(10):
        admit(stores, "initech")  # no policy: never limited


def test_a_disabled_tenant_is_refused_before_anything_is_counted(stores):
    stores.tenants.put(TenantPolicy(tenant="acme", requests_per_minute=5, disabled=True))
    with pytest.raises(AccountDeactivated) as caught:
        admit(stores)
    assert (caught.value.status, caught.value.code) == (401, "account_deactivated")
    assert stores.faults.calls["tenants.count_request"] == 0


def test_a_throttled_counter_is_a_retryable_503_not_an_admission(stores):
    stores.tenants.put(TenantPolicy(tenant="acme", requests_per_minute=5))
    stores.faults.fail("tenants.count_request", throttle())
    with pytest.raises(Throttled) as caught:
        admit(stores)
    assert caught.value.status == 503
    admit(stores)  # the next one is counted


def test_the_policy_cache_reads_a_tenant_once_per_period():
    stores = fake_stores()
    clock = [100.0]
    cache = PolicyCache(stores.tenants, 5, clock=lambda: clock[0])
    stores.tenants.put(TenantPolicy(tenant="acme", requests_per_minute=5))
    assert cache.get("acme").requests_per_minute == 5
    stores.tenants.put(TenantPolicy(tenant="acme", requests_per_minute=7))
    clock[0] = 104.9
    assert cache.get("acme").requests_per_minute == 5  # cached: the change is not seen yet
    assert cache.get("globex") is None
    clock[0] = 105.0
    assert cache.get("acme").requests_per_minute == 7
    assert stores.faults.calls["tenants.get"] == 3
    uncached = PolicyCache(stores.tenants, 0, clock=lambda: clock[0])
    uncached.get("acme"), uncached.get("acme")
    assert stores.faults.calls["tenants.get"] == 5


@pytest.mark.parametrize("value", [0, -1])
def test_a_limit_below_one_is_refused(value):
    with pytest.raises(ValueError):
        TenantPolicy(tenant="acme", requests_per_minute=value)
