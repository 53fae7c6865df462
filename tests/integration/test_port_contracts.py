"""The port contracts, checked on both sides: the AWS adapters on moto and the in-memory fakes the
unit tests use must behave alike (conditions, atomic counting, set ADDs, writers that leave nothing
behind, queue receipts). A fake that is kinder than the adapter fails here."""

import threading

import pytest

from functions.core import lifecycle, schema
from functions.core.errors import ChunksStopped, ConditionFailed
from functions.core.lifecycle import Change
from functions.core.ports import Stores
from functions.core.records import BatchRecord, ChunkRecord, FileRecord
from tests.builders import batch_record
from tests.fakes.aws import fake_stores


@pytest.fixture(params=["moto", "fake"])
def ports(request: pytest.FixtureRequest) -> Stores:
    if request.param == "fake":
        return fake_stores()
    return request.getfixturevalue("stores")


@pytest.fixture
def queue_url(ports: Stores, request: pytest.FixtureRequest) -> str:
    if isinstance(ports, type(fake_stores())):
        return "fake://work"
    return request.getfixturevalue("deployed").models["test-chat"].queue_url


def new_batch(**over) -> BatchRecord:
    fields = dict(id="batch_c1", expires_at=200, status="in_progress", model="m", chunk_count=2, accepting=True)
    return batch_record(**{**fields, **over})


def marker(chunk: int, completed: int = 2) -> ChunkRecord:
    return ChunkRecord(
        tenant="acme",
        batch_id="batch_c1",
        chunk=chunk,
        attempt="a",
        completed=completed,
        failed=1,
        input_tokens=7,
        recorded_at=1,
        expires_at=10**10,
    )


def test_batch_transition_conditions(ports: Stores):
    ports.batches.create(new_batch())
    with pytest.raises(ConditionFailed):
        ports.batches.create(new_batch())
    updated = ports.batches.transition(
        "acme",
        "batch_c1",
        Change(
            values={"status": "cancelling"},
            defaults={"cancelling_at": 5},
            expect={"status": ("in_progress", "validating")},
        ),
    )
    assert (updated.status, updated.cancelling_at) == ("cancelling", 5)
    again = ports.batches.transition("acme", "batch_c1", Change(defaults={"cancelling_at": 9}, add={"failed": 1}))
    assert again.cancelling_at == 5 and again.failed == 1
    again = ports.batches.transition("acme", "batch_c1", Change(add={"failed": 2, "completed": 3}))
    assert again.failed == 3 and again.completed == 3
    with pytest.raises(ConditionFailed):
        ports.batches.transition(
            "acme", "batch_c1", Change(values={"status": "failed"}, expect={"status": "in_progress"})
        )
    with pytest.raises(ConditionFailed):  # absent attribute expected, present
        ports.batches.transition("acme", "batch_c1", Change(values={"model": "x"}, expect={"cancelling_at": None}))
    with pytest.raises(ConditionFailed):  # no such batch: never created by a transition
        ports.batches.transition("acme", "nope", Change(values={"status": "failed"}))
    assert ports.batches.get("acme", "nope") is None
    assert ports.batches.get("globex", "batch_c1") is None  # keyed by tenant
    removed = ports.batches.transition(
        "acme", "batch_c1", Change(remove=("cancelling_at",), expect={"cancelling_at": 5})
    )
    assert removed.cancelling_at is None


def test_a_chunk_counts_once_and_only_while_accepting(ports: Stores):
    ports.batches.create(new_batch())
    assert ports.batches.count_chunk(marker(0))
    assert not ports.batches.count_chunk(marker(0, completed=99))
    batch = ports.batches.get("acme", "batch_c1")
    assert (batch.completed, batch.failed, batch.input_tokens, batch.chunks_done) == (2, 1, 7, 1)
    assert ports.batches.counted_chunk("acme", "batch_c1", 0).completed == 2
    assert ports.batches.counted_chunk("acme", "batch_c1", 1) is None
    ports.batches.transition("acme", "batch_c1", Change(values={"accepting": False}))
    assert not ports.batches.count_chunk(marker(1))
    assert ports.batches.counted_chunk("acme", "batch_c1", 1) is None  # the marker rolled back with it
    assert set(ports.batches.counted_chunks("acme", "batch_c1")) == {0}


