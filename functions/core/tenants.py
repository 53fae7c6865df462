"""Tenant policy (issue 13): what one tenant may do, stored in DynamoDB and changeable without a
redeploy (``batchctl tenants``). No record, or an absent field, means today's behaviour: every
served model, no creation-rate limit, no caps, no budget.

Enforced now (docs/governance.md):

- ``allowed_models``: ingest fails a line whose ``body.model`` is not listed (``model_not_allowed``),
  so the batch ends ``failed`` (the model is known only at ingest).
- ``batches_per_hour``: batch creations per tenant per clock hour, counted with one conditional
  atomic counter item per (tenant, hour window); over the limit the create is answered 429
  ``rate_limit_error`` with ``Retry-After`` (seconds to the window's end).

Defined (stored, validated, shown by ``batchctl tenants get``) but NOT enforced yet: the per-model
caps on enqueued requests and enqueued prompt tokens, and the output-token budget (its period and
what happens at it).
"""

from __future__ import annotations

from typing import Any, Literal, Self

from pydantic import BaseModel, ConfigDict, Field, field_validator

from . import schema
from .errors import RateLimited
from .records import check_tenant

#: The length of one creation-rate window (a clock hour, aligned to the epoch).
HOUR_SECONDS = 3600
#: A counter item outlives its window by this much before DynamoDB's TTL removes it (a late
#: reader of the window never sees it vanish early; the TTL deletion is lazy anyway).
COUNTER_GRACE_SECONDS = 3600

BudgetPeriod = Literal["day", "month"]
#: At the budget: refuse new batches (``reject``), or stop running lines with an error code
#: (``stop``). Defined, not enforced yet.
BudgetAction = Literal["reject", "stop"]


class TenantPolicy(BaseModel):
    """One tenant's policy. Every limit is optional: None (or an empty map) means no limit."""

    model_config = ConfigDict(extra="ignore")

    tenant: str
    #: The models this tenant may use; None: every model the deployment serves. Enforced at ingest.
    allowed_models: list[str] | None = None
    #: Batch creations per clock hour; None: unlimited. Enforced at create (429).
    batches_per_hour: int | None = Field(default=None, ge=0)
    #: Per model: at most this many requests enqueued (not yet finished). Defined, not enforced yet.
    max_enqueued_requests: dict[str, int] = Field(default_factory=dict)
    #: Per model: at most this many prompt tokens enqueued (OpenAI's "enqueued token limit").
    #: Defined, not enforced yet.
    max_enqueued_tokens: dict[str, int] = Field(default_factory=dict)
    #: Output tokens per ``budget_period``; None: no budget. Defined, not enforced yet.
    output_token_budget: int | None = Field(default=None, ge=0)
    budget_period: BudgetPeriod = "month"
    budget_action: BudgetAction = "reject"
    updated_at: int = 0

    _check_tenant = field_validator("tenant")(classmethod(lambda cls, v: check_tenant(v)))

    @field_validator("max_enqueued_requests", "max_enqueued_tokens")
    @classmethod
    def _non_negative(cls, caps: dict[str, int]) -> dict[str, int]:
        if any(v < 0 for v in caps.values()):
            raise ValueError("caps must be non-negative")
        return caps

    def allows(self, model: str) -> bool:
        return self.allowed_models is None or model in self.allowed_models

    def to_item(self) -> dict[str, Any]:
        item = {schema.PK: schema.TENANTS_PK, schema.SK: schema.tenant_policy_sk(self.tenant)}
        item.update({k: v for k, v in self.model_dump().items() if v is not None and v != {}})
        return item

    @classmethod
    def from_item(cls, item: dict[str, Any]) -> Self:
        return cls.model_validate({k: v for k, v in item.items() if k not in (schema.PK, schema.SK)})


def default_policy(tenant: str) -> TenantPolicy:
    """The policy of a tenant without a record: today's behaviour."""
    return TenantPolicy(tenant=tenant)


def window_start(now: int) -> int:
    """The start of the creation-rate window holding ``now``."""
    return now - now % HOUR_SECONDS


def retry_after(now: int) -> int:
    """Seconds until the window holding ``now`` ends (at least 1)."""
    return max(1, window_start(now) + HOUR_SECONDS - now)


def admit_creation(tenants: Any, tenant: str, *, now: int) -> TenantPolicy | None:
    """Admit one batch creation for ``tenant`` at ``now``, or raise ``RateLimited``. One GetItem for
    the policy; with a ``batches_per_hour``, one conditional ADD on the window's counter (the
    counter never exceeds the limit: a refused create counts nothing). ``tenants`` is a
    ``ports.TenantStore``. Returns the policy (None: no record)."""
    policy = tenants.get(tenant)
    if policy is None or policy.batches_per_hour is None:
        return policy
    start = window_start(now)
    limit = policy.batches_per_hour
    if not tenants.count_creation(
        tenant, start, limit=limit, expires_at=start + HOUR_SECONDS + COUNTER_GRACE_SECONDS
    ):
        raise RateLimited(
            f"Rate limit reached for batch creations: at most {limit} per hour for this organization. "
            f"Try again in {retry_after(now)} seconds.",
            retry_after=retry_after(now),
        )
    return policy
