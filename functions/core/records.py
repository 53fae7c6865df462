"""Storage records: what DynamoDB holds. Separate from the wire models on purpose (they carry keys,
S3 locations and bookkeeping the API never shows)."""

import re
from typing import Any, ClassVar, Literal, Self

from pydantic import BaseModel, ConfigDict, field_validator

from . import limits, schema
from .budgets import BudgetCaps, Charge, budget_sk
from .messages import Chunk, WorkMessage
from .wire import (
    TERMINAL_STATUSES,
    Batch,
    BatchError,
    BatchErrors,
    BatchRequestCounts,
    BatchStatus,
    BatchUsage,
    FileObject,
    FilePurpose,
    InputTokensDetails,
    OutputTokensDetails,
    Upload,
    UploadPart,
)
from .work import Spend

TENANT_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")


def check_tenant(tenant: str) -> str:
    if not TENANT_PATTERN.fullmatch(tenant):
        raise ValueError(f"invalid tenant name {tenant!r}: 1-64 of [A-Za-z0-9_.-], starting alphanumeric")
    return tenant


class Record(BaseModel):
    """A DynamoDB item. Subclasses say how their keys are built; ``ttl`` is derived from
    ``expiry()`` so that DynamoDB's TTL removes the item."""

    model_config = ConfigDict(extra="ignore")
    _KEY_FIELDS: ClassVar[tuple[str, ...]] = (
        schema.PK,
        schema.SK,
        schema.GSI_PURPOSE_PK,
        schema.GSI_PURPOSE_SK,
        schema.GSI_OPEN_PK,
        schema.GSI_OPEN_SK,
        schema.TTL,
    )

    def keys(self) -> dict[str, str]:
        raise NotImplementedError

    def expiry(self) -> int | None:
        return None

    def to_item(self) -> dict[str, Any]:
        item = {k: v for k, v in self.model_dump().items() if v is not None}
        item.update(self.keys())
        if (ttl := self.expiry()) is not None:
            item[schema.TTL] = ttl
        return item

    @classmethod
    def from_item(cls, item: dict[str, Any]) -> Self:
        return cls.model_validate({k: v for k, v in item.items() if k not in cls._KEY_FIELDS})

    def expired(self, now: int) -> bool:
        ttl = self.expiry()
        return ttl is not None and ttl <= now


class FileRecord(Record):
    tenant: str
    id: str
    filename: str
    purpose: FilePurpose
    bytes: int
    created_at: int
    expires_at: int | None = None
    s3_key: str
    #: OpenAI's File status: ``uploaded`` while an Upload's parts are still being assembled into
    #: ``s3_key`` (docs/uploads.md), ``processed`` once the bytes are there, ``error`` if assembly
    #: failed (``status_details`` says why, e.g. an md5 mismatch).
    status: Literal["uploaded", "processed", "error"] = "processed"
    status_details: str | None = None
    #: True when ``bytes`` are counted on the tenant's stored-bytes ledger (``schema.stored_pk``,
    #: docs/governance.md): the file's removal releases them (its marker makes that happen once).
    #: Absent on files created while the deployment kept no ledger (governance off).
    holds_storage: bool | None = None

    @staticmethod
    def sort_key(file_id: str) -> str:
        return f"FILE#{file_id}"

    @staticmethod
    def purpose_pk(tenant: str, purpose: str) -> str:
        return f"{schema.tenant_pk(tenant)}#FILE#{purpose}"

    def keys(self) -> dict[str, str]:
        return {
            schema.PK: schema.tenant_pk(self.tenant),
            schema.SK: self.sort_key(self.id),
            schema.GSI_PURPOSE_PK: self.purpose_pk(self.tenant, self.purpose),
            schema.GSI_PURPOSE_SK: self.id,
        }

    def expiry(self) -> int | None:
        return self.expires_at

    def to_wire(self) -> FileObject:
        return FileObject(
            id=self.id,
            bytes=self.bytes,
            created_at=self.created_at,
            expires_at=self.expires_at,
            filename=self.filename,
            purpose=self.purpose,
            status=self.status,
            status_details=self.status_details,
        )


UploadStatus = Literal["pending", "completed", "cancelled", "expired"]