def test_a_batch_counted_on_shards_starts_counts_and_folds_each_shard_once(ports: Stores):
    from functions.core.records import ChunkRunRecord, CountShardRecord

    batch = new_batch(chunk_count=5, count_shards=2)
    ports.batches.create(batch)
    shards = CountShardRecord.of(batch, 0)
    assert [(s.shard, s.chunk_count) for s in shards] == [(0, 3), (1, 2)]
    ports.batches.open_shards(shards)
    ports.batches.save_chunk_run(run(3, shards=2), starting=True)  # opened on its shard, not the batch
    ports.batches.open_shards(shards)  # ingest again: what is stored stays
    assert ports.batches.count_shard("acme", "batch_c1", 1).chunks_done == 0
    on = [marker(c).model_copy(update={"count_shards": 2}) for c in range(5)]
    assert ports.batches.count_chunk(on[1]) and ports.batches.count_chunk(on[3])
    assert not ports.batches.count_chunk(on[3])
    ports.batches.save_chunk_run(
        ChunkRunRecord(tenant="acme", batch_id="batch_c1", chunk=2, version=1, expires_at=10**10, count_shards=2)
    )
    shard = ports.batches.count_shard("acme", "batch_c1", 1)
    assert (shard.chunks_done, shard.completed, shard.failed, shard.input_tokens) == (2, 4, 2, 14)
    assert shard.all_counted and not shard.folded
    assert ports.batches.get("acme", "batch_c1").chunks_done == 0  # the batch's item is not written
    assert ports.batches.counted_chunk("acme", "batch_c1", 3, 2).completed == 2
    assert ports.batches.chunk_run("acme", "batch_c1", 2, 2).version == 1
    assert not ports.batches.fold_shard(ports.batches.count_shard("acme", "batch_c1", 0))  # not fully counted
    stale = shard.model_copy(update={"chunks_done": 1, "chunk_count": 1})
    assert not ports.batches.fold_shard(stale)  # counters that are not the stored ones fold nothing
    assert ports.batches.fold_shard(shard)
    assert not ports.batches.fold_shard(shard)  # once
    folded = ports.batches.get("acme", "batch_c1")
    assert (folded.chunks_done, folded.completed, folded.failed, folded.input_tokens) == (2, 4, 2, 14)
    assert set(ports.batches.counted_chunks("acme", "batch_c1", 2)) == {1, 3}
    markers, runs = ports.batches.chunk_states("acme", "batch_c1", 2)
    assert set(markers) == {1, 3} and set(runs) == {2, 3}
    assert shard.counted_chunks == {1, 3}
    progress = ports.batches.chunk_progress(folded)  # the counters of every shard, the others' runs
    assert progress.counted == (4, 2) and progress.checkpointed == {2: (0, 0)}
    ports.batches.close_shards(folded, accepting=True)  # the drain: no new start, counts still taken
    with pytest.raises(ChunksStopped):
        ports.batches.save_chunk_run(run(0, shards=2), starting=True)
    assert ports.batches.chunk_run("acme", "batch_c1", 0, 2) is None
    assert ports.batches.count_chunk(on[0])
    ports.batches.transition("acme", "batch_c1", Change(values={"accepting": False}))
    ports.batches.close_shards(folded, accepting=False)  # the close: no count either
    ports.batches.close_shards(folded, accepting=False)  # again: nothing changes
    assert not ports.batches.count_chunk(on[2])
    assert ports.batches.counted_chunk("acme", "batch_c1", 2, 2) is None  # the marker rolled back with it
    stored = ports.batches.count_shards(ports.batches.get("acme", "batch_c1"))
    assert [(s.shard, s.starting, s.accepting, s.chunks_done) for s in stored] == [
        (0, False, False, 1),
        (1, False, False, 2),
    ]


def run(chunk: int, version: int = 1, shards: int = 1, **fields):
    from functions.core.records import ChunkRunRecord

    return ChunkRunRecord(
        tenant="acme",
        batch_id="batch_c1",
        chunk=chunk,
        version=version,
        expires_at=10**10,
        count_shards=shards,
        **fields,
    )


def test_count_markers_are_read_together_across_shards(ports: Stores):
    from functions.core.records import CountShardRecord

    sharded = new_batch(chunk_count=3, count_shards=2)
    ports.batches.create(sharded)
    ports.batches.open_shards(CountShardRecord.of(sharded, 0))
    ports.batches.create(new_batch(id="batch_c2"))
    assert ports.batches.count_chunk(marker(1).model_copy(update={"count_shards": 2}))
    assert ports.batches.count_chunk(marker(0).model_copy(update={"batch_id": "batch_c2"}))
    found = ports.batches.count_markers(
        [("acme", "batch_c1", 1, 2), ("acme", "batch_c1", 2, 2), ("acme", "batch_c2", 0, 1)]
    )
    assert (
        set(found) == {("acme", "batch_c1", 1), ("acme", "batch_c2", 0)}
        and found[("acme", "batch_c1", 1)].completed == 2
    )
    assert ports.batches.count_markers([("globex", "batch_c1", 1, 2)]) == {}  # keyed by tenant


