"""Ports: what the logic needs from the outside world, and nothing about how it is provided.

Logic (the API, ingest, the workflow tasks, chunk accounting, the GPU worker) takes a ``Stores``
and calls these protocols only. The AWS adapters live in ``functions.core.aws`` (one module per
service); in-memory fakes that fail the ways AWS fails live in ``tests/fakes``.

Errors every port may raise (``functions.core.errors``): ``ConditionFailed`` when a conditional
write does not hold, ``Throttled`` when the service throttled or conflicted after the SDK's own
retries. Anything else is a bug or an outage and propagates.
"""

from __future__ import annotations

import builtins
from collections.abc import Callable, Generator, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from .budgets import Charge, Spent
from .tenants import TenantPolicy

if TYPE_CHECKING:
    from .anchor import WormObject
    from .audit import AuditIntent, AuditRecord
    from .lifecycle import Change
from .records import (
    ApiKeyRecord,
    BatchRecord,
    ChunkProgress,
    ChunkRecord,
    ChunkRunRecord,
    CountShardRecord,
    FileRecord,
    UploadPartRecord,
    UploadRecord,
)


# --- Bytes ------------------------------------------------------------------------------------
class ObjectWriter(Protocol):
    """Streams bytes into one object. A context manager: completes on success, aborts on error,
    and writes no object at all when no byte was written."""

    key: str
    bytes: int

    def write(self, data: builtins.bytes) -> None: ...
    def append_object(self, key: str, size: int) -> None: ...
    def __enter__(self) -> ObjectWriter: ...
    def __exit__(self, exc_type: Any, *_: Any) -> None: ...


class Objects(Protocol):
    """The object store (S3): whole objects, ranges, streaming writes, presigned reads."""

    def put(self, key: str, body: bytes, content_type: str = "application/octet-stream") -> None: ...
    def get(self, key: str) -> bytes: ...
    def iter_bytes(self, key: str, chunk_size: int = ...) -> Iterator[bytes]: ...
    def iter_objects(self, keys: Sequence[str], *, ahead: int = ...) -> Generator[Iterator[bytes]]: ...
    def iter_range(self, key: str, start: int, end: int, chunk_size: int = ...) -> Iterator[bytes]: ...
    def copy(self, source: str, dest: str) -> None: ...
    def size(self, key: str) -> int: ...
    def delete(self, key: str) -> None: ...
    def delete_many(self, keys: Iterable[str]) -> None: ...
    def list_keys(self, prefix: str) -> list[str]: ...
    def presigned_get(self, key: str, *, seconds: int, filename: str) -> str: ...
    def writer(self, key: str) -> ObjectWriter: ...
    def concatenate(self, dest: str, sources: list[tuple[str, int]]) -> None: ...


# --- State ------------------------------------------------------------------------------------
class FileStore(Protocol):
    def create(self, record: FileRecord, *, max_stored_bytes: int | None = None) -> None:
        """Store a new File, only if its id is free. A store that keeps the stored-bytes ledger
        (governance on) also reserves ``record.bytes`` on it in the same write (the record then
        ``holds_storage``), only while the tenant's bytes stay at most ``max_stored_bytes`` (None:
        no quota). ConditionFailed otherwise (nothing written)."""

    def get(self, tenant: str, file_id: str, now: int) -> FileRecord | None: ...
    def delete(self, tenant: str, file_id: str) -> FileRecord | None: ...
    def list(
        self, tenant: str, *, purpose: str | None, after: str | None, ascending: bool, limit: int, now: int
    ) -> tuple[list[FileRecord], bool]: ...
    def settle(self, tenant: str, file_id: str, status: str, details: str | None = None) -> FileRecord | None:
        """Move a File from ``uploaded`` (an Upload being assembled) to ``status`` (``processed`` or
        ``error``, with ``details``); returns it, or None if it is gone or no longer ``uploaded``."""


