"""API keys: a bearer key maps to a tenant. Keys are stored only as SHA-256 hashes."""

import hashlib
import secrets

from .errors import AuthenticationFailed
from .records import ApiKeyRecord, check_tenant
from .ports import KeyStore

KEY_PREFIX = "sk-"


def hash_key(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def create_key(keys: KeyStore, tenant: str, now: int, key: str | None = None) -> str:
    """Create a key for ``tenant`` (a new random one unless ``key`` is given) and return it.
    Creating the same key twice for the same tenant is a no-op; for another tenant, an error."""
    check_tenant(tenant)
    key = key or KEY_PREFIX + secrets.token_urlsafe(32)
    existing = keys.get(hash_key(key))
    if existing is not None:
        if existing.tenant != tenant:
            raise ValueError("that key already belongs to another tenant")
        return key
    keys.create(ApiKeyRecord(key_hash=hash_key(key), tenant=tenant, created_at=now, hint=key[-4:]))
    return key


def revoke_key(keys: KeyStore, key: str) -> ApiKeyRecord | None:
    return keys.delete(hash_key(key))


def bearer_token(authorization: str | None) -> str:
    """The key in an ``Authorization: Bearer <key>`` header, or AuthenticationFailed."""
    scheme, _, token = (authorization or "").strip().partition(" ")
    token = token.strip()
    if scheme.lower() != "bearer" or not token:
        raise AuthenticationFailed(
            "You didn't provide an API key. Send it as 'Authorization: Bearer <key>'.", code="invalid_api_key"
        )
    return token


def resolve_tenant(keys: KeyStore, authorization: str | None) -> str:
    token = bearer_token(authorization)
    record = keys.get(hash_key(token))
    if record is None:
        raise AuthenticationFailed(f"Incorrect API key provided: {_mask(token)}.")
    return record.tenant


def _mask(token: str) -> str:
    return token[:3] + "*" * 4 + token[-4:] if len(token) > 8 else "*" * len(token)
