"""The state repositories (ports ``FileStore``, ``UploadStore``, ``KeyStore``, ``BatchStore``) on
one DynamoDB table: every key built by ``schema`` and the records, every read keyed by tenant."""

from __future__ import annotations

import builtins
from collections.abc import Iterable, Sequence
from typing import Any

from boto3.dynamodb.conditions import Attr

from .. import lifecycle, schema
from ..budgets import BUDGET_KINDS, Spent
from ..errors import ChunksStopped, ConditionFailed
from ..lifecycle import Change
from ..records import (
    ApiKeyRecord,
    BatchRecord,
    ChunkProgress,
    ChunkRecord,
    ChunkRunRecord,
    Counted,
    CountShardRecord,
    FileRecord,
    UploadPartRecord,
    UploadRecord,
    chunks_pk,
    shard_pk,
)
from ..tenants import Release, Reservation
from . import stored
from .dynamodb import Check, Delete, Put, Table, Update, _render

#: The file and upload attribute that says its bytes are on the tenant's stored-bytes ledger.
HOLDS_STORAGE = "holds_storage"


def _create_holding(table: Table, track: bool, record: FileRecord | UploadRecord, max_stored_bytes: int | None) -> None:
    """Put a new file or upload record (only if its id is free); with ``track``, with its bytes
    reserved on the tenant's stored-bytes ledger in the same transaction (``stored.hold``)."""
    if not track:
        table.put(record.to_item(), if_absent=True)
        return
    table.transact(
        [
            Put({**record.to_item(), HOLDS_STORAGE: True}, if_absent=True),
            *stored.hold(record.tenant, record.sort_key(record.id), record.bytes, max_stored_bytes),
        ]
    )


class FileRepo:
    """``track_storage``: count each new file's bytes on its tenant's stored-bytes ledger
    (``stored``; on when governance is)."""

    def __init__(self, table: Table, *, track_storage: bool = False):
        self._table = table
        self._track = track_storage

    def create(self, record: FileRecord, *, max_stored_bytes: int | None = None) -> None:
        _create_holding(self._table, self._track, record, max_stored_bytes)

    def get(self, tenant: str, file_id: str, now: int) -> FileRecord | None:
        item = self._table.get(schema.tenant_pk(tenant), FileRecord.sort_key(file_id))
        if item is None:
            return None
        record = FileRecord.from_item(item)
        return None if record.expired(now) else record

    def delete(self, tenant: str, file_id: str) -> FileRecord | None:
        old = self._table.delete(schema.tenant_pk(tenant), FileRecord.sort_key(file_id))
        return FileRecord.from_item(old) if old else None

    def list(
        self, tenant: str, *, purpose: str | None, after: str | None, ascending: bool, limit: int, now: int
    ) -> tuple[list[FileRecord], bool]:
        def alive(item: dict[str, Any]) -> bool:
            return not (schema.TTL in item and int(item[schema.TTL]) <= now)

        if purpose is None:
            items, more = self._table.query_page(
                pk=schema.tenant_pk(tenant),
                prefix=FileRecord.sort_key(""),
                after=after,
                ascending=ascending,
                limit=limit,
                keep=alive,
            )
        else:
            items, more = self._table.query_page(
                pk=FileRecord.purpose_pk(tenant, purpose),
                prefix="",
                after=after,
                ascending=ascending,
                limit=limit,
                keep=alive,
                index=schema.GSI_PURPOSE,
            )
        return [FileRecord.from_item(i) for i in items], more

    def settle(self, tenant: str, file_id: str, status: str, details: str | None = None) -> FileRecord | None:
        values: dict[str, Any] = {"status": status, **({"status_details": details} if details else {})}
        try:
            item = self._table.set_if(
                schema.tenant_pk(tenant), FileRecord.sort_key(file_id), values, expect={"status": "uploaded"}
            )
        except ConditionFailed:
            return None
        return FileRecord.from_item(item)


