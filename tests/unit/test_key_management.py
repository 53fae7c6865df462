"""Keys an operator manages, against the in-memory ports: every key has an id that is the audit
chain's actor for its requests, is listed per tenant and revoked by id or plaintext; a disabled
tenant's keys are refused (the authorizer denies them, reading their key items only) and no key is
created for it; a disable cut short by a failing store finishes when run again; keys stored before
ids are given theirs by the backfill."""

import pytest
from aws_lambda_powertools.utilities.data_classes.api_gateway_authorizer_event import APIGatewayAuthorizerRequestEvent

from functions.authorizer.handler import authorize
from functions.core import audit, auth
from functions.core.errors import AccountDeactivated, AuthenticationFailed, Throttled
from functions.core.records import ApiKeyRecord, key_id
from functions.core.tenants import TenantPolicy
from tests.fakes.aws import fake_stores, throttle

ARN = "arn:aws:execute-api:us-east-1:123456789012:abc123/prod/GET/v1/files"


@pytest.fixture
def stores():
    return fake_stores()


def bearer(key: str) -> str:
    return f"Bearer {key}"


def test_a_key_s_id_is_its_audit_actor_and_it_is_listed_with_its_hint_never_the_key(stores):
    key = auth.create_key(stores.keys, "acme", now=7)
    (listed,) = stores.keys.list("acme")
    assert listed.id == key_id(auth.hash_key(key)) == audit.key_actor(bearer(key))
    assert listed.id.startswith("key:") and len(listed.id) == len("key:") + 12
    assert (listed.hint, listed.created_at, listed.status) == (key[-4:], 7, "active")
    assert stores.keys.list("globex") == []
    assert stores.keys.get_by_id(listed.id) == listed


def test_revoke_by_id_removes_the_key_its_listing_and_its_id(stores):
    first, second = (auth.create_key(stores.keys, "acme", now=1) for _ in range(2))
    revoked = auth.revoke_key_id(stores.keys, key_id(auth.hash_key(first)))
    assert revoked is not None and revoked.tenant == "acme"
    with pytest.raises(AuthenticationFailed):
        auth.resolve_tenant(stores.keys, bearer(first))
    assert [r.id for r in stores.keys.list("acme")] == [key_id(auth.hash_key(second))]
    assert stores.keys.get_by_id(revoked.id) is None
    assert auth.revoke_key_id(stores.keys, revoked.id) is None  # once
    assert auth.resolve_tenant(stores.keys, bearer(second)) == "acme"


def test_a_random_key_whose_id_is_taken_is_replaced_by_another(stores, monkeypatch):
    tokens = iter(["first", "second"])
    monkeypatch.setattr(auth.secrets, "token_urlsafe", lambda _: next(tokens))
    # Another key holds the id "sk-first" would get (a 48-bit prefix: only ever by chance).
    holder = ApiKeyRecord(key_hash="f" * 64, tenant="globex", created_at=0, hint="ffff")
    stores.keys.put_unlisted(holder)
    stores.keys.ids[key_id(auth.hash_key("sk-first"))] = holder.key_hash
    assert auth.create_key(stores.keys, "acme", now=1) == "sk-second"
    with pytest.raises(ValueError, match="taken by another key"):
        auth.create_key(stores.keys, "acme", now=1, key="sk-first")


def test_disable_refuses_every_key_of_the_tenant_and_any_new_one_until_enabled(stores):
    keys = [auth.create_key(stores.keys, "acme", now=1) for _ in range(3)]
    other = auth.create_key(stores.keys, "globex", now=1)
    policy, changed = auth.set_disabled(stores.keys, stores.tenants, "acme", True, now=50)
    assert (policy.disabled, policy.updated_at, changed) == (True, 50, 3)
    assert stores.tenants.get("acme").disabled
    for key in keys:
        with pytest.raises(AccountDeactivated) as info:
            auth.resolve_tenant(stores.keys, bearer(key))
        assert (info.value.status, info.value.code) == (401, "account_deactivated")
    assert [r.status for r in stores.keys.list("acme")] == ["disabled"] * 3
    assert auth.resolve_tenant(stores.keys, bearer(other)) == "globex"  # another tenant's keys work
    with pytest.raises(auth.TenantDisabled):
        auth.create_key(stores.keys, "acme", now=2)
    assert len(stores.keys.list("acme")) == 3

    assert auth.set_disabled(stores.keys, stores.tenants, "acme", True, now=51)[1] == 0  # idempotent
    policy, changed = auth.set_disabled(stores.keys, stores.tenants, "acme", False, now=60)
    assert (policy.disabled, changed) == (False, 3)
    assert {auth.resolve_tenant(stores.keys, bearer(k)) for k in keys} == {"acme"}
    assert auth.create_key(stores.keys, "acme", now=61).startswith("sk-")


