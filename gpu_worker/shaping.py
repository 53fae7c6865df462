"""What the worker sends for a line beyond the line's own body (docs/security.md, "The engine's
prefix cache"; docs/governance.md, "Work a line may ask for"):

- ``cache_salt``: vLLM salts the prefix-cache hashes of a request with it, so a prompt only ever
  hits cache blocks that requests with the same salt left. Every request the worker sends carries
  its tenant's salt, an HMAC of the tenant under the deployment's secret; a tenant's own value is
  replaced. A tenant's repeats still hit, another tenant's never do, and ``cached_tokens`` in the
  usage stays truthful: it never tells one tenant what another sent.
- the output bound: a line that sets no output limit gets its share of the batch's
  ``max_line_output_tokens`` (``work.with_output_cap``), so the bound holds for every line.
- ``priority``: vLLM's place in its waiting queue under ``--scheduling-policy priority`` (lower
  first). It is the worker's alone (``admission.FairTags`` sets it as the line enters the engine):
  a tenant's own value is removed, so no line can jump another tenant's queue.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from collections.abc import Callable
from typing import Any

from functions.core.messages import WorkMessage
from functions.core.work import with_output_cap

#: The body field vLLM reads the salt from (every generate and pooling endpoint accepts it).
CACHE_SALT_FIELD = "cache_salt"
#: The body field vLLM orders its waiting queue by, under priority scheduling (every generate and
#: pooling endpoint's request accepts it).
PRIORITY_FIELD = "priority"


class CacheSalts:
    """Each tenant's salt: hex HMAC-SHA256 of the tenant name under ``secret`` (64 characters, what
    vLLM accepts: at most 128, none of ``@ / \\`` or NUL). Without a secret the worker makes a
    random one for its own life (its engine's cache is its own: only a tenant's hits across a
    worker restart are lost)."""

    def __init__(self, secret: str | None = None):
        self._key = (secret or secrets.token_hex(32)).encode()
        self._salts: dict[str, str] = {}

    def of(self, tenant: str) -> str:
        salt = self._salts.get(tenant)
        if salt is None:
            salt = self._salts[tenant] = hmac.new(self._key, tenant.encode(), hashlib.sha256).hexdigest()
        return salt


def preparer(message: WorkMessage, salts: CacheSalts | None) -> Callable[[dict[str, Any]], dict[str, Any]]:
    """The transformation of a line's body (after the tenant's prompt policy) into what is sent."""
    salt = salts.of(message.tenant) if salts is not None else None

    def prepare(body: dict[str, Any]) -> dict[str, Any]:
        body = with_output_cap(message.endpoint, body, message.max_line_output_tokens)
        if PRIORITY_FIELD in body:
            body = {k: v for k, v in body.items() if k != PRIORITY_FIELD}
        return body if salt is None else {**body, CACHE_SALT_FIELD: salt}

    return prepare