class UploadRepo:
    """``track_storage``: reserve each new upload's declared bytes on its tenant's stored-bytes
    ledger (``FileRepo``)."""

    def __init__(self, table: Table, *, track_storage: bool = False):
        self._table = table
        self._track = track_storage

    def create(self, record: UploadRecord, *, max_stored_bytes: int | None = None) -> None:
        _create_holding(self._table, self._track, record, max_stored_bytes)

    def get(self, tenant: str, upload_id: str) -> UploadRecord | None:
        item = self._table.get(schema.tenant_pk(tenant), UploadRecord.sort_key(upload_id))
        return UploadRecord.from_item(item) if item else None

    def transition(self, record: UploadRecord, status: str, **values: Any) -> UploadRecord:
        """Move a pending upload to ``status``; ConditionFailed if it is no longer pending."""
        item = self._table.set_if(
            schema.tenant_pk(record.tenant),
            UploadRecord.sort_key(record.id),
            {"status": status, **values},
            expect={"status": "pending"},
        )
        return UploadRecord.from_item(item)

    def complete(self, record: UploadRecord, file: FileRecord) -> None:
        """Atomically create the File and mark the pending upload completed with its id (an upload
        holding stored bytes hands them to the File: its marker becomes the File's)."""
        if not record.holds_storage:
            self._table.transact(
                [
                    Put(file.to_item(), if_absent=True),
                    Update(
                        schema.tenant_pk(record.tenant),
                        UploadRecord.sort_key(record.id),
                        values={"status": "completed", "file_id": file.id},
                        expect={"status": "pending"},
                    ),
                ]
            )
            return
        tenant, upload_sk, file_sk = record.tenant, UploadRecord.sort_key(record.id), FileRecord.sort_key(file.id)
        self._table.transact(
            [
                Put({**file.to_item(), HOLDS_STORAGE: True}, if_absent=True),
                Update(
                    schema.tenant_pk(tenant),
                    upload_sk,
                    values={"status": "completed", "file_id": file.id},
                    remove=(HOLDS_STORAGE,),
                    expect={"status": "pending", HOLDS_STORAGE: True},
                ),
                Delete(
                    schema.stored_pk(tenant), schema.stored_marker_sk(upload_sk), condition=Attr(schema.PK).exists()
                ),
                Put(stored.marker(tenant, file_sk, file.bytes), if_absent=True),
            ]
        )

    def add_part(self, part: UploadPartRecord) -> None:
        self._table.put(part.to_item(), if_absent=True)

    def parts(self, tenant: str, upload_id: str, part_ids: list[str]) -> dict[str, UploadPartRecord]:
        items = self._table.batch_get(
            [(schema.tenant_pk(tenant), UploadPartRecord.sort_key(upload_id, p)) for p in part_ids]
        )
        return {(r := UploadPartRecord.from_item(i)).id: r for i in items}


class KeyRepo:
    """A key is three items written and deleted together: the key item (``schema.key_pk``, what
    the authorizer reads), its listing in the tenant's key partition and its id's lookup item."""

    def __init__(self, table: Table):
        self._table = table

    def create(self, record: ApiKeyRecord) -> None:
        self._table.transact(
            [
                Put(record.to_item(), if_absent=True),
                Put(record.listing_item(), if_absent=True),
                Put(record.id_item(), if_absent=True),
                # Serialized with ``tenants disable``, which writes the policy before it lists the keys
                # to mark: a key created after that write is refused, one created before is listed.
                Check(
                    schema.TENANTS_PK,
                    schema.tenant_policy_sk(record.tenant),
                    Attr("disabled").not_exists() | Attr("disabled").ne(True),
                ),
            ]
        )

    def get(self, key_hash: str) -> ApiKeyRecord | None:
        item = self._table.get(schema.key_pk(key_hash), "KEY")
        return ApiKeyRecord.from_item(item) if item else None

    def get_by_id(self, key_id: str) -> ApiKeyRecord | None:
        item = self._table.get(schema.key_id_pk(key_id), "KEYID")
        return self.get(item["key_hash"]) if item else None

    def list(self, tenant: str) -> list[ApiKeyRecord]:
        items, _ = self._table.query_page(
            pk=schema.tenant_keys_pk(tenant),
            prefix=ApiKeyRecord.listing_sort_key(""),
            after=None,
            ascending=True,
            limit=10**9,
        )
        return [ApiKeyRecord.from_item(i) for i in items]

    def delete(self, key_hash: str) -> ApiKeyRecord | None:
        record = self.get(key_hash)
        if record is None:
            return None
        ops: list[Any] = [Delete(schema.key_pk(key_hash), "KEY", condition=Attr(schema.PK).exists())]
        # Its listing and id items go with it if they are this key's: a key stored before ids
        # existed has none (``batchctl keys backfill`` adds them), and another key may hold its id.
        for pk, sk in (
            (schema.tenant_keys_pk(record.tenant), ApiKeyRecord.listing_sort_key(record.id)),
            (schema.key_id_pk(record.id), "KEYID"),
        ):
            if (self._table.get(pk, sk) or {}).get("key_hash") == key_hash:
                ops.append(Delete(pk, sk, condition=Attr("key_hash").eq(key_hash)))
        try:
            self._table.transact(ops)
        except ConditionFailed:  # revoked concurrently
            return None
        return record

    def set_disabled(self, record: ApiKeyRecord, disabled: bool) -> bool:
        values, remove = ({"disabled": True}, ()) if disabled else ({}, ("disabled",))
        try:
            self._table.transact(
                [
                    Update(schema.key_pk(record.key_hash), "KEY", values=values, remove=remove),
                    Update(
                        schema.tenant_keys_pk(record.tenant),
                        ApiKeyRecord.listing_sort_key(record.id),
                        values=values,
                        remove=remove,
                    ),
                ]
            )
        except ConditionFailed:  # revoked meanwhile
            return False
        return True

    def all_keys(self) -> builtins.list[ApiKeyRecord]:
        return [ApiKeyRecord.from_item(i) for i in self._table.scan_prefix(schema.key_pk("")) if i[schema.SK] == "KEY"]

    def add_listing(self, record: ApiKeyRecord) -> bool:
        try:
            self._table.transact([Put(record.listing_item(), if_absent=True), Put(record.id_item(), if_absent=True)])
        except ConditionFailed:
            return False
        return True


