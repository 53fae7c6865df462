"""The ``TenantStore`` port on the deployment's table: policies in the ``schema.TENANTS_PK``
partition (one item per tenant), creation counters in the tenant's ``schema.creations_pk``
partition (one item per hour window) and request counters in its ``schema.requests_pk`` partition
(one item per minute window), both removed by TTL."""

from __future__ import annotations

from .. import schema
from ..budgets import BUDGET_KINDS
from ..errors import ConditionFailed
from ..tenants import TenantPolicy
from .dynamodb import Table
from .stored import StoredBytesRepo


class TenantRepo:
    def __init__(self, table: Table):
        self._table = table

    def get(self, tenant: str) -> TenantPolicy | None:
        item = self._table.get(schema.TENANTS_PK, schema.tenant_policy_sk(tenant))
        return TenantPolicy.from_item(item) if item else None

    def put(self, policy: TenantPolicy) -> None:
        self._table.put(policy.to_item())

    def list(self) -> list[TenantPolicy]:
        items, _ = self._table.query_page(
            pk=schema.TENANTS_PK, prefix=schema.tenant_policy_sk(""), after=None, ascending=True, limit=10**9
        )
        return [TenantPolicy.from_item(i) for i in items]

    def usage(self, policy: TenantPolicy, *, now: int) -> dict:
        """What the policy's limits have used now (``batchctl tenants get``): per capped model the
        enqueued requests and tokens, and the current period's charged output and input tokens (one GetItem
        each; nothing for a policy without caps or budget)."""
        from .. import tenants as rules

        enqueued = {}
        for model in sorted({*policy.max_enqueued_requests, *policy.max_enqueued_tokens}):
            item = self._table.get(schema.enqueued_pk(policy.tenant), schema.enqueued_sk(model)) or {}
            enqueued[model] = {"requests": int(item.get("requests", 0)), "tokens": int(item.get("tokens", 0))}
        used: dict = {"enqueued": enqueued}
        if rules.budget_caps(policy) is not None:
            period = rules.budget_sk(policy.budget_period, now)
            item = self._table.get(schema.budget_pk(policy.tenant), period) or {}
            used["budget"] = {"period": period, **{kind: int(item.get(kind, 0)) for kind in BUDGET_KINDS}}
        # The tenant's files and pending uploads (every tenant's are counted, governance on).
        used["stored_bytes"] = StoredBytesRepo(self._table).used(policy.tenant)
        if policy.requests_per_minute is not None:
            item = self._table.get(schema.requests_pk(policy.tenant), _minute_sk(rules.minute_start(now))) or {}
            used["requests_this_minute"] = int(item.get("count", 0))
        return used

    def count_creation(self, tenant: str, window_start: int, *, limit: int, expires_at: int) -> bool:
        return self._count(schema.creations_pk(tenant), f"HOUR#{window_start:012d}", limit, expires_at)

    def count_request(self, tenant: str, window_start: int, *, limit: int, expires_at: int) -> bool:
        return self._count(schema.requests_pk(tenant), _minute_sk(window_start), limit, expires_at)

    def _count(self, pk: str, sk: str, limit: int, expires_at: int) -> bool:
        if limit <= 0:  # the condition below would admit the first count of a window
            return False
        try:
            self._table.add_below(pk, sk, "count", limit, {schema.TTL: expires_at})
        except ConditionFailed:
            return False
        return True


def _minute_sk(window_start: int) -> str:
    return f"MINUTE#{window_start:012d}"
