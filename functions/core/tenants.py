"""Tenant policy: what one tenant may do, stored in DynamoDB and changeable without a
redeploy (``batchctl tenants``). No record, or an absent field, means the defaults: every
served model, no creation-rate limit, no caps, no budget.

Enforced (docs/governance.md):

- ``allowed_models``: ingest fails a line whose ``body.model`` is not listed (``model_not_allowed``),
  so the batch ends ``failed`` (the model is known only at ingest).
- ``allowed_media_domains``: narrows the deployment's ``Settings.allowed_media_domains`` for the
  tenant's audio lines (``media_domains``: the hosts both list; a tenant never widens it): ingest
  refuses a ``file_url`` on another host, and snapshots the list into the batch's manifest and
  work messages, whose hosts the worker then fetches from, whatever the policy becomes.
- ``batches_per_hour``: batch creations per tenant per clock hour, counted with one conditional
  atomic counter item per (tenant, hour window); over the limit the create is answered 429
  ``rate_limit_error`` with ``Retry-After`` (seconds to the window's end).

- ``max_enqueued_requests`` / ``max_enqueued_tokens``: per (tenant, model), reserved at ingest in
  the move to in_progress (over a cap: the batch fails ``token_limit_exceeded``), released by the
  write that makes the batch terminal, exactly once (``aws.repos.BatchRepo``).
- ``output_token_budget`` / ``input_token_budget``: the engine's output and input tokens of every
  attempt at a chunk's lines, charged when the chunk is counted; at a budget ``reject`` answers
  creates 429 ``insufficient_quota``, ``stop`` fails new batches at ingest (``budget_exceeded``)
  and workers stop sending the lines of running ones (each a ``budget_exceeded`` error line;
  ``gpu_worker/budget.py``).
- ``requests_per_minute``: every API request of the tenant (every route), counted by the API with
  one conditional atomic counter item per (tenant, minute window); over the limit 429 type
  ``requests``, code ``rate_limit_exceeded``, ``Retry-After`` (seconds to the window's end).
- ``max_stored_bytes``: the bytes of the tenant's files and pending uploads, reserved with the
  record that holds them, released once when it goes (``aws.stored``); over it a file or upload
  create is a 400 ``storage_quota_exceeded``. A batch's output files are counted, never refused.
- ``disabled``: ``batchctl tenants disable`` marks every key of the tenant, which the authorizer
  then refuses (401 ``account_deactivated``); the API refuses the tenant's requests too.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any, Literal, Self

from pydantic import BaseModel, ConfigDict, Field, field_validator

from . import schema
from .errors import (
    DEACTIVATED_MESSAGE,
    AccountDeactivated,
    QuotaExceeded,
    RateLimited,
    RequestRateLimited,
    StorageQuotaExceeded,
)

if TYPE_CHECKING:
    from .ports import TenantStore
from .budgets import BudgetCaps, Spent, budget_sk
from .guard import GuardPolicy
from .records import check_tenant
from .work import BYTES_PER_TOKEN, PolicyBounds, estimate_tokens  # noqa: F401 - estimate_tokens is part of this API

#: The length of one creation-rate window (a clock hour, aligned to the epoch).
HOUR_SECONDS = 3600
#: The length of one request-rate window (a clock minute, aligned to the epoch).
MINUTE_SECONDS = 60
#: A counter item outlives its window by this much before DynamoDB's TTL removes it (a late
#: reader of the window never sees it vanish early; the TTL deletion is lazy anyway).
COUNTER_GRACE_SECONDS = 3600

BudgetPeriod = Literal["day", "month"]
#: At the budget: refuse new batches (``reject``), or stop running lines with an error code
#: (``stop``): ``reject`` answers creates 429 ``insufficient_quota``; ``stop`` fails a batch at ingest
#: and stops the lines of batches already running.
BudgetAction = Literal["reject", "stop"]


class TenantPolicy(BaseModel):
    """One tenant's policy. Every limit is optional: None (or an empty map) means no limit."""

    model_config = ConfigDict(extra="ignore")

    tenant: str
    #: The models this tenant may use; None: every model the deployment serves. Enforced at ingest.
    allowed_models: list[str] | None = None
    #: The hosts this tenant's audio lines may fetch from, within the deployment's
    #: ``allowed_media_domains`` (the hosts both list: a tenant's list narrows, never widens);
    #: None: the deployment's; []: ``data:`` URLs only. Lowercase. Enforced at ingest, snapshotted.
    allowed_media_domains: list[str] | None = None
    #: Batch creations per clock hour; None: unlimited. Enforced at create (429).
    batches_per_hour: int | None = Field(default=None, ge=0)
    #: Per model: at most this many requests enqueued (not yet finished): reserved at ingest.
    max_enqueued_requests: dict[str, int] = Field(default_factory=dict)
    #: Per model: at most this many prompt tokens enqueued (OpenAI's "enqueued token limit").
    #: Reserved at ingest (``estimate_tokens``), released at the batch's terminal status.
    max_enqueued_tokens: dict[str, int] = Field(default_factory=dict)
    #: Output tokens per ``budget_period``; None: no budget. Charged as chunks are counted.
    output_token_budget: int | None = Field(default=None, ge=0)
    budget_period: BudgetPeriod = "month"
    budget_action: BudgetAction = "reject"
    #: Also reserve, on the token cap, the output tokens the batch's lines ask for (their output
    #: limit times their sequences, or the line bound given to a line that sets none): the cap then
    #: bounds what the enqueued work may generate, not only its prompts.
    reserve_output_tokens: bool = False
    #: Input (prompt) tokens per ``budget_period``, charged like the output budget; None: none.
    input_token_budget: int | None = Field(default=None, ge=0)
    #: Lower bounds than the deployment's on the work one line may ask (functions/core/work.py).
    line_bounds: PolicyBounds | None = None
    #: Prompt secrets (refuse/redact) and output guardrails (functions/core/guard.py); None: none.
    #: Ingest snapshots it into the batch's work messages; the worker applies it to every line.
    guard: GuardPolicy | None = None
    #: API requests per clock minute, every route; None: unlimited (the stage throttle is the only
    #: bound). At least 1: a tenant to be shut out is disabled instead.
    requests_per_minute: int | None = Field(default=None, ge=1)
    #: Bytes of files and pending uploads the tenant may hold at once; None: no quota.
    max_stored_bytes: int | None = Field(default=None, ge=0)
    #: Set by ``batchctl tenants disable`` (with every key of the tenant marked disabled).
    disabled: bool = False
    updated_at: int = 0

    _check_tenant = field_validator("tenant")(classmethod(lambda cls, v: check_tenant(v)))

    @field_validator("allowed_media_domains")
    @classmethod
    def _hosts(cls, hosts: list[str] | None) -> list[str] | None:
        if hosts is None:
            return None
        cleaned = [host.strip().lower() for host in hosts]
        if any(not host or not host.isprintable() or any(c in host for c in " /@\\") for host in cleaned):
            raise ValueError("media domains must be host names (or IP literals), without scheme, path or spaces")
        return list(dict.fromkeys(cleaned))

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