class UploadRecord(Record):
    tenant: str
    id: str
    filename: str
    purpose: FilePurpose
    bytes: int
    mime_type: str
    created_at: int
    expires_at: int
    status: UploadStatus = "pending"
    #: expires_after.seconds for the File the upload becomes.
    file_expires_after: int | None = None
    file_id: str | None = None
    #: True while the upload's declared ``bytes`` are reserved on the tenant's stored-bytes ledger
    #: (``FileRecord.holds_storage``): ``complete`` hands the reservation to its File (and removes
    #: this), a cancel or the record's removal releases it.
    holds_storage: bool | None = None

    #: Completed/cancelled uploads stay readable a day past their hour, then TTL removes them.
    RETENTION_SECONDS: ClassVar[int] = 86_400

    @staticmethod
    def sort_key(upload_id: str) -> str:
        return f"UPLOAD#{upload_id}"

    def keys(self) -> dict[str, str]:
        return {schema.PK: schema.tenant_pk(self.tenant), schema.SK: self.sort_key(self.id)}

    def expiry(self) -> int | None:
        return self.expires_at + self.RETENTION_SECONDS

    def effective_status(self, now: int) -> UploadStatus:
        return "expired" if self.status == "pending" and self.expires_at <= now else self.status

    def to_wire(self, now: int, file: FileObject | None = None) -> Upload:
        return Upload(
            id=self.id,
            bytes=self.bytes,
            created_at=self.created_at,
            expires_at=self.expires_at,
            filename=self.filename,
            purpose=self.purpose,
            status=self.effective_status(now),
            file=file,
        )


class UploadPartRecord(Record):
    tenant: str
    upload_id: str
    id: str
    created_at: int
    bytes: int
    s3_key: str
    expires_at: int

    @staticmethod
    def sort_key(upload_id: str, part_id: str) -> str:
        return f"UPLOAD#{upload_id}#PART#{part_id}"

    def keys(self) -> dict[str, str]:
        return {schema.PK: schema.tenant_pk(self.tenant), schema.SK: self.sort_key(self.upload_id, self.id)}

    def expiry(self) -> int | None:
        return self.expires_at + UploadRecord.RETENTION_SECONDS

    def to_wire(self) -> UploadPart:
        return UploadPart(id=self.id, created_at=self.created_at, upload_id=self.upload_id)


#: How many hex digits of a key's sha256 make its id (``key:<hex>``, the audit chain's actor).
KEY_ID_HEX = 12
KEY_ID_PREFIX = "key:"


def key_id(key_hash: str) -> str:
    """A key's visible, stable id: ``key:`` + the first ``KEY_ID_HEX`` hex digits of its sha256,
    the same string the audit chain names its requests' actor by (``audit.key_actor``)."""
    return KEY_ID_PREFIX + key_hash[:KEY_ID_HEX]


class ApiKeyRecord(Record):
    """An API key, stored only as its SHA-256. ``hint`` is the key's last four characters.
    ``disabled``: its tenant is disabled (``batchctl tenants disable``), so the authorizer refuses
    it; the authorizer reads this item and nothing else."""

    key_hash: str
    tenant: str
    created_at: int
    hint: str
    disabled: bool | None = None

    _check_tenant = field_validator("tenant")(classmethod(lambda cls, v: check_tenant(v)))

    @property
    def id(self) -> str:
        return key_id(self.key_hash)

    @property
    def status(self) -> str:
        return "disabled" if self.disabled else "active"

    @staticmethod
    def listing_sort_key(key_id: str) -> str:
        return f"KEY#{key_id}"

    def keys(self) -> dict[str, str]:
        return {schema.PK: schema.key_pk(self.key_hash), schema.SK: "KEY"}

    def listing_item(self) -> dict[str, Any]:
        """The key's item in its tenant's key partition (``schema.tenant_keys_pk``): the same
        fields, so a listing needs no read of the key items."""
        return {
            **self.to_item(),
            schema.PK: schema.tenant_keys_pk(self.tenant),
            schema.SK: self.listing_sort_key(self.id),
        }

    def id_item(self) -> dict[str, Any]:
        """The id's lookup item (``schema.key_id_pk``): where ``revoke --id`` finds the key."""
        return {
            schema.PK: schema.key_id_pk(self.id),
            schema.SK: "KEYID",
            "tenant": self.tenant,
            "key_hash": self.key_hash,
        }