def test_an_attempt_opens_only_while_the_batch_takes_chunks(ports: Stores):
    ports.batches.create(new_batch())
    ports.batches.save_chunk_run(run(0, open=["a"]), starting=True)
    assert ports.batches.chunk_run("acme", "batch_c1", 0).open == ["a"]
    with pytest.raises(ConditionFailed) as stale:  # a concurrent attempt's write: the version says so
        ports.batches.save_chunk_run(run(0, open=["b"]), starting=True)
    assert not isinstance(stale.value, ChunksStopped)
    ports.batches.save_chunk_run(run(0, version=2, open=["a", "b"]), starting=True)
    assert ports.batches.chunk_state("acme", "batch_c1", 0) == (None, run(0, version=2, open=["a", "b"]))
    for values in ({"status": "cancelling"}, {"status": "in_progress", "accepting": False}):
        ports.batches.transition("acme", "batch_c1", Change(values=values))
        with pytest.raises(ChunksStopped):
            ports.batches.save_chunk_run(run(1, open=["c"]), starting=True)
        assert ports.batches.chunk_run("acme", "batch_c1", 1) is None  # nothing written
    ports.batches.save_chunk_run(run(0, version=3, open=[]))  # a benign end needs no open batch
    assert ports.batches.chunk_run("acme", "batch_c1", 0).version == 3
    with pytest.raises(ChunksStopped):  # no such batch
        ports.batches.save_chunk_run(run(0).model_copy(update={"batch_id": "nope"}), starting=True)


def test_chunk_states_reads_markers_and_run_records_of_one_batch(ports: Stores):
    from functions.core.records import ChunkRunRecord

    ports.batches.create(new_batch())
    ports.batches.create(new_batch(id="batch_c2"))
    assert ports.batches.chunk_states("acme", "batch_c1") == ({}, {})
    run = ChunkRunRecord(
        tenant="acme",
        batch_id="batch_c1",
        chunk=1,
        version=1,
        segments=[[0, 3]],
        outcomes={"0-3": "101"},
        expires_at=10**10,
    )
    ports.batches.save_chunk_run(run)
    ports.batches.save_chunk_run(run.model_copy(update={"batch_id": "batch_c2", "chunk": 0}))
    assert ports.batches.count_chunk(marker(0))
    markers, runs = ports.batches.chunk_states("acme", "batch_c1")
    assert set(markers) == {0} and markers[0].completed == 2
    assert set(runs) == {1} and runs[1].outcomes == {"0-3": "101"} and runs[1].checkpointed() == (2, 1)
    assert ports.batches.chunk_states("globex", "batch_c1") == ({}, {})  # keyed by tenant
    batch = ports.batches.get("acme", "batch_c1")
    assert batch.counted_chunks == {0}
    progress = ports.batches.chunk_progress(batch)  # the batch's counters, the other chunk's run
    assert progress.counted == (2, markers[0].failed) and progress.checkpointed == {1: (2, 1)}
    assert progress.lines() == (4, markers[0].failed + 1)
    ports.batches.save_chunk_run(run.model_copy(update={"chunk": 0}))  # a counted chunk's run record
    assert ports.batches.chunk_progress(batch).lines() == (4, markers[0].failed + 1)
    assert ports.batches.chunk_progress(new_batch(tenant="globex")).lines() == (0, 0)  # keyed by tenant


def test_finish_is_atomic(ports: Stores):
    ports.batches.create(new_batch(accepting=False))
    f = FileRecord(
        tenant="acme",
        id="file-out",
        filename="o.jsonl",
        purpose="batch_output",
        bytes=3,
        created_at=1,
        expires_at=10**10,
        s3_key="files/acme/file-out",
    )
    with pytest.raises(ConditionFailed):
        ports.batches.transition(
            "acme", "batch_c1", lifecycle.finish(1, status="completed", closed_from="finalizing", values={}), files=[f]
        )
    assert ports.files.get("acme", "file-out", now=2) is None  # no file without the status
    ports.batches.transition(
        "acme", "batch_c1", lifecycle.finish(1, status="completed", closed_from="in_progress", values={}), files=[f]
    )
    assert ports.files.get("acme", "file-out", now=2) is not None
    assert ports.batches.get("acme", "batch_c1").status == "completed"