def _markers_and_runs(
    items: Iterable[dict[str, Any]],
) -> tuple[dict[int, ChunkRecord], dict[int, ChunkRunRecord]]:
    """Chunk items by chunk: its count marker and its run record (other items are skipped)."""
    markers: dict[int, ChunkRecord] = {}
    runs: dict[int, ChunkRunRecord] = {}
    for item in items:
        if item[schema.SK].startswith(ChunkRecord.PREFIX):
            marker = ChunkRecord.from_item(item)
            markers[marker.chunk] = marker
        elif item[schema.SK].startswith(ChunkRunRecord.PREFIX):
            run = ChunkRunRecord.from_item(item)
            runs[run.chunk] = run
    return markers, runs


class BatchRepo:
    """``track_storage``: the output and error files ``finish`` creates are counted on the
    tenant's stored-bytes ledger, never refused (a batch always ends)."""

    def __init__(self, table: Table, *, track_storage: bool = False):
        self._table = table
        self._track = track_storage

    def create(self, record: BatchRecord) -> None:
        self._table.put(record.to_item(), if_absent=True)

    def get(self, tenant: str, batch_id: str) -> BatchRecord | None:
        item = self._table.get(schema.batches_pk(tenant), BatchRecord.sort_key(batch_id))
        return BatchRecord.from_item(item) if item else None

    def list(self, tenant: str, *, after: str | None, limit: int) -> tuple[list[BatchRecord], bool]:
        items, more = self._table.query_page(
            pk=schema.batches_pk(tenant), prefix=BatchRecord.sort_key(""), after=after, ascending=False, limit=limit
        )
        return [BatchRecord.from_item(i) for i in items], more

    def transition(
        self, tenant: str, batch_id: str, change: Change, *, files: Sequence[FileRecord] = ()
    ) -> BatchRecord:
        """Apply a lifecycle change (``functions.core.lifecycle``): the batch's conditional update,
        its counter change and ``files`` in one transaction (a lone update when there is nothing
        else); the terminal write's reservation release is ``lifecycle.settle``'s."""
        pk, sk = schema.batches_pk(tenant), BatchRecord.sort_key(batch_id)

        def write(c: Change) -> dict[str, Any] | None:
            if isinstance(c.counter, Reservation) and not c.counter.fits_alone():
                raise ConditionFailed("the batch alone exceeds the enqueued cap")
            update = Update(
                pk,
                sk,
                values=dict(c.values),
                defaults=dict(c.defaults),
                add=dict(c.add),
                remove=c.remove,
                expect=dict(c.expect),
            )
            others = self._file_ops(tenant, files)
            if c.counter is not None:
                others.append(_Counter(c.counter))
            if not others:
                return self._table.update(update)
            self._table.transact([*others, update])
            return None

        item = lifecycle.settle(change, write, lambda: self.get(tenant, batch_id)) or self._table.get(pk, sk)
        assert item is not None
        return BatchRecord.from_item(item)

    def budget_used(self, tenant: str, period_sk: str) -> Spent:
        item = self._table.get(schema.budget_pk(tenant), period_sk) or {}
        return Spent(**{kind: int(item.get(kind, 0)) for kind in BUDGET_KINDS})

    def enqueued(self, tenant: str, model: str) -> tuple[int, int]:
        item = self._table.get(schema.enqueued_pk(tenant), schema.enqueued_sk(model)) or {}
        return int(item.get("requests", 0)), int(item.get("tokens", 0))

    def count_chunk(self, marker: ChunkRecord) -> bool:
        """Count a finished chunk exactly once: its marker and the batch counters in one
        transaction, only while the batch accepts chunks. False for a duplicate or late chunk.
        Every worker counts on the batch's item: a transaction conflict there is retried by the
        ``Table`` (docs/reliability.md), so the chunk is not run again for it. The tenant's budget
        is charged from the marker by the audit appender, with the chunk's receipt
        (``AuditStore.put``): the counting roles hold no write on budget items."""
        if marker.count_shards > 1:  # on the chunk's shard, in the marker's own partition
            counters = Update(
                shard_pk(marker.tenant, marker.batch_id, marker.chunk, marker.count_shards),
                CountShardRecord.SORT_KEY,
                add=marker.batch_counters(),
                expect={"accepting": True},
            )
        else:
            counters = Update(
                schema.batches_pk(marker.tenant),
                BatchRecord.sort_key(marker.batch_id),
                add=marker.batch_counters(),
                expect={"accepting": True},
            )
        try:
            self._table.transact([Put(marker.to_item(), if_absent=True), counters])
        except ConditionFailed:
            return False
        return True

    def open_shards(self, shards: Sequence[CountShardRecord]) -> None:
        """Write a batch's counting shards, each only if absent (ingest again after a crash
        leaves the counted ones as they are): one PutItem a shard."""
        for shard in shards:
            try:
                self._table.put(shard.to_item(), if_absent=True)
            except ConditionFailed:
                pass

    def count_shard(self, tenant: str, batch_id: str, shard: int) -> CountShardRecord | None:
        """One counting shard as stored: one GetItem."""
        item = self._table.get(chunks_pk(tenant, batch_id, shard), CountShardRecord.SORT_KEY)
        return CountShardRecord.from_item(item) if item else None

    def count_shards(self, batch: BatchRecord) -> builtins.list[CountShardRecord]:
        """Every counting shard of the batch (none when it counts on its own item): one
        BatchGetItem (at most 64 keys)."""
        shards = [CountShardRecord.from_item(i) for i in self._table.batch_get(batch.shard_keys())]
        return sorted(shards, key=lambda s: s.shard)

    def fold_shard(self, shard: CountShardRecord) -> bool:
        """Add a fully counted shard's counters (as ``shard`` read them, and still stored) to its
        batch's, once, only while the batch accepts chunks: one transaction. False if it was folded
        already, not fully counted, or the batch closed."""
        if not shard.all_counted:
            return False
        try:
            self._table.transact(
                [
                    Update(
                        chunks_pk(shard.tenant, shard.batch_id, shard.shard),
                        CountShardRecord.SORT_KEY,
                        values={"folded": True},
                        expect={"folded": None, "chunks_done": shard.chunks_done},
                    ),
                    Update(
                        schema.batches_pk(shard.tenant),
                        BatchRecord.sort_key(shard.batch_id),
                        add=shard.counters(),
                        expect={"accepting": True},
                    ),
                ]
            )
        except ConditionFailed:
            return False
        return True

    def close_shards(self, batch: BatchRecord, *, accepting: bool) -> None:
        """Stop the batch's shards starting chunks (and, with ``accepting`` False, counting them):
        after the batch's own write, one UpdateItem a shard; doing it again changes nothing."""
        values = {"starting": False} if accepting else {"starting": False, "accepting": False}
        for pk, sk in batch.shard_keys():
            try:
                self._table.update(Update(pk, sk, values=values))
            except ConditionFailed:
                pass  # never opened: the batch was cancelled before its work was sent

    def counted_chunk(self, tenant: str, batch_id: str, chunk: int, shards: int = 1) -> ChunkRecord | None:
        """The count marker of one chunk (None while it is not counted): one GetItem."""
        item = self._table.get(shard_pk(tenant, batch_id, chunk, shards), ChunkRecord.sort_key(chunk))
        return ChunkRecord.from_item(item) if item else None

    def count_markers(self, chunks: Sequence[tuple[str, str, int, int]]) -> dict[tuple[str, str, int], ChunkRecord]:
        keys = [(shard_pk(t, b, c, n), ChunkRecord.sort_key(c)) for t, b, c, n in chunks]
        markers = [ChunkRecord.from_item(i) for i in self._table.batch_get(keys)]
        return {(m.tenant, m.batch_id, m.chunk): m for m in markers}

    def chunk_state(
        self, tenant: str, batch_id: str, chunk: int, shards: int = 1
    ) -> tuple[ChunkRecord | None, ChunkRunRecord | None]:
        pk = shard_pk(tenant, batch_id, chunk, shards)
        markers, runs = _markers_and_runs(
            self._table.batch_get([(pk, ChunkRecord.sort_key(chunk)), (pk, ChunkRunRecord.sort_key(chunk))])
        )
        return markers.get(chunk), runs.get(chunk)

    def _chunk_items(self, tenant: str, batch_id: str, shards: int, prefix: str) -> builtins.list[dict[str, Any]]:
        """The items of the batch's chunk partitions under ``prefix``: one consistent Query a
        shard (paged by DynamoDB past 1 MB)."""
        items: builtins.list[dict[str, Any]] = []
        for shard in range(shards):
            page, _ = self._table.query_page(
                pk=chunks_pk(tenant, batch_id, shard),
                prefix=prefix,
                after=None,
                ascending=True,
                limit=10**9,
            )
            items += page
        return items

    def chunk_progress(self, batch: BatchRecord) -> ChunkProgress:
        """The lines of the counted chunks, from the counters they were counted on (``batch``'s
        own, or its shards' in one BatchGetItem), then the checkpointed lines of the other chunks
        from their run records (one BatchGetItem per 100 of them): what a retrieve of an open batch
        reads, in proportion to the chunks not counted yet, never to the batch. An item counted on
        without the set (``Counted.unlisted_chunks``) has those chunks' markers read too, and a
        chunk with a marker is counted already."""
        counters: Sequence[Counted] = self.count_shards(batch) if batch.count_shards > 1 else [batch]
        counted = set().union(*(c.counted_chunks or () for c in counters))
        others = [chunk for chunk in range(batch.chunk_count) if chunk not in counted]
        sort_keys = [ChunkRunRecord.sort_key]
        if any(c.unlisted_chunks() for c in counters):
            sort_keys.append(ChunkRecord.sort_key)
        keys = [
            (shard_pk(batch.tenant, batch.id, chunk, batch.count_shards), sort_key(chunk))
            for chunk in others
            for sort_key in sort_keys
        ]
        markers, runs = _markers_and_runs(self._table.batch_get(keys) if keys else [])
        return ChunkProgress(
            counted=(sum(c.completed for c in counters), sum(c.failed for c in counters)),
            checkpointed={chunk: run.checkpointed() for chunk, run in runs.items() if chunk not in markers},
        )

    def counted_chunks(self, tenant: str, batch_id: str, shards: int = 1) -> dict[int, ChunkRecord]:
        items = self._chunk_items(tenant, batch_id, shards, ChunkRecord.PREFIX)
        return {(r := ChunkRecord.from_item(i)).chunk: r for i in items}

    def chunk_states(
        self, tenant: str, batch_id: str, shards: int = 1
    ) -> tuple[dict[int, ChunkRecord], dict[int, ChunkRunRecord]]:
        """Markers and run records of the batch: one consistent Query of each of its chunk
        partitions."""
        return _markers_and_runs(self._chunk_items(tenant, batch_id, shards, ""))

    def chunk_run(self, tenant: str, batch_id: str, chunk: int, shards: int = 1) -> ChunkRunRecord | None:
        """The run record of one chunk: one GetItem (its own item, not the batch's)."""
        item = self._table.get(shard_pk(tenant, batch_id, chunk, shards), ChunkRunRecord.sort_key(chunk))
        return ChunkRunRecord.from_item(item) if item else None

    def save_chunk_run(
        self, record: ChunkRunRecord, *, starting: bool = False, over: ChunkRunRecord | None = None
    ) -> None:
        """An optimistic write: only over ``record.version - 1`` (or no item, for version 1).
        ``over``: the record as read at that version; only the attributes that differ from it are
        written (the condition on the version makes the stored item that record).
        ``starting``: only while the chunk's batch takes new chunks (``BatchRecord.takes_chunks``,
        or its counting shard's ``starting``), checked in the same transaction; ChunksStopped if
        it does not."""
        item = record.to_item()
        keys = record.keys()
        write: Put | Update
        if record.version <= 1:
            write = Put(item, if_absent=True)
        else:
            before: dict[str, Any] = {}
            if over is not None:
                assert over.version == record.version - 1, "a run record is written over the version it was read at"
                before = over.to_item()
            values = {k: v for k, v in item.items() if k not in (schema.PK, schema.SK) and before.get(k) != v}
            absent = tuple(k for k, v in record.model_dump().items() if v is None and (over is None or k in before))
            write = Update(
                keys[schema.PK], keys[schema.SK], values=values, remove=absent, expect={"version": record.version - 1}
            )
        if not starting:
            if isinstance(write, Put):
                self._table.put(item, if_absent=True)
            else:
                self._table.update(write)
            return
        if record.count_shards > 1:
            pk = shard_pk(record.tenant, record.batch_id, record.chunk, record.count_shards)
            check = Check(pk, CountShardRecord.SORT_KEY, Attr("starting").eq(True))
        else:
            check = Check(
                schema.batches_pk(record.tenant),
                BatchRecord.sort_key(record.batch_id),
                Attr("status").eq(lifecycle.TAKES_CHUNKS) & Attr("accepting").eq(True),
            )
        try:
            self._table.transact([check, write])
        except ConditionFailed as exc:
            if 0 in exc.items:
                raise ChunksStopped("the batch takes no new chunks") from exc
            raise

    def _file_ops(self, tenant: str, files: Sequence[FileRecord]) -> builtins.list[Any]:
        """The puts of a finished batch's files, and (keeping the ledger) their bytes added to the
        tenant's stored bytes without a condition: a batch always ends."""
        if not self._track:
            return [Put(f.to_item()) for f in files]
        return [
            *(Put({**f.to_item(), HOLDS_STORAGE: True}) for f in files),
            *stored.charge(tenant, [(FileRecord.sort_key(f.id), f.bytes) for f in files]),
        ]

    def open_batches(self) -> builtins.list[tuple[str, str]]:
        """(tenant, batch_id) of every open (non-terminal) batch: one Query of the sparse
        ``schema.GSI_OPEN`` (paginated), oldest expiry first. The index is eventually consistent:
        a batch made terminal a moment ago may still be listed (read it by key)."""
        items = self._table.query_index(schema.GSI_OPEN, schema.GSI_OPEN_PK, schema.OPEN_PARTITION)
        return [
            (schema.tenant_of_batches_pk(item[schema.PK]), item[schema.SK].removeprefix(BatchRecord.sort_key("")))
            for item in items
        ]