class Counted(BaseModel):
    """The counters chunk accounting ADDs to, flat attributes of the item: a batch's
    (``BatchRecord``) and each of its counting shards' (``CountShardRecord``)."""

    completed: int = 0
    failed: int = 0
    input_tokens: int = 0
    cached_tokens: int = 0
    output_tokens: int = 0
    reasoning_tokens: int = 0
    chunks_done: int = 0
    #: The chunks counted on this item (None: none yet), added with their counters: a retrieve
    #: reads the run records of the other chunks only (``BatchStore.chunk_progress``). Not a
    #: counter: folding a shard adds its counters to the batch's, not this.
    counted_chunks: set[int] | None = None

    COUNTERS: ClassVar[tuple[str, ...]] = (
        "completed",
        "failed",
        "input_tokens",
        "cached_tokens",
        "output_tokens",
        "reasoning_tokens",
        "chunks_done",
    )

    def unlisted_chunks(self) -> bool:
        """Some chunk was counted here without its number in ``counted_chunks``: the item was
        counted on by a version that did not keep the set (a batch in flight across an upgrade).
        A retrieve then tells the counted chunks by their markers instead."""
        return self.chunks_done > len(self.counted_chunks or ())


class BatchRecord(Record, Counted):
    """A batch. Its counters (``Counted``) are flat attributes so that chunk accounting can ADD to
    them."""

    tenant: str
    id: str
    input_file_id: str
    endpoint: str
    completion_window: str
    created_at: int
    expires_at: int
    status: BatchStatus = "validating"
    metadata: dict[str, str] | None = None
    model: str | None = None
    errors: list[dict[str, Any]] | None = None
    output_file_id: str | None = None
    error_file_id: str | None = None
    in_progress_at: int | None = None
    finalizing_at: int | None = None
    completed_at: int | None = None
    failed_at: int | None = None
    expired_at: int | None = None
    cancelling_at: int | None = None
    cancelled_at: int | None = None
    total: int = 0
    #: Chunks the input was cut into (``chunks_done``: how many have been counted).
    chunk_count: int = 0
    #: How many shards the chunks are counted on (``limits.count_shards``, set with
    #: ``chunk_count``): 1, on this item; more, each on its own ``CountShardRecord``, which is folded
    #: into this item's counters once, when its last chunk is counted.
    count_shards: int = 1
    #: True while finished chunks may still be counted; finalize closes it first.
    accepting: bool = False
    #: Ingest finished sending the work messages and starting the workflow.
    enqueued: bool = False
    input_key: str
    output_expires_after: int | None = None
    task_token: str | None = None
    drain_deadline: int | None = None
    planned_output_file_id: str | None = None
    planned_error_file_id: str | None = None
    #: Why the batch was closed, set once by whichever workflow task closed it first (a workflow
    #: ``Signal`` value, or "fail"): it fixes what the never-ran lines say, so a retried or
    #: concurrent finalize or fail writes the same files (docs/reliability.md, "Nothing completed is lost").
    closed_for: str | None = None
    #: The enqueued-cap reservation ingest made for this batch (docs/governance.md): its model,
    #: requests and estimated prompt tokens, added to ``schema.enqueued_pk`` in the transaction that
    #: moved it to in_progress. ``holds_reservation`` is True until the terminal write that releases
    #: it (the same transaction REMOVEs it, so the release happens exactly once).
    reserved_model: str | None = None
    reserved_requests: int = 0
    reserved_tokens: int = 0
    holds_reservation: bool | None = None
    #: The tenant's output-token budget period when ingest moved the batch (None: no budget): its
    #: work messages carry it, so counting a chunk charges the budget with no policy read.
    budget_period: str | None = None
    #: The budgets when the tenant's ``budget_action`` was ``stop`` at ingest (None otherwise): its
    #: work messages carry them, so workers stop sending its lines once a period's budget is used.
    budget_stop: BudgetCaps | None = None

    @staticmethod
    def sort_key(batch_id: str) -> str:
        return f"BATCH#{batch_id}"

    def keys(self) -> dict[str, str]:
        keys = {schema.PK: schema.batches_pk(self.tenant), schema.SK: self.sort_key(self.id)}
        if self.status not in TERMINAL_STATUSES:
            keys.update(self.open_keys())
        return keys

    def open_keys(self) -> dict[str, str]:
        """The attributes that list an open batch in ``schema.GSI_OPEN`` (the sweeper's index):
        written with the batch, removed by the write that makes it terminal (``OPEN_ATTRIBUTES``)."""
        return {
            schema.GSI_OPEN_PK: schema.OPEN_PARTITION,
            schema.GSI_OPEN_SK: f"{self.expires_at:012d}#{self.tenant}#{self.id}",
        }

    #: What a terminal write removes so that the batch leaves the open-batch index.
    OPEN_ATTRIBUTES: ClassVar[tuple[str, ...]] = (schema.GSI_OPEN_PK, schema.GSI_OPEN_SK)

    def work_message(self, chunk: Chunk) -> WorkMessage:
        """The SQS work message for one chunk of this batch."""
        assert self.model is not None, "a batch has a model once it is in progress"
        return WorkMessage(
            **chunk.model_dump(),
            batch_id=self.id,
            tenant=self.tenant,
            input_key=self.input_key,
            endpoint=self.endpoint,
            model=self.model,
            expires_at=self.expires_at,
            budget_period=self.budget_period,
            budget_stop=self.budget_stop,
            count_shards=self.count_shards if self.count_shards > 1 else None,
        )

    def shard_keys(self) -> list[tuple[str, str]]:
        """The keys of the batch's counting shards (none when it counts on its own item)."""
        if self.count_shards <= 1:
            return []
        return [(chunks_pk(self.tenant, self.id, s), CountShardRecord.SORT_KEY) for s in range(self.count_shards)]

    def event_detail(self) -> dict[str, Any]:
        """The detail of the EventBridge event for this batch's status."""
        return {
            "tenant": self.tenant,
            **self.to_wire().model_dump(
                include={"id", "status", "request_counts", "usage", "output_file_id", "error_file_id", "errors"}
            ),
        }

    #: Fields the wire Batch shows exactly as the record stores them.
    _WIRE_FIELDS: ClassVar[set[str]] = {
        "id",
        "endpoint",
        "model",
        "input_file_id",
        "completion_window",
        "status",
        "output_file_id",
        "error_file_id",
        "created_at",
        "in_progress_at",
        "expires_at",
        "finalizing_at",
        "completed_at",
        "failed_at",
        "expired_at",
        "cancelling_at",
        "cancelled_at",
        "metadata",
    }

    def to_wire(self) -> Batch:
        return Batch(
            **self.model_dump(include=self._WIRE_FIELDS),
            errors=BatchErrors(data=[BatchError(**e) for e in self.errors]) if self.errors else None,
            request_counts=BatchRequestCounts(completed=self.completed, failed=self.failed, total=self.total),
            usage=BatchUsage(
                input_tokens=self.input_tokens,
                input_tokens_details=InputTokensDetails(cached_tokens=self.cached_tokens),
                output_tokens=self.output_tokens,
                output_tokens_details=OutputTokensDetails(reasoning_tokens=self.reasoning_tokens),
                total_tokens=self.input_tokens + self.output_tokens,
            ),
        )


