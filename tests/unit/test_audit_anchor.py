"""``anchor.examine`` and ``batchctl audit verify`` (docs/audit.md, "Verify"): the table's chain
against its WORM copies and signed checkpoints, one test per finding. The chains are appended
through the appender's own logic (``FakeAuditLog``); the tampering is what a writer of the table,
of the bucket or of another key could do."""

import argparse
import io

import pytest

from batchctl import audit as audit_cli
from functions.core import anchor, audit, signing
from functions.core.audit import AuditRecord
from tests.fakes.aws import FakeAudit, FakeAuditLog, FakeWorm, Faults, KeySigner, fake_stores

T0 = 1_796_083_200
TENANT = "acme"


def appended(n: int) -> FakeAuditLog:
    log = fake_stores().audit_log
    for i in range(n):
        log.record(audit.operator_intent(TENANT, "tenants.set", at=T0 + i, target=TENANT, details={"i": i}))
    return log


def examine(
    log: FakeAuditLog, chain=None, worm: FakeWorm | None = None, key: bytes | None = None
) -> anchor.Examination:
    worm = worm or log.worm
    copies = anchor.by_seq(worm.originals(anchor.worm_prefix(TENANT)), anchor.worm_prefix(TENANT))
    checkpoints = anchor.by_seq(worm.originals(anchor.checkpoint_prefix(TENANT)), anchor.checkpoint_prefix(TENANT))
    records = (chain or log.chain).records(TENANT)
    return anchor.examine(TENANT, records, copies, checkpoints, signing.verifier(key or log.signer.public_key()))


def kinds(found: anchor.Examination) -> list[tuple[str, int]]:
    return [(f.kind, f.seq) for f in found.findings]


def rewritten_from(records: list[AuditRecord], seq: int, **change) -> list[AuditRecord]:
    """What a writer of the table can do: change record ``seq`` and recompute every hash after it,
    so the chain's own links hold."""
    out, prev = [], audit.GENESIS
    for record in records:
        if record.seq >= seq:
            content = record.content() | (change if record.seq == seq else {})
            record = audit.link(content.pop("tenant"), record.seq, prev, **content)
        out.append(record)
        prev = record.hash
    return out


class Table:
    """An AuditStore reading a given list (the table after someone changed it)."""

    def __init__(self, records: list[AuditRecord]):
        self._records = records

    def records(self, tenant: str) -> list[AuditRecord]:
        return list(self._records)


def test_an_untouched_chain_is_intact_and_anchored_at_its_head():
    log = appended(5)
    found = examine(log)
    assert found.intact and (found.records, found.copies, found.checkpoints) == (5, 5, 5)
    assert (found.anchored, found.unanchored, found.uncopied) == (5, 0, 0)


def test_a_record_rewritten_with_every_later_hash_recomputed_is_found():
    log = appended(5)
    forged = Table(rewritten_from(log.chain.records(TENANT), 3, outcome="denied"))
    assert audit.verify(forged.records(TENANT)) is None  # the table alone looks intact
    found = examine(log, chain=forged)
    assert not found.intact
    rewritten = sorted({seq for kind, seq in kinds(found) if kind == "rewritten"})
    assert rewritten == [3, 4, 5]  # each differs from its copy, and from its signed checkpoint
    assert {kind for kind, _ in kinds(found)} == {"rewritten"}


def test_a_cut_tail_is_found_by_the_copies_and_the_checkpoint_beyond_the_head():
    log = appended(4)
    truncated = Table(log.chain.records(TENANT)[:3])
    assert audit.verify(truncated.records(TENANT)) is None
    found = examine(log, chain=truncated)
    assert kinds(found) == [("cut_tail", 4), ("cut_tail", 4)]  # its copy, and the checkpoint at 4
    assert "beyond the table's head (seq 3)" in found.findings[0].reason


def test_a_deleted_middle_record_is_found():
    log = appended(4)
    found = examine(log, chain=Table([r for r in log.chain.records(TENANT) if r.seq != 2]))
    assert ("link", 3) in kinds(found) and ("deleted", 2) in kinds(found)


def test_a_record_inserted_outside_the_appender_below_the_newest_checkpoint_is_a_forged_insert():
    log = appended(2)
    head = log.chain.head(TENANT)
    forged = audit.link(TENANT, 3, head.hash, at=T0, actor="key:abc", action="files.delete", outcome="200")
    log.chain.put(forged)  # a writer of the table appends a record of its own...
    log.record(audit.operator_intent(TENANT, "keys.create", at=T0 + 9))  # ...and the appender goes on from it
    found = examine(log)
    assert kinds(found) == [("forged_insert", 3)] and found.anchored == 4


def test_records_after_the_newest_checkpoint_are_lag_not_a_break():
    log = appended(3)
    for seq in (2, 3):  # as if the appender had not signed past seq 1 yet
        del log.worm.versions[anchor.checkpoint_key(TENANT, seq)]
    del log.worm.versions[anchor.worm_key(TENANT, 3)]  # and not copied seq 3 yet
    found = examine(log)
    assert found.intact and (found.anchored, found.unanchored, found.uncopied) == (1, 2, 1)