class UploadStore(Protocol):
    def create(self, record: UploadRecord, *, max_stored_bytes: int | None = None) -> None:
        """Store a new Upload, reserving its declared bytes as ``FileStore.create`` does."""

    def get(self, tenant: str, upload_id: str) -> UploadRecord | None: ...
    def transition(self, record: UploadRecord, status: str, **values: Any) -> UploadRecord:
        """Move a pending upload to ``status``; ConditionFailed if it is no longer pending."""

    def complete(self, record: UploadRecord, file: FileRecord) -> None:
        """Atomically create the File and mark the pending upload completed with its id; an
        upload that ``holds_storage`` hands its reservation to the File in the same write."""

    def add_part(self, part: UploadPartRecord) -> None: ...
    def parts(self, tenant: str, upload_id: str, part_ids: list[str]) -> dict[str, UploadPartRecord]: ...


class KeyStore(Protocol):
    """API keys by hash (what the authorizer reads), listed per tenant and found by id."""

    def create(self, record: ApiKeyRecord) -> None:
        """Store the key, its tenant listing and its id, in one write, only if none of them exists
        and the tenant is not disabled (its policy's ``disabled``); ConditionFailed otherwise."""

    def get(self, key_hash: str) -> ApiKeyRecord | None: ...
    def get_by_id(self, key_id: str) -> ApiKeyRecord | None: ...
    def list(self, tenant: str) -> list[ApiKeyRecord]:
        """The tenant's keys, by id (strongly consistent: a key just created is there)."""

    def delete(self, key_hash: str) -> ApiKeyRecord | None:
        """Remove the key with its listing and id; the removed key, or None if there was none."""

    def set_disabled(self, record: ApiKeyRecord, disabled: bool) -> bool:
        """Mark (or unmark) the key and its listing disabled; False if the key is gone."""

    def all_keys(self) -> builtins.list[ApiKeyRecord]:
        """Every key (a table scan: for ``batchctl keys backfill`` only)."""

    def add_listing(self, record: ApiKeyRecord) -> bool:
        """Write the listing and id of a key stored without them; False if they exist."""


class TenantStore(Protocol):
    """Tenant policies (``functions.core.tenants``) and the batch-creation counters."""

    def get(self, tenant: str) -> TenantPolicy | None: ...
    def put(self, policy: TenantPolicy) -> None:
        """Create or replace the tenant's policy."""

    def list(self) -> list[TenantPolicy]:
        """Every stored policy, by tenant name."""

    def count_creation(self, tenant: str, window_start: int, *, limit: int, expires_at: int) -> bool:
        """Add one to the tenant's creation counter of the window starting at ``window_start``,
        only while it is below ``limit`` (atomic: concurrent creates never push it past the limit);
        True if counted, False if the window is full. The counter item expires at ``expires_at``."""

    def count_request(self, tenant: str, window_start: int, *, limit: int, expires_at: int) -> bool:
        """The same for the tenant's request counter of the minute window at ``window_start``
        (``requests_per_minute``)."""


class StoredBytes(Protocol):
    """Tenants' stored-bytes ledgers (docs/governance.md, "Stored-bytes quota"): the bytes of the
    files and uploads each tenant holds. Reservations are made with the record that holds them
    (``FileStore.create``, ``UploadStore.create``, ``BatchStore.finish``)."""

    def used(self, tenant: str) -> int: ...
    def release(self, tenant: str, holder: str, size: int) -> bool:
        """Subtract ``size`` for ``holder`` (``FileRecord.sort_key(id)`` / ``UploadRecord.sort_key(id)``)
        once: True if this call released it, False if it was released before or never held."""


class AuditLog(Protocol):
    """Where writers send what the audit chains should record (the audit queue): every role but
    the audit appender records through this, and none of them can write a chain (docs/audit.md)."""

    def record(self, intent: AuditIntent) -> None:
        """Send ``intent``; the appender appends it once per dedupe key, some time later."""