#: Partition of a batch's chunk markers and run records (defined in ``schema``).
chunks_pk = schema.chunks_pk


def shard_pk(tenant: str, batch_id: str, chunk: int, shards: int) -> str:
    """The partition of chunk ``chunk``'s marker and run record: its counting shard's."""
    return chunks_pk(tenant, batch_id, limits.shard_of(chunk, shards))


class CountShardRecord(Record, Counted):
    """One counting shard of a batch counted on several (``BatchRecord.count_shards``): its chunks
    (``limits.shard_of``) open their attempts while it is ``starting`` and are counted here, in its
    own partition beside their markers and run records, rather than on the batch's item. Written by ingest before the first work
    message; its counters are added to the batch's once, by whoever counts its last chunk
    (``BatchStore.fold_shard``). ``starting`` and ``accepting`` follow the batch's: the workflow's
    drain and close set them False on every shard after the batch."""

    tenant: str
    batch_id: str
    shard: int
    #: The shard's chunks (``chunks_done``: how many of them are counted).
    chunk_count: int
    #: New chunks may start (False once the batch drains or closes).
    starting: bool = True
    #: Finished chunks may be counted (False once the batch closes).
    accepting: bool = True
    #: Set once, by the transaction that adds the counters to the batch's.
    folded: bool | None = None
    expires_at: int

    SORT_KEY: ClassVar[str] = "SHARD"

    def keys(self) -> dict[str, str]:
        return {schema.PK: chunks_pk(self.tenant, self.batch_id, self.shard), schema.SK: self.SORT_KEY}

    def expiry(self) -> int | None:
        return self.expires_at

    @property
    def all_counted(self) -> bool:
        return self.chunks_done >= self.chunk_count

    def counters(self) -> dict[str, int]:
        """What folding this shard adds to its batch's counters."""
        return {k: getattr(self, k) for k in self.COUNTERS}

    @classmethod
    def of(cls, batch: "BatchRecord", retention_seconds: int) -> list["CountShardRecord"]:
        """The batch's shards as ingest writes them (none when it counts on its own item)."""
        shards = batch.count_shards
        if shards <= 1:
            return []
        return [
            cls(
                tenant=batch.tenant,
                batch_id=batch.id,
                shard=s,
                chunk_count=len(range(s, batch.chunk_count, shards)),
                expires_at=batch.expires_at + retention_seconds,
            )
            for s in range(shards)
        ]


