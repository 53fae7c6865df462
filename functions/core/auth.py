"""API keys: a bearer key maps to a tenant. Keys are stored only as SHA-256 hashes; each has a
visible, stable id (``records.key_id``: ``key:<12 hex>``, the audit chain's actor for its requests).

An operator lists a tenant's keys, revokes one by its plaintext or its id, and disables a tenant:
its policy says so and every key of the tenant is marked, so the authorizer (which reads key items
only) refuses them; a key cannot be created for a disabled tenant."""

import hashlib
import secrets

from .errors import DEACTIVATED_MESSAGE, AccountDeactivated, AuthenticationFailed, ConditionFailed
from .ports import KeyStore, TenantStore
from .records import ApiKeyRecord, check_tenant
from .tenants import TenantPolicy, default_policy

KEY_PREFIX = "sk-"
#: New random keys tried when one's id is taken by another key (48 bits: practically never).
CREATE_ATTEMPTS = 3


class TenantDisabled(ValueError):
    """A key was asked for a disabled tenant (``batchctl tenants enable`` it first)."""


def hash_key(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def create_key(keys: KeyStore, tenant: str, now: int, key: str | None = None) -> str:
    """Create a key for ``tenant`` (a new random one unless ``key`` is given) and return it.
    Creating the same key twice for the same tenant is a no-op; for another tenant, an error
    (ValueError); for a disabled tenant, ``TenantDisabled``."""
    check_tenant(tenant)
    for _ in range(CREATE_ATTEMPTS):
        candidate = key or KEY_PREFIX + secrets.token_urlsafe(32)
        existing = keys.get(hash_key(candidate))
        if existing is not None:
            if existing.tenant != tenant:
                raise ValueError("that key already belongs to another tenant")
            return candidate
        record = ApiKeyRecord(key_hash=hash_key(candidate), tenant=tenant, created_at=now, hint=candidate[-4:])
        try:
            keys.create(record)
            return candidate
        except ConditionFailed:
            if keys.get(record.key_hash) is not None:
                continue  # the same key, created concurrently: decide again
            if keys.get_by_id(record.id) is None and all(r.id != record.id for r in keys.list(tenant)):
                raise TenantDisabled(
                    f"tenant {tenant!r} is disabled: enable it first (batchctl tenants enable)"
                ) from None
            if key is not None:
                raise ValueError(f"the key id {record.id} is taken by another key") from None
            # another key holds this id: a new random key gets another one
    raise ValueError("no free key id was found")


def revoke_key(keys: KeyStore, key: str) -> ApiKeyRecord | None:
    return keys.delete(hash_key(key))


def revoke_key_id(keys: KeyStore, key_id: str) -> ApiKeyRecord | None:
    """Revoke the key with this id (``key:<12 hex>``); None if there is none."""
    record = keys.get_by_id(key_id)
    return keys.delete(record.key_hash) if record is not None else None


def set_disabled(
    keys: KeyStore, tenants: TenantStore, tenant: str, disabled: bool, *, now: int
) -> tuple[TenantPolicy, int]:
    """Disable (or enable) ``tenant``: its policy first (so a key created from then on is
    refused, ``KeyStore.create``), then every key it has; returns the policy as stored and how many
    keys changed. Idempotent: running it again finishes what a crash left half done."""
    check_tenant(tenant)
    policy = (tenants.get(tenant) or default_policy(tenant)).model_copy(
        update={"disabled": disabled, "updated_at": now}
    )
    tenants.put(policy)
    changed = 0
    for record in keys.list(tenant):
        if bool(record.disabled) != disabled and keys.set_disabled(record, disabled):
            changed += 1
    return policy, changed


def backfill(keys: KeyStore, tenants: TenantStore) -> int:
    """Give every key stored without a listing and an id (keys created before ids existed) both,
    and mark it disabled if its tenant is; returns how many keys got them. A table scan: run once."""
    added = 0
    for record in keys.all_keys():
        if not keys.add_listing(record):
            continue
        added += 1
        policy = tenants.get(record.tenant)
        if policy is not None and policy.disabled and not record.disabled:
            keys.set_disabled(record, True)
    return added


def bearer_token(authorization: str | None) -> str:
    """The key in an ``Authorization: Bearer <key>`` header, or AuthenticationFailed."""
    scheme, _, token = (authorization or "").strip().partition(" ")
    token = token.strip()
    if scheme.lower() != "bearer" or not token:
        raise AuthenticationFailed(
            "You didn't provide an API key. Send it as 'Authorization: Bearer <key>'.", code="invalid_api_key"
        )
    return token


def resolve_key(keys: KeyStore, authorization: str | None) -> ApiKeyRecord:
    """The bearer key's record (one GetItem of its key item), or AuthenticationFailed."""
    token = bearer_token(authorization)
    record = keys.get(hash_key(token))
    if record is None:
        raise AuthenticationFailed(f"Incorrect API key provided: {_mask(token)}.")
    return record


def resolve_tenant(keys: KeyStore, authorization: str | None) -> str:
    """The tenant of the bearer key: AuthenticationFailed for an unknown key,
    ``AccountDeactivated`` for a key of a disabled tenant."""
    record = resolve_key(keys, authorization)
    if record.disabled:
        raise AccountDeactivated(DEACTIVATED_MESSAGE)
    return record.tenant


def _mask(token: str) -> str:
    return token[:3] + "*" * 4 + token[-4:] if len(token) > 8 else "*" * len(token)