class AuditStore(Protocol):
    """Tenants' audit chains (``functions.core.audit``): records keyed by (tenant, seq), and the
    dedupe markers beside them. Only the audit appender writes; ``batchctl audit`` reads."""

    def head(self, tenant: str) -> AuditRecord | None:
        """The record with the highest seq (strongly consistent), None for an empty chain."""

    def put(self, record: AuditRecord, *, dedupe: str | None = None, charge: Charge | None = None) -> None:
        """Write ``record`` only if its seq is free (and, with ``dedupe``, together with a marker of
        that key holding the seq, only if the key is new, and with ``charge``, its ADD to the
        tenant's budget item, in one transaction); ConditionFailed otherwise."""

    def put_many(self, entries: Sequence[tuple[AuditRecord, str | None, Charge | None]]) -> None:
        """``put`` of each (record, dedupe, charge) in one transaction: all or nothing
        (ConditionFailed, nothing written, if any seq or key is taken); the charges to one budget
        item added together."""

    def dedupe_seq(self, tenant: str, key: str) -> int | None:
        """The seq of the record written with the dedupe ``key``, None if there is none."""

    def record(self, tenant: str, seq: int) -> AuditRecord | None:
        """The record ``seq`` of ``tenant``'s chain (strongly consistent), None if absent."""

    def records(self, tenant: str) -> list[AuditRecord]:
        """The whole chain as stored, in sort key (seq) order."""


class WormStore(Protocol):
    """Write-once objects (an S3 bucket with Object Lock): the audit chains' WORM copies and
    signed checkpoints (``functions.core.anchor``)."""

    def put_once(self, key: str, body: bytes) -> bool:
        """Write ``key`` only if no object has it; False (nothing written) if one does."""

    def find(self, key: str) -> bytes | None:
        """The current bytes of ``key``, None if there is no such object."""

    def any_after(self, prefix: str, key: str) -> bool:
        """Whether an object under ``prefix`` has a key that sorts after ``key`` (one LIST)."""

    def originals(self, prefix: str) -> dict[str, WormObject]:
        """Every key under ``prefix`` with its first version (the bytes written first, which
        Object Lock keeps), how many versions it has and whether a delete marker hides it."""


class Signer(Protocol):
    """An asymmetric signing key (ECDSA P-256, SHA-256; DER signatures): KMS in the cloud, a local
    key file in the local deployment. The audit appender signs checkpoints with it."""

    #: What names the key in a checkpoint (the KMS key ARN; ``local:<fingerprint>``).
    key_id: str

    def sign(self, message: bytes) -> bytes: ...
    def public_key(self) -> bytes:
        """The public key as DER SubjectPublicKeyInfo (what KMS GetPublicKey returns)."""