def test_disable_keeps_the_rest_of_the_policy(stores):
    stores.tenants.put(TenantPolicy(tenant="acme", batches_per_hour=3, requests_per_minute=9))
    auth.set_disabled(stores.keys, stores.tenants, "acme", True, now=5)
    stored = stores.tenants.get("acme")
    assert (stored.batches_per_hour, stored.requests_per_minute, stored.disabled) == (3, 9, True)


def test_a_disable_cut_short_by_the_store_finishes_when_run_again(stores):
    keys = [auth.create_key(stores.keys, "acme", now=1) for _ in range(3)]
    stores.faults.fail("keys.set_disabled", throttle())
    with pytest.raises(Throttled):
        auth.set_disabled(stores.keys, stores.tenants, "acme", True, now=5)
    # The policy says disabled already: no key can be created meanwhile.
    with pytest.raises(auth.TenantDisabled):
        auth.create_key(stores.keys, "acme", now=6)
    assert auth.set_disabled(stores.keys, stores.tenants, "acme", True, now=7)[1] == 3
    for key in keys:
        with pytest.raises(AccountDeactivated):
            auth.resolve_tenant(stores.keys, bearer(key))


def test_backfill_lists_keys_stored_before_ids_and_disables_those_of_a_disabled_tenant(stores):
    old = [
        ApiKeyRecord(key_hash=auth.hash_key(f"sk-old-{i}"), tenant=t, created_at=1, hint="ld-0")
        for i, t in enumerate(("acme", "globex"))
    ]
    for record in old:
        stores.keys.put_unlisted(record)
    assert stores.keys.list("acme") == []
    auth.set_disabled(stores.keys, stores.tenants, "globex", True, now=2)
    # Unlisted, the old key escaped the disable: the backfill closes that.
    assert auth.resolve_tenant(stores.keys, bearer("sk-old-1")) == "globex"
    assert auth.backfill(stores.keys, stores.tenants) == 2
    assert [r.id for r in stores.keys.list("acme")] == [old[0].id]
    with pytest.raises(AccountDeactivated):
        auth.resolve_tenant(stores.keys, bearer("sk-old-1"))
    assert auth.backfill(stores.keys, stores.tenants) == 0  # once
    assert auth.revoke_key_id(stores.keys, old[0].id).tenant == "acme"


def test_revoking_a_key_stored_before_ids_by_its_plaintext(stores):
    stores.keys.put_unlisted(
        ApiKeyRecord(key_hash=auth.hash_key("sk-legacy"), tenant="acme", created_at=1, hint="gacy")
    )
    assert auth.revoke_key(stores.keys, "sk-legacy").tenant == "acme"
    assert stores.keys.get(auth.hash_key("sk-legacy")) is None


def _event(key: str) -> APIGatewayAuthorizerRequestEvent:
    return APIGatewayAuthorizerRequestEvent(
        {"type": "REQUEST", "methodArn": ARN, "headers": {"Authorization": bearer(key)}}
    )


def test_the_authorizer_denies_a_disabled_tenant_s_key_reading_its_key_item_only(stores):
    key = auth.create_key(stores.keys, "acme", now=1)
    allowed = authorize(stores, _event(key), 10).asdict()
    assert allowed["policyDocument"]["Statement"][0]["Effect"] == "Allow"
    auth.set_disabled(stores.keys, stores.tenants, "acme", True, now=11)
    before = dict(stores.faults.calls)
    denied = authorize(stores, _event(key), 12).asdict()
    assert denied["principalId"] == "acme" and "context" not in denied
    assert [s["Effect"] for s in denied["policyDocument"]["Statement"]] == ["Deny"]
    read = {op: n - before.get(op, 0) for op, n in stores.faults.calls.items() if n != before.get(op, 0)}
    assert read == {"keys.get": 1}  # the key item, nothing else (no policy, no listing)