def media_domains(policy: TenantPolicy | None, deployment: Iterable[str]) -> tuple[str, ...] | None:
    """The hosts ``policy``'s tenant may fetch audio from when its policy narrows the deployment's
    list (``deployment``, ``Settings.allowed_media_domains``): the deployment's hosts its list
    names too, lowercase, in the deployment's order; None when it has no list of its own (the
    deployment's apply as they are). A host only the tenant lists is never in it."""
    if policy is None or policy.allowed_media_domains is None:
        return None
    listed = set(policy.allowed_media_domains)
    return tuple(dict.fromkeys(host.lower() for host in deployment if host.lower() in listed))


def default_policy(tenant: str) -> TenantPolicy:
    """The policy of a tenant without a record: the defaults (no limits)."""
    return TenantPolicy(tenant=tenant)


def window_start(now: int) -> int:
    """The start of the creation-rate window holding ``now``."""
    return now - now % HOUR_SECONDS


def retry_after(now: int) -> int:
    """Seconds until the window holding ``now`` ends (at least 1)."""
    return max(1, window_start(now) + HOUR_SECONDS - now)


def admit_creation(tenants: Any, tenant: str, *, now: int, budget_used: Any = None) -> TenantPolicy | None:
    """Admit one batch creation for ``tenant`` at ``now``, or raise ``RateLimited``. One GetItem for
    the policy; with a ``batches_per_hour``, one conditional ADD on the window's counter (the
    counter never exceeds the limit: a refused create counts nothing). ``tenants`` is a
    ``ports.TenantStore``. Returns the policy (None: no record). With an output-token budget and
    ``budget_action="reject"``, a used-up budget refuses first (``QuotaExceeded``, 429
    ``insufficient_quota``): one GetItem of the period's budget item (``budget_used(tenant, sk)``,
    ``BatchStore.budget_used``), only for such a tenant."""
    policy = tenants.get(tenant)
    if (
        policy is not None
        and policy.budget_action == "reject"
        and budget_used is not None
        and (kind := over_budget(policy, lambda: budget_used(tenant, budget_sk(policy.budget_period, now))))
    ):
        raise quota_exceeded(policy, kind)
    if policy is None or policy.batches_per_hour is None:
        return policy
    start = window_start(now)
    limit = policy.batches_per_hour
    if not tenants.count_creation(tenant, start, limit=limit, expires_at=start + HOUR_SECONDS + COUNTER_GRACE_SECONDS):
        raise RateLimited(
            f"Rate limit reached for batch creations: at most {limit} per hour for this organization. "
            f"Try again in {retry_after(now)} seconds.",
            retry_after=retry_after(now),
        )
    return policy