class BatchStore(Protocol):
    def create(self, record: BatchRecord) -> None: ...
    def get(self, tenant: str, batch_id: str) -> BatchRecord | None: ...
    def list(self, tenant: str, *, after: str | None, limit: int) -> tuple[list[BatchRecord], bool]: ...
    def transition(
        self, tenant: str, batch_id: str, change: Change, *, files: Sequence[FileRecord] = ()
    ) -> BatchRecord:
        """Apply one lifecycle ``Change`` (``functions.core.lifecycle``) as one conditional write,
        with ``files`` created and the change's enqueued-cap counter change in the same
        transaction; a terminal change releases a held reservation (``lifecycle.settle``). Returns
        the batch as now stored; ConditionFailed if the change's condition (or a cap) does not
        hold (nothing written)."""

    def count_chunk(self, marker: ChunkRecord) -> bool:
        """Write the chunk's marker and add its counts to the batch (or, for a batch counted on
        shards, to the chunk's shard) in one transaction, only while it accepts chunks. True if
        this call counted it; False for a duplicate or a late chunk."""

    def open_shards(self, shards: Sequence[CountShardRecord]) -> None:
        """Write a batch's counting shards, each only if absent."""

    def count_shard(self, tenant: str, batch_id: str, shard: int) -> CountShardRecord | None: ...
    def count_shards(self, batch: BatchRecord) -> builtins.list[CountShardRecord]:
        """Every counting shard of the batch, as stored (none when it counts on its own item)."""

    def fold_shard(self, shard: CountShardRecord) -> bool:
        """Add a fully counted shard's counters (as read, and still stored) to its batch's, once,
        only while the batch accepts chunks (one transaction); False if folded already, not fully
        counted, or the batch closed."""

    def close_shards(self, batch: BatchRecord, *, accepting: bool) -> None:
        """Stop the batch's shards starting chunks and, unless ``accepting``, counting them."""

    def counted_chunk(self, tenant: str, batch_id: str, chunk: int, shards: int = 1) -> ChunkRecord | None: ...
    def count_markers(self, chunks: Sequence[tuple[str, str, int, int]]) -> dict[tuple[str, str, int], ChunkRecord]:
        """The count markers of (tenant, batch, chunk, shards) chunks, read together (one
        BatchGetItem a hundred), by (tenant, batch, chunk); an uncounted chunk is absent."""

    def chunk_state(
        self, tenant: str, batch_id: str, chunk: int, shards: int = 1
    ) -> tuple[ChunkRecord | None, ChunkRunRecord | None]:
        """The chunk's count marker and run record, read together (one BatchGetItem of its
        partition): what a worker starting the chunk needs to know."""

    def counted_chunks(self, tenant: str, batch_id: str, shards: int = 1) -> dict[int, ChunkRecord]: ...
    def chunk_run(self, tenant: str, batch_id: str, chunk: int, shards: int = 1) -> ChunkRunRecord | None:
        """The run record of one chunk (its attempts and checkpoints; None before the first)."""

    def chunk_states(
        self, tenant: str, batch_id: str, shards: int = 1
    ) -> tuple[dict[int, ChunkRecord], dict[int, ChunkRunRecord]]:
        """The batch's count markers and run records, by chunk, read together (one strongly
        consistent Query of each chunk partition): the live progress of an open batch."""

    def chunk_progress(self, batch: BatchRecord) -> ChunkProgress:
        """What a retrieve of the open ``batch`` shows: the lines of its counted chunks, from the
        counters they were counted on (``batch``'s own as read, or its shards' read now), then the
        checkpointed lines of the chunks those did not count, from their run records (strongly
        consistent reads, in proportion to those chunks)."""

    def save_chunk_run(
        self, record: ChunkRunRecord, *, starting: bool = False, over: ChunkRunRecord | None = None
    ) -> None:
        """Store ``record`` only if the stored one has ``record.version - 1`` (is absent when
        ``record.version`` is 1): an optimistic write; ConditionFailed otherwise. ``over``: the
        record as read at ``record.version - 1`` (a store may then write only what differs from
        it). ``starting``
        (an attempt being opened): only while the batch takes new chunks (its item ``in_progress``
        and ``accepting``; on shards, the chunk's shard ``starting``), in the same transaction;
        ChunksStopped otherwise."""

    def enqueued(self, tenant: str, model: str) -> tuple[int, int]:
        """The (requests, tokens) currently reserved on the tenant's counter for ``model``."""

    def budget_used(self, tenant: str, period_sk: str) -> Spent:
        """The tokens charged to the tenant's budget item ``period_sk`` (``budgets.budget_sk``) by
        counted chunks whose marker carries a ``budget_period`` (``count_chunk``)."""

    def open_batches(self) -> builtins.list[tuple[str, str]]:
        """(tenant, batch_id) of every batch not in a terminal state (the sweeper's work list;
        never a table scan). Eventually consistent: a batch may show up moments after it ended."""


# --- Messages, workflows, events --------------------------------------------------------------
@dataclass(frozen=True)
class Received:
    """A message as a consumer receives it."""

    message_id: str
    receipt: str
    body: str
    #: How often the queue has delivered this message (1 on the first delivery).
    receive_count: int


