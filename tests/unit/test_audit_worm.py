"""The audit chains' WORM copy (issue 13 item 5, docs/audit.md "WORM copy"): every appended record is
copied once to the Object Lock bucket by the stream exporter; ``batchctl audit verify --worm``
compares the table with the copies, so a chain rewritten in the table from some record on (every
hash recomputed: ``verify`` alone passes) and a deleted tail are both found."""

import argparse
import io

from aws_lambda_powertools.utilities.data_classes import DynamoDBStreamEvent

from batchctl import audit as audit_cli
from functions.audit_export import handler as export_handler
from functions.audit_export.logic import export
from functions.core import audit, schema
from functions.core.audit import AuditRecord
from tests.fakes.aws import FakeWorm, fake_stores

T0 = 1_796_083_200


def chain(n: int, tenant: str = "acme"):
    stores = fake_stores()
    for i in range(n):
        audit.append(stores.audit, tenant, at=T0 + i, actor="operator", action="tenants.set", outcome="ok",
                     details={"i": i})
    return stores.audit


def copied(store, tenant: str = "acme") -> FakeWorm:
    worm = FakeWorm()
    export(worm, [r.to_json() for r in store.records(tenant)])
    return worm


def verify(store, worm, tenant: str = "acme") -> tuple[int, str]:
    out = io.StringIO()
    code = audit_cli.run(argparse.Namespace(action="verify", tenant=tenant), store, out=out, err=io.StringIO(), worm=worm)
    return code, out.getvalue()


def rewritten_from(records: list[AuditRecord], seq: int, **change) -> list[AuditRecord]:
    """What someone with write access to the table can do: change record ``seq`` and recompute
    every hash after it, so the chain verifies."""
    out, prev = [], audit.GENESIS
    for record in records:
        if record.seq >= seq:
            body = record.body() | {"prev_hash": prev} | (change if record.seq == seq else {})
            body.pop("hash", None)
            record = audit.link(**{k: body[k] for k in ("tenant", "seq", "prev_hash")}, at=body["at"], actor=body["actor"],
                                action=body["action"], outcome=body["outcome"], target=body["target"],
                                request_id=body["request_id"], details=body["details"])
        out.append(record)
        prev = record.hash
    return out


class Table:
    """An AuditStore reading a given list (the table after someone changed it)."""

    def __init__(self, records):
        self._records = records

    def records(self, tenant):
        return list(self._records)


def test_each_record_is_copied_once_under_its_seq():
    store = chain(3)
    worm = copied(store)
    assert sorted(worm.objects) == [audit.worm_key("acme", s) for s in (1, 2, 3)]
    assert worm.objects[audit.worm_key("acme", 2)] == store.records("acme")[1].to_json().encode()
    again = export(worm, [r.to_json() for r in store.records("acme")])  # the stream redelivers
    assert again.written == [] and len(again.duplicates) == 3 and again.conflicts == []


def test_a_different_record_under_a_copied_seq_is_a_conflict_and_the_copy_stays():
    store = chain(2)
    worm = copied(store)
    original = worm.objects[audit.worm_key("acme", 2)]
    forged = rewritten_from(store.records("acme"), 2, outcome="403")[1]
    done = export(worm, [forged.to_json()])
    assert done.conflicts == [audit.worm_key("acme", 2)] and done.written == []
    assert worm.objects[audit.worm_key("acme", 2)] == original


def test_verify_against_the_copies_finds_a_chain_rewritten_in_the_table():
    store = chain(5)
    worm = copied(store)
    assert verify(store, worm) == (0, "OK: tenant 'acme': 5 records, chain intact, 5 match their WORM copies "
                                      "(0 not copied yet)\n")
    forged = Table(rewritten_from(store.records("acme"), 3, details={"i": "changed"}))
    assert audit.verify(forged.records("acme")) is None  # the table alone looks intact
    code, text = verify(forged, worm)
    assert code == 1 and "seq 3" in text and "differs from its WORM copy" in text


def test_verify_against_the_copies_finds_a_deleted_tail_and_reports_export_lag():
    store = chain(4)
    worm = copied(store)
    truncated = Table(store.records("acme")[:2])
    assert audit.verify(truncated.records("acme")) is None
    code, text = verify(truncated, worm)
    assert code == 1 and "seq 3" in text and "not in the table" in text
    lagging = FakeWorm()
    export(lagging, [r.to_json() for r in store.records("acme")[:3]])
    assert verify(store, lagging) == (0, "OK: tenant 'acme': 4 records, chain intact, 3 match their WORM copies "
                                         "(1 not copied yet)\n")


def test_the_handler_takes_the_new_images_of_audit_record_inserts_only():
    store = chain(1)
    record = store.records("acme")[0].to_json()

    def change(name, pk, sk, **image):
        new = {"pk": {"S": pk}, "sk": {"S": sk}, **{k: {"S": v} for k, v in image.items()}}
        return {"eventName": name, "dynamodb": {"Keys": {"pk": new["pk"], "sk": new["sk"]}, "NewImage": new}}

    event = DynamoDBStreamEvent({"Records": [
        change("INSERT", schema.audit_pk("acme"), schema.audit_seq_sk(1), record=record),
        change("INSERT", schema.audit_pk("acme"), schema.AUDIT_DEDUPE_PREFIX + "x", record="{}"),
        change("MODIFY", schema.audit_pk("acme"), schema.audit_seq_sk(1), record=record),
        change("INSERT", schema.batches_pk("acme"), "BATCH#b", record="{}"),
    ]})
    assert export_handler.audit_records(event) == [record]