# --- Request rate (requests_per_minute) and the disabled state ----------------------------------
def minute_start(now: int) -> int:
    return now - now % MINUTE_SECONDS


def admit_request(tenants: TenantStore, policy: TenantPolicy | None, *, now: int) -> None:
    """Admit one API request of ``policy``'s tenant at ``now`` (None: a tenant without a record,
    admitted with nothing read or written): ``AccountDeactivated`` for a disabled tenant; with a
    ``requests_per_minute``, one conditional ADD on the minute's counter (a refused request counts
    nothing) and ``RequestRateLimited`` when the window is full, with ``Retry-After`` the seconds
    to its end: the SDK's own retries then wait until requests are counted again."""
    if policy is None:
        return
    if policy.disabled:
        raise AccountDeactivated(DEACTIVATED_MESSAGE)
    limit = policy.requests_per_minute
    if limit is None:
        return
    start = minute_start(now)
    if tenants.count_request(
        policy.tenant, start, limit=limit, expires_at=start + MINUTE_SECONDS + COUNTER_GRACE_SECONDS
    ):
        return
    wait = max(1, start + MINUTE_SECONDS - now)
    raise RequestRateLimited(
        f"Rate limit reached for requests in organization {policy.tenant} on requests per min (RPM): "
        f"Limit {limit}, Used {limit}, Requested 1. Please try again in {wait}s.",
        retry_after=wait,
    )


class PolicyCache:
    """Tenant policies as read at most ``seconds`` ago (by ``clock``, monotonic): the API checks
    the policy on every request, so a process reads each tenant's policy at most once per
    ``seconds`` and a policy change reaches it within that long (0: read every time)."""

    def __init__(self, tenants: TenantStore, seconds: float, clock: Callable[[], float] = time.monotonic):
        self._tenants, self._seconds, self._clock = tenants, seconds, clock
        self._read: dict[str, tuple[float, TenantPolicy | None]] = {}

    def get(self, tenant: str) -> TenantPolicy | None:
        now = self._clock()
        hit = self._read.get(tenant)
        if hit is not None and now - hit[0] < self._seconds:
            return hit[1]
        policy = self._tenants.get(tenant)
        self._read[tenant] = (now, policy)
        return policy


# --- Stored bytes (max_stored_bytes) ------------------------------------------------------------
def storage_quota(tenants: TenantStore, tenant: str) -> int | None:
    """The tenant's ``max_stored_bytes`` (one GetItem; None: no policy, no quota, governance off)."""
    policy = tenants.get(tenant)
    return policy.max_stored_bytes if policy is not None else None


def storage_quota_exceeded(limit: int, used: int, size: int) -> StorageQuotaExceeded:
    """OpenAI's words for a full file storage, with this tenant's numbers."""
    return StorageQuotaExceeded(
        f"You have exceeded your file storage quota. This organization is limited to {limit} bytes of files "
        f"and holds {used} bytes; this one is {size} bytes. Please delete old files or attempt with a smaller "
        "file size."
    )