class ChunkRecord(Record):
    """The marker that a chunk was counted; written in one transaction with the batch counters."""

    tenant: str
    batch_id: str
    chunk: int
    #: The attempt whose result parts were counted (finalize reads those parts only).
    attempt: str
    completed: int
    failed: int
    input_tokens: int = 0
    cached_tokens: int = 0
    output_tokens: int = 0
    reasoning_tokens: int = 0
    recorded_at: int
    expires_at: int
    #: Charge the tokens the engine spent on this chunk (``spent_*``) to the tenant's budget of
    #: this period kind, in the count's transaction (``WorkMessage.budget_period``; None: no budget).
    budget_period: str | None = None
    #: What the engine spent on the chunk's lines, every attempt's answers included (failed,
    #: blocked, too large, timed out, run again after a crash): at least the counted usage above.
    spent_output_tokens: int = 0
    spent_input_tokens: int = 0
    #: The batch's counting shards (``WorkMessage.shards``): the marker lives in its chunk's shard.
    count_shards: int = 1

    PREFIX: ClassVar[str] = "CHUNK#"

    @classmethod
    def sort_key(cls, chunk: int) -> str:
        return f"{cls.PREFIX}{chunk:06d}"

    def keys(self) -> dict[str, str]:
        return {
            schema.PK: shard_pk(self.tenant, self.batch_id, self.chunk, self.count_shards),
            schema.SK: self.sort_key(self.chunk),
        }

    def batch_counters(self) -> dict[str, Any]:
        """What counting this chunk adds to the item it is counted on (``Counted``'s fields): its
        counters, and its number to the counted chunks."""
        return {
            "counted_chunks": {self.chunk},
            "completed": self.completed,
            "failed": self.failed,
            "input_tokens": self.input_tokens,
            "cached_tokens": self.cached_tokens,
            "output_tokens": self.output_tokens,
            "reasoning_tokens": self.reasoning_tokens,
            "chunks_done": 1,
        }

    def expiry(self) -> int | None:
        return self.expires_at

    def budget_charge(self) -> Charge | None:
        """The budget item (its sort key) and what counting this chunk adds to it: what the engine
        spent, never less than the counted usage (None: no budget)."""
        if self.budget_period is None:
            return None
        return budget_sk(self.budget_period, self.recorded_at), {
            "output_tokens": max(self.spent_output_tokens, self.output_tokens),
            "input_tokens": max(self.spent_input_tokens, self.input_tokens),
        }