def test_a_writer_leaves_nothing_on_error_or_when_empty(ports: Stores):
    with pytest.raises(RuntimeError), ports.objects.writer("x/failed") as w:
        w.write(b"partial")
        raise RuntimeError("died mid-assembly")
    with ports.objects.writer("x/empty"):
        pass
    with ports.objects.writer("x/ok") as w:
        w.write(b"ab")
        w.write(b"c")
    assert ports.objects.list_keys("x/") == ["x/ok"] and ports.objects.get("x/ok") == b"abc"
    assert b"".join(ports.objects.iter_range("x/ok", 1, 3)) == b"bc"


def test_objects_read_ahead_come_in_order_and_a_missing_one_fails_at_its_turn(ports: Stores):
    keys = [f"parts/{i:02d}" for i in range(7)]  # more than limits.S3_READ_AHEAD
    for i, key in enumerate(keys):
        ports.objects.put(key, f"part {i}\n".encode() * (i + 1))
    assert [b"".join(part) for part in ports.objects.iter_objects(keys)] == [ports.objects.get(k) for k in keys]
    assert list(ports.objects.iter_objects([])) == []

    parts = ports.objects.iter_objects([keys[0], "parts/missing", keys[1]])
    assert b"".join(next(parts)) == b"part 0\n"
    with pytest.raises(Exception, match="NoSuchKey"):
        next(parts)
    # Left half read: closing it ends its reads ahead (no thread of it left behind).
    parts = ports.objects.iter_objects(keys)
    next(next(parts))
    parts.close()
    assert not [t for t in threading.enumerate() if t.name.startswith("s3-read-ahead")]


def test_queue_receipts(ports: Stores, queue_url: str):
    queue = ports.queues.queue(queue_url)
    queue.send([f"m{i}" for i in range(12)])
    got = []
    while batch := queue.receive(10, 0, 60):
        got.extend(batch)
    assert sorted(r.body for r in got) == sorted(f"m{i}" for i in range(12))
    assert all(r.receive_count == 1 for r in got)
    first = got[0]
    assert queue.extend(first.receipt, 60)
    assert queue.release(first.receipt)
    again = queue.receive(10, 0, 60)
    assert [r.body for r in again] == [first.body] and again[0].receive_count == 2
    for r in [*got[1:], *again]:
        queue.delete(r.receipt)
    assert queue.receive(10, 0, 60) == []


def test_a_conflict_the_store_gives_up_on_is_typed_and_counts_nothing(ports: Stores, request: pytest.FixtureRequest):
    """Counting on a busy batch: a transaction conflict the store could not retry away surfaces as
    ``TransactionConflict`` (a ``Throttled``), with nothing counted; the next try counts once."""
    from functions.core.errors import Throttled, TransactionConflict
    from tests.fakes.aws import conflict

    if isinstance(ports, type(fake_stores())):
        ports.faults.fail("batches.count_chunk", conflict())
    else:
        from tests.integration.test_aws_faults import conflicted_transaction, faulty_stores

        faulty = faulty_stores(ports, request.getfixturevalue("deployed"), attempts=2)
        faulty.faults.fail("TransactWriteItems", conflicted_transaction(), times=2)
        ports = faulty.stores
    ports.batches.create(new_batch())
    with pytest.raises(TransactionConflict) as raised:
        ports.batches.count_chunk(marker(0))
    assert isinstance(raised.value, Throttled)
    assert ports.batches.get("acme", "batch_c1").chunks_done == 0
    assert ports.batches.counted_chunk("acme", "batch_c1", 0) is None
    assert ports.batches.count_chunk(marker(0))
    assert not ports.batches.count_chunk(marker(0))
    assert ports.batches.get("acme", "batch_c1").chunks_done == 1