class _Counter:
    """A transactional ADD to a (tenant, model) enqueued-cap counter (created by the first one): a
    ``Reservation`` only while every capped dimension stays within its cap after the addition
    (``Reservation.bounds``), a ``Release`` unconditionally."""

    def __init__(self, counter: Reservation | Release):
        self.counter = counter

    def render(self, table: str) -> dict[str, Any]:
        c = self.counter
        sign = 1 if isinstance(c, Reservation) else -1
        names: dict[str, str] = {"#q": "requests", "#t": "tokens"}
        values: dict[str, Any] = {":q": sign * c.requests, ":t": sign * c.tokens}
        request: dict[str, Any] = {
            "TableName": table,
            "Key": {schema.PK: schema.enqueued_pk(c.tenant), schema.SK: schema.enqueued_sk(c.model)},
            "UpdateExpression": "ADD #q :q, #t :t",
            "ExpressionAttributeNames": names,
            "ExpressionAttributeValues": values,
        }
        if isinstance(c, Reservation) and (bounds := c.bounds()):
            condition = None
            for attribute, cap, n in bounds:
                part = Attr(attribute).not_exists() | Attr(attribute).lte(cap - n)
                condition = part if condition is None else condition & part
            request["ConditionExpression"] = _render(condition, names, values)
        return {"Update": request}