def test_a_cut_tail_after_the_newest_checkpoint_and_its_copies_is_not_seen():
    """The window docs/audit.md states: what was neither copied nor signed yet can go unseen."""
    log = appended(3)
    for seq in (2, 3):
        del log.worm.versions[anchor.checkpoint_key(TENANT, seq)]
        del log.worm.versions[anchor.worm_key(TENANT, seq)]
    found = examine(log, chain=Table(log.chain.records(TENANT)[:1]))
    assert found.intact and found.anchored == 1


def test_a_checkpoint_signed_with_another_key_is_forged_and_anchors_nothing():
    log = appended(2)
    other = KeySigner("another-key")
    record = log.chain.head(TENANT)
    fake = anchor.Checkpoint(tenant=TENANT, seq=9, hash=record.hash, at=T0, key_id=log.signer.key_id)
    log.worm.put_once(
        anchor.checkpoint_key(TENANT, 9), anchor.signed(fake, other.sign(fake.message())).to_json().encode()
    )
    found = examine(log)
    assert kinds(found) == [("forged_checkpoint", 9)] and found.anchored == 2


def test_a_checkpoint_edited_after_signing_fails_its_signature():
    log = appended(1)
    key = anchor.checkpoint_key(TENANT, 1)
    text = log.worm.versions[key][0].decode()
    edited = anchor.SignedCheckpoint.model_validate_json(text)
    edited = edited.model_copy(update={"checkpoint": edited.checkpoint.model_copy(update={"hash": "f" * 64})})
    log.worm.versions[key] = [edited.to_json().encode()]
    assert kinds(examine(log)) == [("forged_checkpoint", 1)]


def test_a_copy_overwritten_or_hidden_is_reported_and_its_first_version_still_counts():
    log = appended(2)
    key = anchor.worm_key(TENANT, 2)
    original = log.worm.versions[key][0]
    log.worm.overwrite(key, b'{"not": "it"}')
    log.worm.hide(anchor.worm_key(TENANT, 1))
    found = examine(log)
    assert kinds(found) == [("copy_hidden", 1), ("copy_overwritten", 2)]
    assert log.worm.originals(key)[key].body == original


def test_a_copy_that_is_not_its_record_is_invalid_and_a_checkpoint_without_a_copy_is_reported():
    log = appended(2)
    log.worm.versions[anchor.worm_key(TENANT, 1)] = [b"garbage"]
    del log.worm.versions[anchor.worm_key(TENANT, 2)]
    found = examine(log)
    assert kinds(found) == [
        ("copy_invalid", 1),
        ("copy_missing", 1),
        ("forged_insert", 1),
        ("copy_missing", 2),
        ("forged_insert", 2),
    ]


# --- batchctl audit verify: its report and exit codes -------------------------------------------
def verify(store, worm, key) -> tuple[int, str]:
    out, err = io.StringIO(), io.StringIO()
    code = audit_cli.run(
        argparse.Namespace(action="verify", tenant=TENANT), store, out=out, err=err, worm=worm, key=key
    )
    return code, out.getvalue() + err.getvalue()


def test_verify_exits_0_on_an_intact_chain_1_on_a_broken_one_3_without_anchors():
    log = appended(3)
    key = log.signer.public_key()
    assert verify(log.chain, log.worm, key) == (
        audit_cli.INTACT,
        "OK: tenant 'acme': 3 records, 3 WORM copies, newest signed checkpoint at seq 3: 0 after it "
        "not anchored yet (0 of them not copied yet)\n",
    )
    code, text = verify(Table(log.chain.records(TENANT)[:2]), log.worm, key)
    assert code == audit_cli.BROKEN and text.startswith("BROKEN: tenant 'acme': 2 findings")
    assert "seq 3: cut_tail" in text
    code, text = verify(log.chain, log.worm, KeySigner().public_key())  # not the deployment's key
    assert code == audit_cli.BROKEN and text.count("forged_checkpoint") == 3
    assert verify(log.chain, None, key)[0] == audit_cli.UNVERIFIABLE


def test_verify_of_an_empty_chain_is_intact():
    chain = FakeAudit(Faults())
    code, text = verify(chain, FakeWorm(), KeySigner().public_key())
    assert code == audit_cli.INTACT and "0 records" in text


@pytest.mark.parametrize("n", [1, 60])
def test_verify_prints_at_most_fifty_findings(n):
    log = appended(n)
    code, text = verify(Table([]), log.worm, log.signer.public_key())
    assert code == audit_cli.BROKEN
    shown = [line for line in text.splitlines() if line.startswith("  seq ")]
    assert len(shown) == min(2 * n, audit_cli.SHOWN_FINDINGS)
    assert ("more" in text) == (2 * n > audit_cli.SHOWN_FINDINGS)