class ChunkRunRecord(Record):
    """The attempts at one chunk, recorded by the workers beside its count marker (not on the
    batch's busy item): the chunk's poison budget and its progress checkpoints. Written with an
    optimistic ``version`` (``BatchStore.save_chunk_run``). See docs/reliability.md, "Poison
    isolation".

    An attempt adds its id to ``open`` when it begins and removes it when it ends benignly
    (SIGTERM drain, an engine already down, a store error). An attempt still open when the next
    one begins ended without commit and without a benign record: a real failure."""

    tenant: str
    batch_id: str
    chunk: int
    version: int = 0
    #: Attempts begun and neither counted as failed nor ended benignly.
    open: list[str] = []
    #: Real failures of this chunk, and those since it last made progress.
    failures: int = 0
    strikes: int = 0
    #: Benign ends (observability only: they never spend the budget).
    benign: int = 0
    #: Checkpointed result segments, [start, end) request indices of the chunk (0 = its first
    #: non-blank line), written as ``schema.chunk_checkpoint_key``.
    segments: list[list[int]] = []
    #: Live progress: for each recorded segment (``"start-end"``), one character per line of it,
    #: ``"1"`` for a succeeded result and ``"0"`` for a failed one, recorded in the same write as
    #: the segment (docs/lifecycle.md, "Live progress").
    outcomes: dict[str, str] = {}
    #: Lines checkpointed when the last attempt began (progress is measured against it).
    progress: int = 0
    #: Careful mode: the request lines [in_flight, in_flight_end) in the engine (alone: no other
    #: chunk's line with them), and the attempt that sent them.
    in_flight: int | None = None
    in_flight_end: int | None = None
    in_flight_by: str | None = None
    #: Lines of a group that died in flight: each runs alone from then on.
    suspects: list[int] = []
    #: Lines found alone in flight when their attempt died: they get ``engine_crashed``.
    blamed: list[int] = []
    #: What the engine spent on the chunk's lines so far, as its attempts recorded it (with each
    #: checkpoint and benign end): the count charges it to the budget (``ChunkRecord.spent_*``).
    #: An attempt killed outright loses what it spent since its last record.
    spent_input_tokens: int = 0
    spent_output_tokens: int = 0
    #: The batch's counting shards: the run record lives in its chunk's shard, beside the marker.
    count_shards: int = 1

    def spend(self) -> Spend:
        return Spend(self.spent_input_tokens, self.spent_output_tokens)

    expires_at: int

    PREFIX: ClassVar[str] = "RUN#"

    @classmethod
    def sort_key(cls, chunk: int) -> str:
        return f"{cls.PREFIX}{chunk:06d}"

    def keys(self) -> dict[str, str]:
        return {
            schema.PK: shard_pk(self.tenant, self.batch_id, self.chunk, self.count_shards),
            schema.SK: self.sort_key(self.chunk),
        }

    def expiry(self) -> int | None:
        return self.expires_at

    @property
    def careful(self) -> bool:
        """A chunk that failed for real runs its remaining lines one at a time."""
        return self.failures > 0

    def written(self) -> int:
        """How many request lines, from the first, have checkpointed results."""
        end = 0
        for start, stop in sorted(self.segments):
            if start > end:
                break
            end = max(end, stop)
        return end

    def checkpointed(self) -> tuple[int, int]:
        """(succeeded, failed) among the ``written()`` lines, each line once (overlapping segments
        are read as ``cover()`` reads them); a segment recorded without outcomes counts none."""
        succeeded = failed = end = 0
        for start, stop in self.cover():
            marks = self.outcomes.get(f"{start}-{stop}")
            if marks is not None and len(marks) == stop - start:
                kept = marks[end - start :] if end > start else marks
                succeeded += kept.count("1")
                failed += kept.count("0")
            end = stop
        return succeeded, failed

    def cover(self) -> list[tuple[int, int]]:
        """The segments to read for ``written()`` lines: each adds lines, in order."""
        out: list[tuple[int, int]] = []
        end = 0
        for start, stop in sorted(self.segments, key=lambda s: (s[0], -s[1])):
            if start > end:
                break
            if stop > end:
                out.append((start, stop))
                end = stop
        return out


class ChunkProgress(BaseModel):
    """What an open batch has finished so far (``BatchStore.chunk_progress``): the (completed,
    failed) lines of its counted chunks, from the counters they were counted on, and of each chunk
    not counted then, the (succeeded, failed) lines its run record checkpointed."""

    counted: tuple[int, int] = (0, 0)
    checkpointed: dict[int, tuple[int, int]] = {}

    def lines(self) -> tuple[int, int]:
        """(completed, failed): the counted chunks', plus the checkpointed lines of the others
        (they are never run again and always end in the final files, so this never exceeds the
        final counts)."""
        shares = [self.counted, *self.checkpointed.values()]
        return sum(s[0] for s in shares), sum(s[1] for s in shares)
