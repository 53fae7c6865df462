"""The AuditStore contract on both sides (the DynamoDB adapter on moto, the fake), and concurrent
appenders against moto: the conditional write per seq keeps the chain from forking."""

import threading

import pytest

from functions.core import audit
from functions.core.errors import ConditionFailed
from functions.core.ports import AuditStore
from tests.fakes.aws import FakeAudit, Faults


@pytest.fixture(params=["moto", "fake"])
def store(request: pytest.FixtureRequest) -> AuditStore:
    if request.param == "fake":
        return FakeAudit(Faults())
    return request.getfixturevalue("appender").chain


def test_audit_store_conditions(store: AuditStore):
    assert store.head("acme") is None and store.records("acme") == [] and store.record("acme", 1) is None
    first = audit.append(
        store,
        "acme",
        at=1,
        actor="key:abc",
        action="files.create",
        outcome="200",
        details={"bytes": 12, "name": "ünïcode.jsonl"},
    )
    assert store.head("acme") == first
    with pytest.raises(ConditionFailed):  # the seq is taken: never overwritten
        store.put(audit.link("acme", 1, audit.GENESIS, at=9, actor="x", action="y", outcome="ok"))
    key = audit.receipt_key("batch_1", 0)
    second = audit.append(store, "acme", at=2, actor="worker", action=audit.CHUNK_RECEIPT, outcome="ok", dedupe=key)
    assert second is not None and store.dedupe_seq("acme", key) == 2 and store.dedupe_seq("globex", key) is None
    assert store.record("acme", 2) == second and store.record("globex", 2) is None
    with pytest.raises(ConditionFailed):  # a free seq, a used dedupe key: nothing written
        store.put(audit.link("acme", 3, second.hash, at=3, actor="worker", action="x", outcome="ok"), dedupe=key)
    assert store.head("acme") == second
    assert (
        audit.append(store, "acme", at=4, actor="worker", action=audit.CHUNK_RECEIPT, outcome="ok", dedupe=key) is None
    )
    records = store.records("acme")
    assert records == [first, second] and audit.verify(records) is None
    assert store.records("globex") == []


def test_records_written_together_are_all_or_nothing(store: AuditStore):
    first = audit.link("acme", 1, audit.GENESIS, at=1, actor="a", action="x", outcome="ok")
    second = audit.link("acme", 2, first.hash, at=2, actor="a", action="x", outcome="ok")
    store.put_many([(first, "k1", None), (second, "k2", None)])
    assert store.records("acme") == [first, second] and store.dedupe_seq("acme", "k2") == 2
    third = audit.link("acme", 3, second.hash, at=3, actor="a", action="x", outcome="ok")
    fourth = audit.link("acme", 4, third.hash, at=4, actor="a", action="x", outcome="ok")
    with pytest.raises(ConditionFailed):  # a used dedupe key in one of them: none written
        store.put_many([(third, "k3", None), (fourth, "k1", None)])
    assert store.head("acme") == second and store.dedupe_seq("acme", "k3") is None


def test_concurrent_appends_on_dynamodb_never_fork(appender):
    # moto's DynamoDB requests are atomic, as DynamoDB's conditional writes are, through the aws
    # fixture's atomic_dynamodb (in-process moto alone lets two threads both pass
    # attribute_not_exists): the test exercises our retry logic, not moto's missing isolation.
    store = appender.chain
    threads, per_thread = 4, 8
    barrier = threading.Barrier(threads)
    errors: list[BaseException] = []

    def writer(t: int) -> None:
        try:
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
                    attempts=1000,
                    sleep=lambda _: None,
                )
        except BaseException as exc:
            errors.append(exc)

    workers = [threading.Thread(target=writer, args=(t,)) for t in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    assert errors == []
    records = store.records("acme")
    assert [r.seq for r in records] == list(range(1, threads * per_thread + 1))
    assert len({r.target for r in records}) == threads * per_thread
    assert audit.verify(records) is None


def test_a_budget_charge_without_a_dedupe_key_is_refused(store: AuditStore):
    """A charge is written once because its record's dedupe key is: without one it is refused, and
    nothing is written."""
    with pytest.raises(ValueError):
        store.put(
            audit.link("acme", 1, audit.GENESIS, at=1, actor="worker", action="x", outcome="ok"),
            charge=("MONTH#2026-12", {"output_tokens": 1}),
        )
    assert store.records("acme") == []