def test_a_chunk_run_record_is_written_optimistically(ports: Stores):
    from functions.core.records import ChunkRunRecord

    assert ports.batches.chunk_run("acme", "batch_c1", 3) is None
    first = ChunkRunRecord(tenant="acme", batch_id="batch_c1", chunk=3, version=1, open=["a1"], expires_at=10**10)
    ports.batches.save_chunk_run(first)
    with pytest.raises(ConditionFailed):  # a second "first" write loses
        ports.batches.save_chunk_run(first.model_copy(update={"open": ["b1"]}))
    second = first.model_copy(
        update={
            "version": 2,
            "open": [],
            "failures": 1,
            "segments": [[0, 25], [25, 50]],
            "in_flight": 50,
            "in_flight_end": 58,
            "in_flight_by": "a1",
            "blamed": [7],
            "suspects": [3, 4],
        }
    )
    ports.batches.save_chunk_run(second)
    assert ports.batches.chunk_run("acme", "batch_c1", 3) == second
    with pytest.raises(ConditionFailed):  # written over a stale version
        ports.batches.save_chunk_run(second.model_copy(update={"failures": 9}))
    cleared = second.model_copy(update={"version": 3, "in_flight": None, "in_flight_end": None, "in_flight_by": None})
    ports.batches.save_chunk_run(cleared)
    stored = ports.batches.chunk_run("acme", "batch_c1", 3)
    assert stored == cleared and stored.written() == 50 and stored.in_flight is None
    # Written over the record as read (what the workers do): the same records stored.
    fourth = cleared.model_copy(
        update={
            "version": 4,
            "outcomes": {"0-25": "1" * 25},
            "in_flight": 60,
            "in_flight_end": 61,
            "in_flight_by": "b2",
            "spent_output_tokens": 9,
        }
    )
    ports.batches.save_chunk_run(fourth, over=cleared)
    assert ports.batches.chunk_run("acme", "batch_c1", 3) == fourth
    fifth = fourth.model_copy(update={"version": 5, "in_flight": None, "in_flight_end": None, "open": ["c3"]})
    ports.batches.save_chunk_run(fifth, over=fourth)
    assert ports.batches.chunk_run("acme", "batch_c1", 3) == fifth
    with pytest.raises(ConditionFailed):  # over a stale version
        ports.batches.save_chunk_run(fifth.model_copy(update={"failures": 9}), over=fourth)
    assert ports.batches.chunk_run("globex", "batch_c1", 3) is None  # keyed by tenant
    assert ports.batches.counted_chunk("acme", "batch_c1", 3) is None  # beside the marker, not one


def test_open_batches_lists_exactly_the_batches_not_terminal(ports: Stores):
    """The sweeper's index: a batch is listed from its creation until the write that makes it
    terminal, whether a lone write (ingest, cancel, fail) or one with its files (finalize)."""
    ports.batches.create(new_batch(id="batch_v", status="validating", expires_at=300))
    ports.batches.create(new_batch(id="batch_r", expires_at=100))
    ports.batches.create(new_batch(id="batch_f", accepting=False))
    ports.batches.create(new_batch(tenant="globex", id="batch_g", status="cancelling", expires_at=250))
    ports.batches.create(new_batch(id="batch_done", status="completed"))  # created terminal: never listed
    # oldest expiry first: 100, 200, 250, 300
    assert ports.batches.open_batches() == [
        ("acme", "batch_r"),
        ("acme", "batch_f"),
        ("globex", "batch_g"),
        ("acme", "batch_v"),
    ]
    ports.batches.transition("acme", "batch_r", Change(values={"accepting": False}))  # not terminal: still listed
    ports.batches.transition("acme", "batch_v", lifecycle.refuse(1, []))
    ports.batches.transition(
        "acme", "batch_f", lifecycle.finish(2, status="completed", closed_from="in_progress", values={})
    )
    assert ports.batches.open_batches() == [("acme", "batch_r"), ("globex", "batch_g")]
    ports.batches.transition("globex", "batch_g", lifecycle.fail_without_files(3, []))
    assert ports.batches.open_batches() == [("acme", "batch_r")]
    # a terminal batch read back carries none of the index's attributes as fields
    assert ports.batches.get("acme", "batch_v").status == "failed"


def test_a_file_settles_once_from_uploaded(ports: Stores):
    """An assembled Upload's File moves from ``uploaded`` to processed/error exactly once; a File
    already processed (or gone) is never moved again (a redelivered assembly changes nothing)."""
    pending = FileRecord(
        tenant="acme",
        id="file-up",
        filename="u.jsonl",
        purpose="batch",
        bytes=3,
        created_at=1,
        s3_key="files/acme/upload_1",
        status="uploaded",
    )
    ports.files.create(pending)
    assert ports.files.get("acme", "file-up", now=2).to_wire().status == "uploaded"
    settled = ports.files.settle("acme", "file-up", "error", "md5 mismatch")
    assert settled is not None and (settled.status, settled.status_details) == ("error", "md5 mismatch")
    assert ports.files.settle("acme", "file-up", "processed") is None
    stored = ports.files.get("acme", "file-up", now=2)
    assert (stored.status, stored.status_details) == ("error", "md5 mismatch")
    done = pending.model_copy(update={"id": "file-done", "status": "processed"})
    ports.files.create(done)
    assert ports.files.settle("acme", "file-done", "error", "late") is None
    assert ports.files.get("acme", "file-done", now=2).status == "processed"
    assert ports.files.settle("acme", "file-missing", "processed") is None


