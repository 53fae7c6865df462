"""The ``AuditStore`` port on the deployment's table: a tenant's chain in its ``schema.audit_pk``
partition, one item per record (sort key = zero-padded seq, written with ``attribute_not_exists``
so a seq is taken once), the record itself as its canonical JSON (no number conversions between
what was hashed and what is read back), and a dedupe marker per intent holding its record's seq.
A chunk receipt's budget charge is an ADD to the tenant's budget item in the same transaction.
Only the audit appender's role may write these items (infra/constructs/audit.py)."""

from __future__ import annotations

from .. import schema
from ..audit import AuditRecord
from ..budgets import Charge
from .dynamodb import Add, Put, Table


class AuditRepo:
    def __init__(self, table: Table):
        self._table = table

    def head(self, tenant: str) -> AuditRecord | None:
        items, _ = self._table.query_page(
            pk=schema.audit_pk(tenant), prefix=schema.AUDIT_SEQ_PREFIX, after=None, ascending=False, limit=1
        )
        return AuditRecord.model_validate_json(items[0]["record"]) if items else None

    def put(self, record: AuditRecord, *, dedupe: str | None = None, charge: Charge | None = None) -> None:
        pk = schema.audit_pk(record.tenant)
        item = {schema.PK: pk, schema.SK: schema.audit_seq_sk(record.seq), "record": record.to_json()}
        if dedupe is None:
            if charge is not None:
                raise ValueError("a budget charge needs a dedupe key (it is written once with it)")
            self._table.put(item, if_absent=True)
            return
        marker = {schema.PK: pk, schema.SK: schema.AUDIT_DEDUPE_PREFIX + dedupe, "seq": record.seq}
        ops: list[Put | Add] = [Put(item, if_absent=True), Put(marker, if_absent=True)]
        if charge is not None:
            ops.append(Add(schema.budget_pk(record.tenant), *charge))
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
