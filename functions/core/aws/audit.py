"""The ``AuditStore`` port on the deployment's table: a tenant's chain in its ``schema.audit_pk``
partition, one item per record (sort key = zero-padded seq, written with ``attribute_not_exists``
so a seq is taken once), the record itself as its canonical JSON (no number conversions between
what was hashed and what is read back), and a dedupe marker per intent holding its record's seq.
A chunk receipt's budget charge is an ADD to the tenant's budget item in the same transaction.
Only the audit appender's role may write these items (infra/constructs/audit.py)."""

from __future__ import annotations

from collections.abc import Sequence

from .. import schema
from ..audit import AuditRecord
from ..budgets import Charge
from .dynamodb import Add, Put, Table


def _item(record: AuditRecord) -> dict[str, str]:
    pk = schema.audit_pk(record.tenant)
    return {schema.PK: pk, schema.SK: schema.audit_seq_sk(record.seq), "record": record.to_json()}


class AuditRepo:
    def __init__(self, table: Table):
        self._table = table

    def head(self, tenant: str) -> AuditRecord | None:
        items, _ = self._table.query_page(
            pk=schema.audit_pk(tenant), prefix=schema.AUDIT_SEQ_PREFIX, after=None, ascending=False, limit=1
        )
        return AuditRecord.model_validate_json(items[0]["record"]) if items else None

    def put(self, record: AuditRecord, *, dedupe: str | None = None, charge: Charge | None = None) -> None:
        if dedupe is None:
            if charge is not None:
                raise ValueError("a budget charge needs a dedupe key (it is written once with it)")
            self._table.put(_item(record), if_absent=True)
            return
        self.put_many([(record, dedupe, charge)])

    def put_many(self, entries: Sequence[tuple[AuditRecord, str | None, Charge | None]]) -> None:
        """One transaction: each record and its dedupe marker only if absent, and the budget
        charges, one ADD per budget item (a transaction names an item once)."""
        ops: list[Put | Add] = []
        charges: dict[tuple[str, str], dict[str, int]] = {}
        for record, dedupe, charge in entries:
            ops.append(Put(_item(record), if_absent=True))
            if dedupe is not None:
                marker = {
                    schema.PK: schema.audit_pk(record.tenant),
                    schema.SK: schema.AUDIT_DEDUPE_PREFIX + dedupe,
                    "seq": record.seq,
                }
                ops.append(Put(marker, if_absent=True))
            elif charge is not None:
                raise ValueError("a budget charge needs a dedupe key (it is written once with it)")
            if charge is not None:
                summed = charges.setdefault((schema.budget_pk(record.tenant), charge[0]), {})
                for k, v in charge[1].items():
                    summed[k] = summed.get(k, 0) + v
        ops += [Add(pk, sk, values) for (pk, sk), values in charges.items()]
        self._table.transact(ops)

    def dedupe_seq(self, tenant: str, key: str) -> int | None:
        item = self._table.get(schema.audit_pk(tenant), schema.AUDIT_DEDUPE_PREFIX + key)
        return int(item["seq"]) if item is not None else None

    def record(self, tenant: str, seq: int) -> AuditRecord | None:
        item = self._table.get(schema.audit_pk(tenant), schema.audit_seq_sk(seq))
        return AuditRecord.model_validate_json(item["record"]) if item is not None else None

    def records(self, tenant: str) -> list[AuditRecord]:
        items, _ = self._table.query_page(
            pk=schema.audit_pk(tenant), prefix=schema.AUDIT_SEQ_PREFIX, after=None, ascending=True, limit=10**9
        )
        return [AuditRecord.model_validate_json(i["record"]) for i in items]
