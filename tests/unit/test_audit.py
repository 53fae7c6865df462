"""The audit chain (functions.core.audit) against the fake AuditStore: append, verify's three
tamperings, concurrent appenders, dedupe of chunk receipts, the API's one hook."""

import threading

import pytest

from functions.core import audit
from functions.core.audit import AuditRecord
from tests.fakes.aws import FakeAudit, Faults


def chain(n: int = 4, tenant: str = "acme") -> tuple[FakeAudit, list[AuditRecord]]:
    store = FakeAudit(Faults())
    for i in range(n):
        audit.append(
            store,
            tenant,
            at=100 + i,
            actor="key:abc",
            action="files.create",
            outcome="200",
            target=f"file-{i}",
            request_id=f"req-{i}",
        )
    return store, store.records(tenant)


def test_append_links_records():
    _, records = chain(3)
    assert [r.seq for r in records] == [1, 2, 3]
    assert records[0].prev_hash == audit.GENESIS
    assert records[1].prev_hash == records[0].hash and records[2].prev_hash == records[1].hash
    assert all(r.hash == r.computed_hash() for r in records)
    assert audit.verify(records) is None


def test_verify_detects_an_edited_record():
    _, records = chain()
    records[2] = records[2].model_copy(update={"outcome": "500"})
    broken = audit.verify(records)
    assert broken is not None and (broken.position, broken.seq) == (3, 3) and "edited" in broken.reason


def test_verify_detects_a_deleted_record():
    _, records = chain()
    del records[1]
    broken = audit.verify(records)
    assert broken is not None and (broken.position, broken.seq) == (2, 3) and "expected seq 2" in broken.reason


def test_verify_detects_a_deleted_record_renumbered():
    """Deleting a record and renumbering the rest (seq fixed up) still breaks the prev_hash link."""
    _, records = chain()
    rest = [records[0]] + [r.model_copy(update={"seq": r.seq - 1}) for r in records[2:]]
    broken = audit.verify(rest)
    assert broken is not None and broken.position == 2 and "prev_hash" in broken.reason


def test_verify_detects_a_reordered_pair():
    _, records = chain()
    records[1], records[2] = records[2], records[1]
    broken = audit.verify(records)
    assert broken is not None and (broken.position, broken.seq) == (2, 3) and "expected seq 2" in broken.reason


def test_verify_detects_a_reordered_pair_with_swapped_seqs():
    _, records = chain()
    a, b = records[1], records[2]
    records[1], records[2] = b.model_copy(update={"seq": 2}), a.model_copy(update={"seq": 3})
    broken = audit.verify(records)
    assert broken is not None and broken.position == 2


def test_concurrent_appends_never_fork():
    store = FakeAudit(Faults())
    threads, per_thread = 8, 25
    barrier = threading.Barrier(threads)

    def writer(t: int) -> None:
        barrier.wait()
        for i in range(per_thread):
            audit.append(
                store,
                "acme",
                at=1,
                actor=f"key:{t}",
                action="batches.create",
                outcome="200",
                target=f"{t}-{i}",
                sleep=lambda _: None,
                attempts=10_000,
            )

    workers = [threading.Thread(target=writer, args=(t,)) for t in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    records = store.records("acme")
    assert [r.seq for r in records] == list(range(1, threads * per_thread + 1))
    assert len({r.target for r in records}) == threads * per_thread
    assert audit.verify(records) is None


def test_lost_race_rereads_the_head():
    """A writer whose seq was taken meanwhile appends after the winner's record."""
    store, _ = chain(1)
    real_head = store.head
    calls = []

    def stale_head(tenant):
        head = real_head(tenant)
        if not calls:  # the first read is stale: someone appends right after it
            calls.append(1)
            audit.append(store, tenant, at=2, actor="operator", action="keys.create", outcome="ok")
        return head

    store.head = stale_head
    record = audit.append(
        store, "acme", at=3, actor="key:x", action="batches.cancel", outcome="200", sleep=lambda _: None
    )
    assert record is not None and record.seq == 3
    assert audit.verify(store.records("acme")) is None


def test_dedupe_appends_once():
    store = FakeAudit(Faults())
    key = audit.receipt_key("batch_1", 3)
    first = audit.append(store, "acme", at=1, actor="worker", action=audit.CHUNK_RECEIPT, outcome="ok", dedupe=key)
    again = audit.append(store, "acme", at=2, actor="worker", action=audit.CHUNK_RECEIPT, outcome="ok", dedupe=key)
    assert first is not None and again is None
    assert len(store.records("acme")) == 1


def test_chains_are_per_tenant():
    store, _ = chain(2, "acme")
    audit.append(store, "globex", at=1, actor="operator", action="tenants.set", outcome="ok")
    assert [r.seq for r in store.records("globex")] == [1]
    assert store.records("globex")[0].prev_hash == audit.GENESIS


@pytest.mark.parametrize(
    ("method", "path", "expected"),
    [
        ("POST", "/v1/files", ("files.create", None)),
        ("DELETE", "/v1/files/file-1", ("files.delete", "file-1")),
        ("POST", "/v1/batches/batch_1/cancel", ("batches.cancel", "batch_1")),
        ("POST", "/v1/uploads/upload_1/parts", ("uploads.add_part", "upload_1")),
        ("GET", "/v1/batches/batch_1", None),
        ("GET", "/v1/files", None),
    ],
)
def test_api_actions(method, path, expected):
    assert audit.api_action(method, path) == expected