def test_tenant_policies_and_the_creation_counter(ports: Stores):
    from functions.core.tenants import TenantPolicy

    assert ports.tenants.get("acme") is None and ports.tenants.list() == []
    policy = TenantPolicy(tenant="acme", allowed_models=["m"], batches_per_hour=2, max_enqueued_tokens={"m": 9})
    ports.tenants.put(policy)
    ports.tenants.put(TenantPolicy(tenant="Globex"))
    assert ports.tenants.get("acme") == policy
    ports.tenants.put(policy.model_copy(update={"batches_per_hour": 5}))  # replaced, not merged
    assert ports.tenants.get("acme").batches_per_hour == 5
    assert [p.tenant for p in ports.tenants.list()] == ["Globex", "acme"]
    # the counter stops at the limit, per tenant and per window
    assert [ports.tenants.count_creation("acme", 3600, limit=2, expires_at=10**10) for _ in range(3)] == [
        True,
        True,
        False,
    ]
    assert ports.tenants.count_creation("acme", 7200, limit=2, expires_at=10**10)
    assert ports.tenants.count_creation("Globex", 3600, limit=1, expires_at=10**10)
    assert not ports.tenants.count_creation("Globex", 3600, limit=1, expires_at=10**10)
    assert not ports.tenants.count_creation("Initech", 3600, limit=0, expires_at=10**10)  # zero: none at all


def test_a_retrieve_reads_the_run_records_of_uncounted_chunks_only(stores: Stores, monkeypatch):
    from functions.core.aws.dynamodb import Table
    from functions.core.records import ChunkRunRecord

    batch = new_batch(chunk_count=250)
    stores.batches.create(batch)
    for chunk in (3, 120, 249):  # run records past the first 100 keys of a BatchGetItem
        segment = {"version": 1, "segments": [[0, 2]], "outcomes": {"0-2": "10"}}
        stores.batches.save_chunk_run(
            ChunkRunRecord(tenant="acme", batch_id="batch_c1", chunk=chunk, expires_at=10**10, **segment)
        )
    assert stores.batches.count_chunk(marker(3)) and stores.batches.count_chunk(marker(7))
    read: list[tuple[str, str]] = []
    batch_get = Table.batch_get
    monkeypatch.setattr(Table, "batch_get", lambda self, keys: read.extend(keys) or batch_get(self, keys))
    progress = stores.batches.chunk_progress(stores.batches.get("acme", "batch_c1"))
    assert progress.counted == (4, 2) and progress.checkpointed == {120: (1, 1), 249: (1, 1)}
    assert sorted(read) == sorted(
        (k[schema.PK], k[schema.SK])
        for c in range(250)
        if c not in (3, 7)
        for k in [ChunkRunRecord(tenant="acme", batch_id="batch_c1", chunk=c, expires_at=0).keys()]
    )


def test_a_retrieve_tells_chunks_counted_without_the_set_by_their_markers(stores: Stores, aws):
    """A batch counted on by a version that kept no ``counted_chunks`` set (in flight across an
    upgrade): its counted chunk's checkpoints are not added to its counters a second time."""
    import boto3

    from functions.core.records import ChunkRunRecord

    stores.batches.create(new_batch(chunk_count=3))
    for chunk in (0, 2):
        segment = {"version": 1, "segments": [[0, 2]], "outcomes": {"0-2": "10"}}
        stores.batches.save_chunk_run(
            ChunkRunRecord(tenant="acme", batch_id="batch_c1", chunk=chunk, expires_at=10**10, **segment)
        )
    assert stores.batches.count_chunk(marker(0))
    key = {k: v for k, v in new_batch().keys().items() if k in (schema.PK, schema.SK)}
    boto3.resource("dynamodb").Table(aws.table_name).update_item(Key=key, UpdateExpression="REMOVE counted_chunks")
    batch = stores.batches.get("acme", "batch_c1")
    assert batch.counted_chunks is None and batch.unlisted_chunks()
    progress = stores.batches.chunk_progress(batch)
    assert progress.counted == (2, 1) and progress.checkpointed == {2: (1, 1)}
    assert progress.lines() == (3, 2)
