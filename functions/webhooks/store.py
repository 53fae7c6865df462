"""Webhook endpoints and the delivery-attempt log, on the deployment's one table, in a partition
of their own per tenant (``webhooks_pk``: ``T#<tenant>#WEBHOOKS``, so the webhook Lambda's IAM
``dynamodb:LeadingKeys`` names these partitions and nothing else): ``WEBHOOK#<endpoint id>`` and
``WHLOG#<unix time, 10 digits>#<webhook-id>#<attempt, 2 digits>`` (newest first when listed; the
log expires after ``LOG_RETENTION_SECONDS`` by DynamoDB TTL).

The signing secret is stored as it is (an HMAC key must be recoverable to sign, so it cannot be
hashed like an API key): the table is encrypted at rest (DynamoDB's default encryption), only the
webhook Lambda and the operator's ``batchctl`` read it, and no API returns it.
"""

from __future__ import annotations

import builtins
import secrets
from typing import Any, Final

from pydantic import BaseModel

from functions.core import schema
from functions.core.aws.dynamodb import Table
from functions.core.errors import ConditionFailed

ENDPOINT_PREFIX: Final = "WEBHOOK#"
LOG_PREFIX: Final = "WHLOG#"
#: How long an attempt stays in the log (DynamoDB TTL): the operator sees a month of deliveries.
LOG_RETENTION_SECONDS: Final = 30 * 86_400
#: After a rotation with ``keep_old``, the previous secret still signs this long (as OpenAI's
#: ``keep_old_secret_active_for_24_hours``).
PREVIOUS_SECRET_SECONDS: Final = 86_400


def webhooks_pk(tenant: str) -> str:
    """A tenant's webhook partition (``webhooks_pk("*")`` is the IAM pattern of all of them; a
    tenant name has no ``#``, so it matches no other partition)."""
    return f"{schema.tenant_pk(tenant)}#WEBHOOKS"


def new_endpoint_id() -> str:
    return "we_" + secrets.token_hex(16)


class EndpointRecord(BaseModel):
    tenant: str
    id: str
    url: str
    events: list[str]
    secret: str
    previous_secret: str | None = None
    previous_until: int | None = None
    created_at: int
    updated_at: int

    def signing_secrets(self, now: int) -> list[str]:
        """The secrets a delivery is signed with at ``now`` (the receiver accepts any match)."""
        previous = self.previous_secret
        if previous and self.previous_until is not None and now < self.previous_until:
            return [self.secret, previous]
        return [self.secret]

    def to_item(self) -> dict[str, Any]:
        return {
            schema.PK: webhooks_pk(self.tenant),
            schema.SK: ENDPOINT_PREFIX + self.id,
            **self.model_dump(exclude_none=True),
        }

    @classmethod
    def from_item(cls, item: dict[str, Any]) -> EndpointRecord:
        fields = {k: v for k, v in item.items() if k not in (schema.PK, schema.SK)}
        for name in ("created_at", "updated_at", "previous_until"):
            if fields.get(name) is not None:
                fields[name] = int(fields[name])
        return cls(**fields)


class AttemptRecord(BaseModel):
    """One delivery attempt: ``outcome`` is ``delivered``, ``retry`` (again at ``next_at``),
    ``failed`` (the schedule is spent; the message goes to the dead-letter queue) or ``dropped``
    (the endpoint was deleted or its URL is not allowed)."""

    tenant: str
    endpoint_id: str
    webhook_id: str
    event_id: str
    event_type: str
    attempt: int
    at: int
    outcome: str
    status_code: int | None = None
    error: str | None = None
    next_at: int | None = None

    def to_item(self) -> dict[str, Any]:
        sk = f"{LOG_PREFIX}{self.at:010d}#{self.webhook_id}#{self.attempt:02d}"
        return {
            schema.PK: webhooks_pk(self.tenant),
            schema.SK: sk,
            schema.TTL: self.at + LOG_RETENTION_SECONDS,
            **self.model_dump(exclude_none=True),
        }

    @classmethod
    def from_item(cls, item: dict[str, Any]) -> AttemptRecord:
        fields = {k: v for k, v in item.items() if k not in (schema.PK, schema.SK, schema.TTL)}
        for name in ("attempt", "at", "status_code", "next_at"):
            if fields.get(name) is not None:
                fields[name] = int(fields[name])
        return cls(**fields)


class WebhookRepo:
    def __init__(self, table: Table):
        self._table = table

    def create(self, record: EndpointRecord) -> None:
        self._table.put(record.to_item(), if_absent=True)

    def get(self, tenant: str, endpoint_id: str) -> EndpointRecord | None:
        item = self._table.get(webhooks_pk(tenant), ENDPOINT_PREFIX + endpoint_id)
        return EndpointRecord.from_item(item) if item else None

    def list(self, tenant: str) -> list[EndpointRecord]:
        items, _ = self._table.query_page(
            pk=webhooks_pk(tenant), prefix=ENDPOINT_PREFIX, after=None, ascending=True, limit=1000
        )
        return [EndpointRecord.from_item(i) for i in items]

    def rotate(self, tenant: str, endpoint_id: str, secret: str, *, now: int, keep_old: bool) -> EndpointRecord | None:
        """Replace the secret (the old one keeps signing ``PREVIOUS_SECRET_SECONDS`` if ``keep_old``)."""
        record = self.get(tenant, endpoint_id)
        if record is None:
            return None
        values: dict[str, Any] = {"secret": secret, "updated_at": now}
        values.update(
            {"previous_secret": record.secret, "previous_until": now + PREVIOUS_SECRET_SECONDS}
            if keep_old
            else {"previous_until": now}
        )
        try:
            item = self._table.set_if(
                webhooks_pk(tenant), ENDPOINT_PREFIX + endpoint_id, values, expect={"secret": record.secret}
            )
        except ConditionFailed:  # deleted or rotated meanwhile
            return None
        return EndpointRecord.from_item(item)

    def delete(self, tenant: str, endpoint_id: str) -> EndpointRecord | None:
        old = self._table.delete(webhooks_pk(tenant), ENDPOINT_PREFIX + endpoint_id)
        return EndpointRecord.from_item(old) if old else None

    def log(self, attempt: AttemptRecord) -> None:
        self._table.put(attempt.to_item())

    def attempts(
        self, tenant: str, *, limit: int, now: int, endpoint_id: str | None = None
    ) -> builtins.list[AttemptRecord]:
        """The newest ``limit`` attempts (of one endpoint if given), newest first."""

        def keep(item: dict[str, Any]) -> bool:
            alive = not (schema.TTL in item and int(item[schema.TTL]) <= now)
            return alive and (endpoint_id is None or item.get("endpoint_id") == endpoint_id)

        items, _ = self._table.query_page(
            pk=webhooks_pk(tenant), prefix=LOG_PREFIX, after=None, ascending=False, limit=limit, keep=keep
        )
        return [AttemptRecord.from_item(i) for i in items]
