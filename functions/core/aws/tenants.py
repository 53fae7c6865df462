"""The ``TenantStore`` port on the deployment's table: policies in the ``schema.TENANTS_PK``
partition (one item per tenant), creation counters in the tenant's ``schema.creations_pk``
partition (one item per hour window, removed by TTL)."""

from __future__ import annotations

from .. import schema
from ..errors import ConditionFailed
from ..tenants import TenantPolicy
from .dynamodb import Table


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

    def count_creation(self, tenant: str, window_start: int, *, limit: int, expires_at: int) -> bool:
        if limit <= 0:  # the condition below would admit the first create of a window
            return False
        try:
            self._table.add_below(
                schema.creations_pk(tenant), f"HOUR#{window_start:012d}", "count", limit, {schema.TTL: expires_at}
            )
        except ConditionFailed:
            return False
        return True
