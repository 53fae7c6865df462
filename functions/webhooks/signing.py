"""Standard Webhooks signing (https://www.standardwebhooks.com/), as OpenAI signs its webhooks.

A secret is ``whsec_`` + base64 of 32 random bytes (the spec allows 24 to 64). A delivery carries
``webhook-id`` (the same on every attempt of one message: receivers dedupe on it),
``webhook-timestamp`` (unix seconds of the attempt) and ``webhook-signature``: space-separated
``v1,<base64 HMAC-SHA256 of "{id}.{timestamp}.{body}" keyed with the decoded secret>``, one per
valid secret (two while a rotated-out secret is still honoured). Proven against the openai SDK's
``client.webhooks.unwrap`` and the ``standardwebhooks`` library in tests/unit/test_webhooks_signing.py.
"""

import base64
import hashlib
import hmac
import secrets
from collections.abc import Iterable
from typing import Final

SECRET_PREFIX: Final = "whsec_"
SECRET_BYTES: Final = 32
ID_HEADER: Final = "webhook-id"
TIMESTAMP_HEADER: Final = "webhook-timestamp"
SIGNATURE_HEADER: Final = "webhook-signature"


def new_secret() -> str:
    return SECRET_PREFIX + base64.b64encode(secrets.token_bytes(SECRET_BYTES)).decode()


def secret_hint(secret: str) -> str:
    """A masked form for listings (the secret itself is shown once)."""
    return f"{secret[: len(SECRET_PREFIX) + 3]}...{secret[-3:]}"


def _key(secret: str) -> bytes:
    if not secret.startswith(SECRET_PREFIX):
        raise ValueError("a webhook secret starts with whsec_")
    return base64.b64decode(secret[len(SECRET_PREFIX) :], validate=True)


def sign(secret: str, msg_id: str, timestamp: int, body: str) -> str:
    """One ``v1,<base64>`` signature."""
    mac = hmac.new(_key(secret), f"{msg_id}.{timestamp}.{body}".encode(), hashlib.sha256).digest()
    return "v1," + base64.b64encode(mac).decode()


def headers(secrets_: Iterable[str], msg_id: str, timestamp: int, body: str) -> dict[str, str]:
    """The three Standard Webhooks headers (plus the JSON content type) for one attempt."""
    return {
        "content-type": "application/json",
        ID_HEADER: msg_id,
        TIMESTAMP_HEADER: str(timestamp),
        SIGNATURE_HEADER: " ".join(sign(s, msg_id, timestamp, body) for s in secrets_),
    }