# --- Enqueued caps (max_enqueued_requests / max_enqueued_tokens) --------------------------------
class Reservation(BaseModel):
    """What a batch reserves on its (tenant, model) counter, and the caps it must stay within
    (None: that dimension is not capped)."""

    tenant: str
    model: str
    requests: int
    tokens: int
    max_requests: int | None = None
    max_tokens: int | None = None

    def bounds(self) -> list[tuple[str, int, int]]:
        """(counter attribute, cap, amount) of each capped dimension: the reservation holds only
        while every attribute stays within its cap after the addition (the DynamoDB adapter renders
        this as its condition, the fake checks it as it is)."""
        return [
            (attribute, cap, n)
            for attribute, cap, n in (
                ("requests", self.max_requests, self.requests),
                ("tokens", self.max_tokens, self.tokens),
            )
            if cap is not None
        ]

    def fits(self, requests: int, tokens: int) -> bool:
        """Whether this reservation fits on a counter at (``requests``, ``tokens``)."""
        held = {"requests": requests, "tokens": tokens}
        return all(held[attribute] + n <= cap for attribute, cap, n in self.bounds())

    def fits_alone(self) -> bool:
        return self.fits(0, 0)

    def exceeded(self, enqueued_requests: int, enqueued_tokens: int) -> str:
        """Which cap ``requests``/``tokens`` more would exceed: "requests" or "tokens" (tokens when
        neither does any more: a concurrent release)."""
        if self.max_requests is not None and enqueued_requests + self.requests > self.max_requests:
            return "requests"
        return "tokens"

    def error(self, which: str) -> dict[str, Any]:
        """The batch's ``errors.data`` line for a reservation refused by the ``which`` cap."""
        if which == "requests":
            what, limit = "Enqueued request limit", f"{self.max_requests} enqueued requests"
        else:
            what, limit = "Enqueued token limit", f"{self.max_tokens} enqueued tokens"
        return {
            "code": "token_limit_exceeded",
            "message": f"{what} reached for {self.model} in organization {self.tenant}. Limit: {limit}. "
            "Please try again once some in_progress batches have been completed.",
            "param": None,
            "line": None,
        }


class Release(BaseModel):
    """What a batch's terminal write gives back to its (tenant, model) counter."""

    tenant: str
    model: str
    requests: int
    tokens: int


def reservation(policy: TenantPolicy | None, model: str, requests: int, tokens: int) -> Reservation | None:
    """The reservation a batch of ``model`` must make under ``policy``; None when the tenant has no
    cap for that model (then nothing is counted: no extra write)."""
    if policy is None:
        return None
    max_requests = policy.max_enqueued_requests.get(model)
    max_tokens = policy.max_enqueued_tokens.get(model)
    if max_requests is None and max_tokens is None:
        return None
    return Reservation(
        tenant=policy.tenant,
        model=model,
        requests=requests,
        tokens=tokens,
        max_requests=max_requests,
        max_tokens=max_tokens,
    )


# --- Token budgets (output_token_budget, input_token_budget / budget_period / budget_action) -----
def budget_caps(policy: TenantPolicy | None) -> BudgetCaps | None:
    """The policy's token budgets (None: it has none: nothing is charged)."""
    if policy is None or (policy.output_token_budget is None and policy.input_token_budget is None):
        return None
    return BudgetCaps(output_tokens=policy.output_token_budget, input_tokens=policy.input_token_budget)


def over_budget(policy: TenantPolicy | None, used: Callable[[], Spent]) -> str | None:
    """The kind of token whose budget ``used()`` (what the current period's item has been charged)
    has reached under ``policy`` (None: no budget, or room left; ``used`` is then not called
    without a budget)."""
    caps = budget_caps(policy)
    return caps.reached(used()) if caps is not None else None


def quota_exceeded(policy: TenantPolicy, kind: str) -> QuotaExceeded:
    caps = budget_caps(policy)
    assert caps is not None
    return QuotaExceeded(
        "You exceeded your current quota, please check your plan and billing details: this organization's "
        f"{caps.describe(kind, policy.budget_period)} is used up."
    )


#: The error code of a batch refused at ingest, and of a line not run, under ``budget_action="stop"``.
BUDGET_EXCEEDED = "budget_exceeded"


def budget_line_message(caps: BudgetCaps, kind: str, period: str) -> str:
    """The error message of a line a worker did not run because a budget was used up."""
    return (
        f"This organization's {caps.describe(kind, period)} was used up while this batch ran; this request was not run. "
        f"Retry it in the next {period}."
    )


def budget_error(policy: TenantPolicy, kind: str) -> dict[str, Any]:
    """The batch error of a batch refused at ingest under ``budget_action="stop"``."""
    caps = budget_caps(policy)
    assert caps is not None
    return {
        "code": BUDGET_EXCEEDED,
        "message": f"This organization's {caps.describe(kind, policy.budget_period)} is used up; no more requests run until the "
        f"next {policy.budget_period}.",
        "param": None,
        "line": None,
    }