class WorkQueue(Protocol):
    """One queue (SQS): send in batches, receive, keep invisible, release, delete."""

    url: str

    def send(self, bodies: list[str]) -> None: ...
    def receive(self, max_messages: int, wait_seconds: int, visibility_seconds: int) -> list[Received]: ...
    def extend(self, receipt: str, seconds: int) -> bool:
        """Keep a message invisible ``seconds`` more; False if the receipt is no longer valid."""

    def release(self, receipt: str, after_seconds: int = 0) -> bool:
        """Make a message visible again (at once, or after ``after_seconds``)."""

    def delete(self, receipt: str) -> None: ...


class Queues(Protocol):
    """The queues by URL (a deployment has one work queue per served model)."""

    def queue(self, url: str) -> WorkQueue: ...


class Workflows(Protocol):
    """Batch workflows (Step Functions): start one per batch, resume its waiting task."""

    def start(self, name: str, payload: dict[str, Any]) -> None:
        """Start the execution ``name``; starting it again is a no-op."""

    def signal(self, token: str, output: dict[str, Any]) -> bool:
        """Resume the waiting task with ``output``; False if the token is no longer valid."""


class Events(Protocol):
    """Lifecycle events (EventBridge)."""

    def publish(self, detail_type: str, detail: dict[str, Any]) -> None: ...


@dataclass(frozen=True)
class Stores:
    """Everything logic reaches outside the process, as ports."""

    objects: Objects
    files: FileStore
    uploads: UploadStore
    keys: KeyStore
    batches: BatchStore
    queues: Queues
    workflows: Workflows
    events: Events
    tenants: TenantStore
    stored: StoredBytes
    #: Where writers send audit intents for the chains: the API its actions, the chunk counters
    #: (GPU worker, chunk DLQ consumer) their chunk receipts. None: this deployment keeps no audit
    #: chain (governance off, docs/audit.md).
    audit_log: AuditLog | None = None
    #: Its adapters may be called from several threads at once (the GPU worker's AWS set,
    #: ``stores_from_settings(concurrent=True)``: boto3 clients are thread-safe, and its DynamoDB
    #: table is a boto3 resource per thread). The worker then makes several store calls at once
    #: (``WorkerConfig.store_threads``); otherwise one at a time.
    concurrent: bool = False
    #: Makes the calling thread's own clients ready (no network), for a thread that calls the
    #: stores later (the worker's store threads run it first); None: nothing to make.
    prepare: Callable[[], None] | None = None


# --- The inference engine (the worker's side) ---------------------------------------------------
class EngineReply(Protocol):
    """One line's outcome: the HTTP status and parsed body (status None: the engine never
    answered, ``error_code``/``error_message`` say why). Read-only (a frozen dataclass is one)."""

    @property
    def status(self) -> int | None: ...
    @property
    def body(self) -> Any: ...
    @property
    def request_id(self) -> str: ...
    @property
    def error_code(self) -> str: ...
    @property
    def error_message(self) -> str: ...
    @property
    def attempts(self) -> int:
        """How often it was sent (timeouts and connection errors are retried)."""


class Engine(Protocol):
    """The OpenAI-compatible engine beside the worker (vLLM's server on loopback). Transport
    faults are retried inside; what comes back is the request's answer, whatever its status."""

    async def healthy(self) -> bool: ...
    async def wait_healthy(self, timeout: float, interval: float = 1.0) -> float: ...
    async def post(self, path: str, body: dict[str, Any]) -> EngineReply: ...
    async def post_form(
        self, path: str, fields: list[tuple[str, str]], files: list[tuple[str, str, bytes]]
    ) -> EngineReply:
        """The same as ``post`` as ``multipart/form-data`` (the audio endpoints): ``fields``
        (name, value), ``files`` (field name, file name, bytes)."""
