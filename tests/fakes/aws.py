"""In-memory fakes of every port in ``functions.core.ports``, for unit tests of the logic.

They keep the contracts the AWS adapters keep (conditional writes raise ``ConditionFailed``, a chunk
is counted once and only while its batch accepts chunks, an unknown token is not signalled, a
writer that wrote nothing leaves no object) and can be told to fail the ways AWS fails:

    stores = fake_stores()
    stores.faults.fail("batches.transition", throttle())        # the next transition throttles
    stores.faults.fail("objects.put", TimeoutError(), times=2)  # the next two puts time out
    stores.faults.fail("workflows.signal", conflict())          # a lost signal
    queue.drop_next(1); queue.duplicate_next(1)                  # a lost / duplicated message

Every call is counted in ``stores.faults.calls`` (by the same names), so a test can also assert
how often a port was reached.
"""

from __future__ import annotations

import copy
import itertools
import threading
from collections import Counter, defaultdict
from collections.abc import Generator, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from functions.core import lifecycle
from functions.core.audit import AuditRecord
from functions.core.budgets import BUDGET_KINDS, Charge, Spent
from functions.core.errors import ChunksStopped, ConditionFailed, Throttled, TransactionConflict
from functions.core.lifecycle import Change
from functions.core.limits import shard_of
from functions.core.ports import Received, Stores
from functions.core.records import (
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
)
from functions.core.tenants import Reservation, TenantPolicy


# --- Faults -----------------------------------------------------------------------------------
def throttle() -> Throttled:
    """What an adapter raises once the SDK's retries gave up on throttling."""
    return Throttled("The service is busy; retry the request shortly.")


def conflict() -> TransactionConflict:
    """A DynamoDB transaction conflict, as the adapters report it once their own retries gave up."""
    return TransactionConflict("The service is busy; retry the request shortly.")


def condition_failed() -> ConditionFailed:
    return ConditionFailed("ConditionalCheckFailedException")


class Faults:
    """Scripted failures by operation name ("<port>.<method>", e.g. "batches.count_chunk")."""

    def __init__(self) -> None:
        self._plan: dict[str, list[BaseException | None]] = defaultdict(list)
        self.calls: Counter[str] = Counter()

    def fail(self, op: str, error: BaseException, times: int = 1, *, skip: int = 0) -> None:
        """After ``skip`` more calls of ``op`` that pass, the next ``times`` calls raise ``error``
        (before doing anything)."""
        self._plan[op].extend([None] * skip + [error] * times)

    def pending(self, op: str) -> int:
        return sum(1 for error in self._plan[op] if error is not None)

    def check(self, op: str) -> None:
        self.calls[op] += 1
        if self._plan[op] and (error := self._plan[op].pop(0)) is not None:
            raise error


class _Port:
    name = ""

    def __init__(self, faults: Faults):
        self.faults = faults

    def _op(self, method: str) -> None:
        self.faults.check(f"{self.name}.{method}")


# --- Objects ----------------------------------------------------------------------------------
class FakeWriter:
    def __init__(self, objects: FakeObjects, key: str):
        self._objects, self.key = objects, key
        self._buffer = bytearray()
        self.bytes = 0
        self.aborted = False

    def write(self, data: bytes) -> None:
        self._objects._op("writer.write")
        self._buffer += data
        self.bytes += len(data)

    def append_object(self, key: str, size: int) -> None:
        self.write(self._objects.get(key))

    def __enter__(self) -> FakeWriter:
        return self

    def __exit__(self, exc_type: Any, *_: Any) -> None:
        if exc_type is not None:
            self.aborted = True
            return
        if self.bytes:
            self._objects._op("writer.complete")
            self._objects.data[self.key] = bytes(self._buffer)


class FakeObjects(_Port):
    name = "objects"

    def __init__(self, faults: Faults):
        super().__init__(faults)
        self.data: dict[str, bytes] = {}
        self.writers: list[FakeWriter] = []

    def put(self, key: str, body: bytes, content_type: str = "application/octet-stream") -> None:
        self._op("put")
        self.data[key] = bytes(body)

    def get(self, key: str) -> bytes:
        self._op("get")
        if key not in self.data:
            raise KeyError(f"NoSuchKey: {key}")
        return self.data[key]

    def iter_bytes(self, key: str, chunk_size: int = 1024 * 1024) -> Iterator[bytes]:
        body = self.get(key)
        for start in range(0, len(body), chunk_size):
            yield body[start : start + chunk_size]

    def iter_objects(self, keys: Sequence[str], *, ahead: int = 0) -> Generator[Iterator[bytes]]:
        for key in keys:  # a missing key fails at its turn, as the adapter's GET does
            yield iter(list(self.iter_bytes(key)))

    def iter_range(self, key: str, start: int, end: int, chunk_size: int = 1024 * 1024) -> Iterator[bytes]:
        if end <= start:
            return
        body = self.get(key)[start:end]
        for i in range(0, len(body), chunk_size):
            yield body[i : i + chunk_size]

    def copy(self, source: str, dest: str) -> None:
        self._op("copy")
        self.data[dest] = self.get(source)

    def size(self, key: str) -> int:
        return len(self.get(key))

    def delete(self, key: str) -> None:
        self._op("delete")
        self.data.pop(key, None)

    def delete_many(self, keys: Iterable[str]) -> None:
        self._op("delete_many")
        for key in keys:
            self.data.pop(key, None)

    def list_keys(self, prefix: str) -> list[str]:
        self._op("list_keys")
        return sorted(k for k in self.data if k.startswith(prefix))

    def presigned_get(self, key: str, *, seconds: int, filename: str) -> str:
        self._op("presigned_get")
        return f"https://objects.invalid/{key}?expires={seconds}&filename={filename}"

    def writer(self, key: str) -> FakeWriter:
        self._op("writer")
        w = FakeWriter(self, key)
        self.writers.append(w)
        return w

    def concatenate(self, dest: str, sources: list[tuple[str, int]]) -> None:
        self._op("concatenate")
        self.data[dest] = b"".join(self.get(k) for k, _ in sources)


# --- State ------------------------------------------------------------------------------------
def _matches(item: dict[str, Any] | None, expect: dict[str, Any]) -> bool:
    """The item exists and each attribute equals its value (tuple: is one of them; None: absent),
    as the DynamoDB adapter's condition says."""
    if item is None:
        return False
    for k, v in expect.items():
        have = item.get(k)
        if v is None:
            if have is not None:
                return False
        elif isinstance(v, tuple):
            if have not in v:
                return False
        elif have != v:
            return False
    return True


def _apply(item: dict[str, Any], values: dict, defaults: dict, add: dict, remove: tuple) -> dict[str, Any]:
    item = copy.deepcopy(item)
    item.update(copy.deepcopy(values))
    for k, v in defaults.items():
        if item.get(k) is None:
            item[k] = copy.deepcopy(v)
    for k, v in add.items():
        if isinstance(v, (set, frozenset)):
            item[k] = set(item.get(k) or ()) | set(v)
        else:
            item[k] = (item.get(k) or 0) + v
    for k in remove:
        item[k] = None
    return item


class FakeStored(_Port):
    """The stored-bytes ledgers: a counter per tenant and a marker per holder, as the adapter keeps
    them (``aws.stored``). ``track``: the stores keep a ledger (governance on); a release works
    either way. The other fakes reserve and charge through ``hold``/``charge`` (no fault of
    their own: a reservation fails with the record's write)."""

    name = "stored"

    def __init__(self, faults: Faults, *, track: bool = True):
        super().__init__(faults)
        self.track = track
        self.counters: dict[str, int] = {}
        self.markers: dict[tuple[str, str], int] = {}

    def used(self, tenant: str) -> int:
        self._op("used")
        return self.counters.get(tenant, 0)

    def release(self, tenant: str, holder: str, size: int) -> bool:
        self._op("release")
        if self.markers.pop((tenant, holder), None) is None:
            return False
        self.counters[tenant] = self.counters.get(tenant, 0) - size
        return True

    def check_hold(self, tenant: str, holder: str, size: int, limit: int | None) -> None:
        """ConditionFailed if the reservation would not fit (or the holder has one)."""
        if (tenant, holder) in self.markers or (limit is not None and self.counters.get(tenant, 0) + size > limit):
            raise condition_failed()

    def hold(self, tenant: str, holder: str, size: int) -> None:
        self.markers[(tenant, holder)] = size
        self.counters[tenant] = self.counters.get(tenant, 0) + size

    def move(self, tenant: str, old: str, new: str) -> None:
        self.markers[(tenant, new)] = self.markers.pop((tenant, old))


class FakeFiles(_Port):
    name = "files"

    def __init__(self, faults: Faults, stored: FakeStored | None = None):
        super().__init__(faults)
        self.items: dict[tuple[str, str], FileRecord] = {}
        self.stored = stored or FakeStored(faults, track=False)

    def create(self, record: FileRecord, *, max_stored_bytes: int | None = None) -> None:
        self._op("create")
        if (record.tenant, record.id) in self.items:
            raise condition_failed()
        if self.stored.track:
            holder = FileRecord.sort_key(record.id)
            self.stored.check_hold(record.tenant, holder, record.bytes, max_stored_bytes)
            self.stored.hold(record.tenant, holder, record.bytes)
            record = record.model_copy(update={"holds_storage": True})
        self.items[(record.tenant, record.id)] = record

    def get(self, tenant: str, file_id: str, now: int) -> FileRecord | None:
        self._op("get")
        record = self.items.get((tenant, file_id))
        return None if record is None or record.expired(now) else record

    def delete(self, tenant: str, file_id: str) -> FileRecord | None:
        self._op("delete")
        return self.items.pop((tenant, file_id), None)

    def list(
        self, tenant: str, *, purpose: str | None, after: str | None, ascending: bool, limit: int, now: int
    ) -> tuple[list[FileRecord], bool]:
        self._op("list")
        ids = sorted(i for (t, i), r in self.items.items() if t == tenant and (purpose is None or r.purpose == purpose))
        if not ascending:
            ids.reverse()
        if after is not None:
            ids = [i for i in ids if (i > after if ascending else i < after)]
        alive = [self.items[(tenant, i)] for i in ids if not self.items[(tenant, i)].expired(now)]
        return alive[:limit], len(alive) > limit

    def settle(self, tenant: str, file_id: str, status: str, details: str | None = None) -> FileRecord | None:
        self._op("settle")
        current = self.items.get((tenant, file_id))
        if current is None or current.status != "uploaded":
            return None
        new = current.model_copy(update={"status": status, "status_details": details})
        self.items[(tenant, file_id)] = new
        return new


class FakeUploads(_Port):
    name = "uploads"

    def __init__(self, faults: Faults, files: FakeFiles):
        super().__init__(faults)
        self.items: dict[tuple[str, str], UploadRecord] = {}
        self.part_items: dict[tuple[str, str, str], UploadPartRecord] = {}
        self._files = files

    def create(self, record: UploadRecord, *, max_stored_bytes: int | None = None) -> None:
        self._op("create")
        if (record.tenant, record.id) in self.items:
            raise condition_failed()
        stored = self._files.stored
        if stored.track:
            holder = UploadRecord.sort_key(record.id)
            stored.check_hold(record.tenant, holder, record.bytes, max_stored_bytes)
            stored.hold(record.tenant, holder, record.bytes)
            record = record.model_copy(update={"holds_storage": True})
        self.items[(record.tenant, record.id)] = record

    def get(self, tenant: str, upload_id: str) -> UploadRecord | None:
        self._op("get")
        return self.items.get((tenant, upload_id))

    def transition(self, record: UploadRecord, status: str, **values: Any) -> UploadRecord:
        self._op("transition")
        current = self.items.get((record.tenant, record.id))
        if current is None or current.status != "pending":
            raise condition_failed()
        new = current.model_copy(update={"status": status, **values})
        self.items[(record.tenant, record.id)] = new
        return new

    def complete(self, record: UploadRecord, file: FileRecord) -> None:
        self._op("complete")
        current = self.items.get((record.tenant, record.id))
        if current is None or current.status != "pending" or (file.tenant, file.id) in self._files.items:
            raise condition_failed()
        update: dict[str, Any] = {"status": "completed", "file_id": file.id}
        if record.holds_storage:  # the reservation becomes the File's
            if not current.holds_storage:
                raise condition_failed()
            self._files.stored.move(record.tenant, UploadRecord.sort_key(record.id), FileRecord.sort_key(file.id))
            file = file.model_copy(update={"holds_storage": True})
            update["holds_storage"] = None
        self._files.items[(file.tenant, file.id)] = file
        self.items[(record.tenant, record.id)] = current.model_copy(update=update)

    def add_part(self, part: UploadPartRecord) -> None:
        self._op("add_part")
        key = (part.tenant, part.upload_id, part.id)
        if key in self.part_items:
            raise condition_failed()
        self.part_items[key] = part

    def parts(self, tenant: str, upload_id: str, part_ids: list[str]) -> dict[str, UploadPartRecord]:
        self._op("parts")
        return {p: r for p in part_ids if (r := self.part_items.get((tenant, upload_id, p))) is not None}


class FakeKeys(_Port):
    """Keys with their tenant listings and ids, kept together as the adapter's transactions keep
    them; ``put_unlisted`` stores a key as keys stored before ids were (no listing, no id)."""

    name = "keys"

    def __init__(self, faults: Faults, tenants: FakeTenants | None = None):
        super().__init__(faults)
        self.items: dict[str, ApiKeyRecord] = {}
        self.listed: dict[tuple[str, str], str] = {}  # (tenant, key id) -> key hash
        self.ids: dict[str, str] = {}  # key id -> key hash
        self._tenants = tenants

    def create(self, record: ApiKeyRecord) -> None:
        self._op("create")
        policy = self._tenants.policies.get(record.tenant) if self._tenants else None
        if (
            record.key_hash in self.items
            or record.id in self.ids
            or (record.tenant, record.id) in self.listed
            or (policy is not None and policy.disabled)
        ):
            raise condition_failed()
        self.items[record.key_hash] = record
        self.listed[(record.tenant, record.id)] = record.key_hash
        self.ids[record.id] = record.key_hash

    def put_unlisted(self, record: ApiKeyRecord) -> None:
        """Test setup: a key item alone."""
        self.items[record.key_hash] = record

    def get(self, key_hash: str) -> ApiKeyRecord | None:
        self._op("get")
        return self.items.get(key_hash)

    def get_by_id(self, key_id: str) -> ApiKeyRecord | None:
        self._op("get_by_id")
        key_hash = self.ids.get(key_id)
        return self.items.get(key_hash) if key_hash else None

    def list(self, tenant: str) -> list[ApiKeyRecord]:
        self._op("list")
        return [self.items[h] for (t, _), h in sorted(self.listed.items()) if t == tenant]

    def delete(self, key_hash: str) -> ApiKeyRecord | None:
        self._op("delete")
        record = self.items.pop(key_hash, None)
        if record is not None:
            if self.listed.get((record.tenant, record.id)) == key_hash:
                del self.listed[(record.tenant, record.id)]
            if self.ids.get(record.id) == key_hash:
                del self.ids[record.id]
        return record

    def set_disabled(self, record: ApiKeyRecord, disabled: bool) -> bool:
        self._op("set_disabled")
        if record.key_hash not in self.items:
            return False
        self.items[record.key_hash] = self.items[record.key_hash].model_copy(
            update={"disabled": True if disabled else None}
        )
        return True

    def all_keys(self) -> list[ApiKeyRecord]:
        self._op("all_keys")
        return list(self.items.values())

    def add_listing(self, record: ApiKeyRecord) -> bool:
        self._op("add_listing")
        if (record.tenant, record.id) in self.listed or record.id in self.ids:
            return False
        self.listed[(record.tenant, record.id)] = record.key_hash
        self.ids[record.id] = record.key_hash
        return True


class FakeTenants(_Port):
    name = "tenants"

    def __init__(self, faults: Faults):
        super().__init__(faults)
        self.policies: dict[str, TenantPolicy] = {}
        self.counters: dict[tuple[str, int], int] = {}
        #: The request-rate counters: (tenant, minute window start) -> requests counted.
        self.requests: dict[tuple[str, int], int] = {}

    def get(self, tenant: str) -> TenantPolicy | None:
        self._op("get")
        policy = self.policies.get(tenant)
        return policy.model_copy(deep=True) if policy else None

    def put(self, policy: TenantPolicy) -> None:
        self._op("put")
        self.policies[policy.tenant] = policy.model_copy(deep=True)

    def list(self) -> list[TenantPolicy]:
        self._op("list")
        return [self.policies[t].model_copy(deep=True) for t in sorted(self.policies)]

    def count_creation(self, tenant: str, window_start: int, *, limit: int, expires_at: int) -> bool:
        self._op("count_creation")
        return self._count(self.counters, (tenant, window_start), limit)

    def count_request(self, tenant: str, window_start: int, *, limit: int, expires_at: int) -> bool:
        self._op("count_request")
        return self._count(self.requests, (tenant, window_start), limit)

    @staticmethod
    def _count(counters: dict[tuple[str, int], int], key: tuple[str, int], limit: int) -> bool:
        count = counters.get(key, 0)
        if count >= limit:
            return False
        counters[key] = count + 1
        return True


class FakeAudit(_Port):
    """Audit chains with the adapter's conditions: a seq is written once, a dedupe key once, the
    two (and a receipt's budget charge, into ``budgets``' items) atomically (a lock: threads may
    race on it as Lambdas race on DynamoDB)."""

    name = "chain"

    def __init__(self, faults: Faults, budgets: FakeBatches | None = None):
        super().__init__(faults)
        self._budgets = budgets
        self.chains: dict[str, dict[int, AuditRecord]] = {}
        self.dedupe: dict[tuple[str, str], int] = {}
        self._lock = threading.Lock()

    def head(self, tenant: str) -> AuditRecord | None:
        self._op("head")
        with self._lock:
            chain = self.chains.get(tenant) or {}
            return chain[max(chain)] if chain else None

    def put(self, record: AuditRecord, *, dedupe: str | None = None, charge: Charge | None = None) -> None:
        self._op("put")
        if charge is not None and dedupe is None:
            raise ValueError("a budget charge needs a dedupe key (it is written once with it)")
        with self._lock:
            chain = self.chains.setdefault(record.tenant, {})
            if record.seq in chain or (dedupe is not None and (record.tenant, dedupe) in self.dedupe):
                raise condition_failed()
            chain[record.seq] = record
            if dedupe is not None:
                self.dedupe[(record.tenant, dedupe)] = record.seq
                if charge is not None and self._budgets is not None:
                    self._budgets.charge(record.tenant, charge[0], **charge[1])

    def put_many(self, entries: Sequence[tuple[AuditRecord, str | None, Charge | None]]) -> None:
        self._op("put_many")
        with self._lock:
            taken = {(r.tenant, r.seq) for r, _, _ in entries}
            keys = [(r.tenant, d) for r, d, _ in entries if d is not None]
            if len(taken) < len(entries) or len(set(keys)) < len(keys):
                # DynamoDB refuses a transaction naming an item twice (ValidationException)
                raise ValueError("a transaction names each item once")
            if any(seq in self.chains.get(t, {}) for t, seq in taken) or any(k in self.dedupe for k in keys):
                raise condition_failed()
            for record, dedupe, charge in entries:
                self.chains.setdefault(record.tenant, {})[record.seq] = record
                if dedupe is not None:
                    self.dedupe[(record.tenant, dedupe)] = record.seq
                if charge is not None and self._budgets is not None:
                    self._budgets.charge(record.tenant, charge[0], **charge[1])

    def dedupe_seq(self, tenant: str, key: str) -> int | None:
        self._op("dedupe_seq")
        with self._lock:
            return self.dedupe.get((tenant, key))

    def record(self, tenant: str, seq: int) -> AuditRecord | None:
        self._op("record")
        with self._lock:
            return (self.chains.get(tenant) or {}).get(seq)

    def records(self, tenant: str) -> list[AuditRecord]:
        self._op("records")
        with self._lock:
            chain = self.chains.get(tenant) or {}
            return [chain[seq] for seq in sorted(chain)]


class KeySigner:
    """The ``Signer`` port on an in-memory ECDSA P-256 key (what KMS and the local key file do)."""

    def __init__(self, key_id: str = "test-key") -> None:
        from cryptography.hazmat.primitives.asymmetric import ec

        self.key_id = key_id
        self._key = ec.generate_private_key(ec.SECP256R1())

    def sign(self, message: bytes) -> bytes:
        from cryptography.hazmat.primitives import hashes
        from cryptography.hazmat.primitives.asymmetric import ec

        return self._key.sign(message, ec.ECDSA(hashes.SHA256()))

    def public_key(self) -> bytes:
        from cryptography.hazmat.primitives import serialization

        return self._key.public_key().public_bytes(
            serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
        )


class FakeAuditLog(_Port):
    """``AuditLog`` that runs the audit appender's logic synchronously on every intent (a chain,
    a WORM store and a signing key of its own; the stores' batches and objects for receipts), then
    signs the tenant's checkpoint, as the appender does after its batch: unit tests read the
    chain right after the call. ``intents``: everything sent, in order."""

    name = "audit"

    def __init__(self, faults: Faults, batches: Any, objects: Any) -> None:
        from functions.audit_append.logic import AppenderStores

        super().__init__(faults)
        self.chain = FakeAudit(faults, batches)
        self.worm = FakeWorm(faults)
        self.signer = KeySigner()
        self.stores = AppenderStores(
            chain=self.chain, worm=self.worm, signer=self.signer, batches=batches, objects=objects
        )
        self.intents: list[Any] = []

    def record(self, intent: Any) -> None:
        from functions.audit_append.logic import Invocation

        self._op("record")
        self.intents.append(intent)
        run = Invocation(self.stores, now=lambda: intent.at, sleep=lambda _: None)
        run.take(intent)
        for tenant in run.heads:
            run.checkpoint(tenant)

    def records(self, tenant: str) -> list[AuditRecord]:
        return self.chain.records(tenant)


class FakeBatches(_Port):
    name = "batches"

    def __init__(self, faults: Faults, files: FakeFiles):
        super().__init__(faults)
        self.items: dict[tuple[str, str], dict[str, Any]] = {}
        self.markers: dict[tuple[str, str, int], ChunkRecord] = {}
        self.runs: dict[tuple[str, str, int], ChunkRunRecord] = {}
        #: Counting shards: (tenant, batch_id, shard) -> the stored shard's attributes.
        self.shards: dict[tuple[str, str, int], dict[str, Any]] = {}
        self._files = files
        #: The enqueued-cap counters: (tenant, model) -> {"requests": n, "tokens": n}.
        self.counters: dict[tuple[str, str], dict[str, int]] = {}
        #: The token budget items: (tenant, period sk) -> what each kind of token was charged.
        self.budgets: dict[tuple[str, str], Spent] = {}

    def put(self, record: BatchRecord) -> None:
        """Test setup: store a batch as it is (no fault, no condition)."""
        self.items[(record.tenant, record.id)] = record.model_dump()

    def create(self, record: BatchRecord) -> None:
        self._op("create")
        if (record.tenant, record.id) in self.items:
            raise condition_failed()
        self.items[(record.tenant, record.id)] = record.model_dump()

    def get(self, tenant: str, batch_id: str) -> BatchRecord | None:
        self._op("get")
        item = self.items.get((tenant, batch_id))
        return BatchRecord.model_validate(copy.deepcopy(item)) if item is not None else None

    def list(self, tenant: str, *, after: str | None, limit: int) -> tuple[list[BatchRecord], bool]:
        self._op("list")
        ids = sorted((i for (t, i) in self.items if t == tenant), reverse=True)
        if after is not None:
            ids = [i for i in ids if i < after]
        return [BatchRecord.model_validate(copy.deepcopy(self.items[(tenant, i)])) for i in ids[:limit]], len(
            ids
        ) > limit

    def set(self, tenant: str, batch_id: str, **values: Any) -> BatchRecord:
        """Test setup: set attributes of a stored batch as they are (no fault, no condition, no
        lifecycle rule)."""
        record = BatchRecord.model_validate({**self.items[(tenant, batch_id)], **values})
        self.items[(tenant, batch_id)] = record.model_dump()
        return record

    def _write(self, tenant: str, batch_id: str, change: Change, files: Sequence[FileRecord]) -> BatchRecord:
        """One conditional write or transaction, as the adapter renders it: the batch's update,
        its counter change (a reservation within its caps), the files; all or nothing."""
        item = self.items.get((tenant, batch_id))
        if not _matches(item, dict(change.expect)):
            raise condition_failed()
        assert item is not None
        counter = change.counter
        if counter is not None:
            stored = self.counters.get((counter.tenant, counter.model), {"requests": 0, "tokens": 0})
            if isinstance(counter, Reservation) and not counter.fits(stored["requests"], stored["tokens"]):
                raise condition_failed()
            sign = 1 if isinstance(counter, Reservation) else -1
            self.counters[(counter.tenant, counter.model)] = {
                "requests": stored["requests"] + sign * counter.requests,
                "tokens": stored["tokens"] + sign * counter.tokens,
            }
        new = _apply(item, dict(change.values), dict(change.defaults), dict(change.add), change.remove)
        record = BatchRecord.model_validate(new)  # the stored shape stays a valid record
        self.items[(tenant, batch_id)] = record.model_dump()
        ledger = self._files.stored
        for f in files:
            if ledger.track:  # counted, never refused (as the adapter)
                ledger.hold(f.tenant, FileRecord.sort_key(f.id), f.bytes)
                f = f.model_copy(update={"holds_storage": True})
            self._files.items[(f.tenant, f.id)] = f
        return record

    def transition(
        self, tenant: str, batch_id: str, change: Change, *, files: Sequence[FileRecord] = ()
    ) -> BatchRecord:
        self._op("transition")
        return lifecycle.settle(
            change, lambda c: self._write(tenant, batch_id, c, files), lambda: self._peek(tenant, batch_id)
        )

    def _peek(self, tenant: str, batch_id: str) -> BatchRecord | None:
        item = self.items.get((tenant, batch_id))
        return BatchRecord.model_validate(copy.deepcopy(item)) if item is not None else None

    def budget_used(self, tenant: str, period_sk: str) -> Spent:
        self._op("budget_used")
        return self.budgets.get((tenant, period_sk), Spent())

    def charge(self, tenant: str, period_sk: str, **tokens: int) -> None:
        """Test setup: add ``tokens`` (by kind) to a budget item (no fault)."""
        spent = self.budgets.get((tenant, period_sk), Spent())
        self.budgets[(tenant, period_sk)] = Spent(**{k: getattr(spent, k) + tokens.get(k, 0) for k in BUDGET_KINDS})

    def enqueued(self, tenant: str, model: str) -> tuple[int, int]:
        self._op("enqueued")
        counter = self.counters.get((tenant, model), {"requests": 0, "tokens": 0})
        return counter["requests"], counter["tokens"]

    def count_chunk(self, marker: ChunkRecord) -> bool:
        self._op("count_chunk")
        key = (marker.tenant, marker.batch_id, marker.chunk)
        if marker.count_shards > 1:
            shard = self.shards.get((marker.tenant, marker.batch_id, shard_of(marker.chunk, marker.count_shards)))
            if key in self.markers or not _matches(shard, {"accepting": True}):
                return False
            assert shard is not None
            shard.update(_apply(shard, {}, {}, marker.batch_counters(), ()))
        else:
            item = self.items.get((marker.tenant, marker.batch_id))
            if key in self.markers or not _matches(item, {"accepting": True}):
                return False
            change = Change(add=marker.batch_counters(), expect={"accepting": True})
            self._write(marker.tenant, marker.batch_id, change, ())
        self.markers[key] = marker
        return True

    def open_shards(self, shards: Sequence[CountShardRecord]) -> None:
        self._op("open_shards")
        for s in shards:
            self.shards.setdefault((s.tenant, s.batch_id, s.shard), s.model_dump())

    def count_shard(self, tenant: str, batch_id: str, shard: int) -> CountShardRecord | None:
        self._op("count_shard")
        item = self.shards.get((tenant, batch_id, shard))
        return CountShardRecord.model_validate(copy.deepcopy(item)) if item is not None else None

    def count_shards(self, batch: BatchRecord) -> list[CountShardRecord]:
        self._op("count_shards")
        keys = [(batch.tenant, batch.id, s) for s in range(len(batch.shard_keys()))]
        return [CountShardRecord.model_validate(copy.deepcopy(self.shards[k])) for k in keys if k in self.shards]

    def fold_shard(self, shard: CountShardRecord) -> bool:
        self._op("fold_shard")
        stored = self.shards.get((shard.tenant, shard.batch_id, shard.shard))
        item = self.items.get((shard.tenant, shard.batch_id))
        if not shard.all_counted:
            return False
        if not _matches(stored, {"folded": None, "chunks_done": shard.chunks_done}) or not _matches(
            item, {"accepting": True}
        ):
            return False
        assert stored is not None
        self._write(shard.tenant, shard.batch_id, Change(add=shard.counters(), expect={"accepting": True}), ())
        stored["folded"] = True
        return True

    def close_shards(self, batch: BatchRecord, *, accepting: bool) -> None:
        self._op("close_shards")
        for s in range(len(batch.shard_keys())):
            if (shard := self.shards.get((batch.tenant, batch.id, s))) is not None:
                shard["starting"] = False
                shard["accepting"] = shard["accepting"] and accepting

    def counted_chunk(self, tenant: str, batch_id: str, chunk: int, shards: int = 1) -> ChunkRecord | None:
        self._op("counted_chunk")
        return self.markers.get((tenant, batch_id, chunk))

    def count_markers(self, chunks: Sequence[tuple[str, str, int, int]]) -> dict[tuple[str, str, int], ChunkRecord]:
        self._op("count_markers")
        return {
            (t, b, c): self.markers[(t, b, c)].model_copy(deep=True)
            for t, b, c, _ in chunks
            if (t, b, c) in self.markers
        }

    def chunk_state(
        self, tenant: str, batch_id: str, chunk: int, shards: int = 1
    ) -> tuple[ChunkRecord | None, ChunkRunRecord | None]:
        self._op("chunk_state")
        marker, run = self.markers.get((tenant, batch_id, chunk)), self.runs.get((tenant, batch_id, chunk))
        return (
            marker.model_copy(deep=True) if marker is not None else None,
            run.model_copy(deep=True) if run is not None else None,
        )

    def counted_chunks(self, tenant: str, batch_id: str, shards: int = 1) -> dict[int, ChunkRecord]:
        self._op("counted_chunks")
        return {c: m for (t, b, c), m in self.markers.items() if (t, b) == (tenant, batch_id)}

    def chunk_states(
        self, tenant: str, batch_id: str, shards: int = 1
    ) -> tuple[dict[int, ChunkRecord], dict[int, ChunkRunRecord]]:
        self._op("chunk_states")
        return (
            {c: m.model_copy(deep=True) for (t, b, c), m in self.markers.items() if (t, b) == (tenant, batch_id)},
            {c: r.model_copy(deep=True) for (t, b, c), r in self.runs.items() if (t, b) == (tenant, batch_id)},
        )

    def chunk_progress(self, batch: BatchRecord) -> ChunkProgress:
        self._op("chunk_progress")
        if batch.count_shards > 1:
            counters = [
                Counted.model_validate(i) for (t, b, _), i in self.shards.items() if (t, b) == (batch.tenant, batch.id)
            ]
        else:
            counters = [batch]
        counted = set().union(*(c.counted_chunks or () for c in counters))
        if any(c.unlisted_chunks() for c in counters):
            counted |= {c for (t, b, c) in self.markers if (t, b) == (batch.tenant, batch.id)}
        return ChunkProgress(
            counted=(sum(c.completed for c in counters), sum(c.failed for c in counters)),
            checkpointed={
                c: r.checkpointed()
                for (t, b, c), r in self.runs.items()
                if (t, b) == (batch.tenant, batch.id) and c not in counted
            },
        )

    def chunk_run(self, tenant: str, batch_id: str, chunk: int, shards: int = 1) -> ChunkRunRecord | None:
        self._op("chunk_run")
        record = self.runs.get((tenant, batch_id, chunk))
        return record.model_copy(deep=True) if record is not None else None

    def save_chunk_run(
        self, record: ChunkRunRecord, *, starting: bool = False, over: ChunkRunRecord | None = None
    ) -> None:
        self._op("save_chunk_run")
        key = (record.tenant, record.batch_id, record.chunk)
        if starting:
            if record.count_shards > 1:
                shard = self.shards.get((record.tenant, record.batch_id, shard_of(record.chunk, record.count_shards)))
                open_ = _matches(shard, {"starting": True})
            else:
                open_ = _matches(
                    self.items.get((record.tenant, record.batch_id)),
                    {"status": lifecycle.TAKES_CHUNKS, "accepting": True},
                )
            if not open_:
                raise ChunksStopped("the batch takes no new chunks")
        stored = self.runs.get(key)
        if (stored.version if stored is not None else 0) != record.version - 1:
            raise condition_failed()
        self.runs[key] = record.model_copy(deep=True)

    def open_batches(self) -> list[tuple[str, str]]:
        """As the sparse index: every batch not terminal, by expiry."""
        self._op("open_batches")
        from functions.core.wire import TERMINAL_STATUSES

        open_items = [i for i in self.items.values() if i["status"] not in TERMINAL_STATUSES]
        return [
            (i["tenant"], i["id"]) for i in sorted(open_items, key=lambda i: (i["expires_at"], i["tenant"], i["id"]))
        ]


# --- Queues, workflows, events ----------------------------------------------------------------
@dataclass
class _Message:
    id: str
    body: str
    receives: int = 0
    visible: bool = True
    receipt: str = ""
    #: The delay a release asked for (the fake makes it visible at once; tests read this).
    released_after: int | None = None


class FakeQueue(_Port):
    name = "queue"
    _ids = itertools.count(1)

    def __init__(self, faults: Faults, url: str):
        super().__init__(faults)
        self.url = url
        self.messages: list[_Message] = []
        self.deleted: list[str] = []
        self.extended: list[tuple[str, int]] = []
        self._drop = 0
        self._duplicate = 0

    # Faults particular to queues.
    def drop_next(self, n: int = 1) -> None:
        """The next ``n`` sent messages are acknowledged but never delivered (a lost message)."""
        self._drop += n

    def duplicate_next(self, n: int = 1) -> None:
        """The next ``n`` sent messages are delivered twice (at-least-once delivery)."""
        self._duplicate += n

    def send(self, bodies: list[str]) -> None:
        self._op("send")
        for body in bodies:
            if self._drop:
                self._drop -= 1
                continue
            copies = 2 if self._duplicate else 1
            if self._duplicate:
                self._duplicate -= 1
            for _ in range(copies):
                self.messages.append(_Message(id=f"m-{next(self._ids)}", body=body))

    def bodies(self) -> list[str]:
        """Bodies of the messages still in the queue (visible or not)."""
        return [m.body for m in self.messages]

    def receive(self, max_messages: int, wait_seconds: int, visibility_seconds: int) -> list[Received]:
        self._op("receive")
        out = []
        for m in self.messages:
            if len(out) == max(1, min(10, max_messages)):
                break
            if m.visible:
                m.visible, m.receives = False, m.receives + 1
                m.receipt = f"{m.id}#{m.receives}"
                out.append(Received(m.id, m.receipt, m.body, m.receives))
        return out

    def _by_receipt(self, receipt: str) -> _Message | None:
        return next((m for m in self.messages if m.receipt == receipt and not m.visible), None)

    def extend(self, receipt: str, seconds: int) -> bool:
        self._op("extend")
        self.extended.append((receipt, seconds))
        return self._by_receipt(receipt) is not None

    def release(self, receipt: str, after_seconds: int = 0) -> bool:
        self._op("release")
        m = self._by_receipt(receipt)
        if m is None:
            return False
        m.visible, m.released_after = True, after_seconds
        return True

    def delete(self, receipt: str) -> None:
        self._op("delete")
        m = next((m for m in self.messages if m.receipt == receipt), None)
        if m is not None:
            self.messages.remove(m)
            self.deleted.append(m.body)


class FakeQueues:
    def __init__(self, faults: Faults):
        self._faults = faults
        self.by_url: dict[str, FakeQueue] = {}

    def queue(self, url: str) -> FakeQueue:
        if url not in self.by_url:
            self.by_url[url] = FakeQueue(self._faults, url)
        return self.by_url[url]


class FakeWorkflows(_Port):
    name = "workflows"

    def __init__(self, faults: Faults):
        super().__init__(faults)
        self.started: dict[str, dict[str, Any]] = {}
        #: Every successful signal, in order: (token, output).
        self.signals: list[tuple[str, dict[str, Any]]] = []
        #: Tokens that no longer wait (resumed, timed out); signalling one returns False.
        self.closed: set[str] = set()

    def start(self, name: str, payload: dict[str, Any]) -> None:
        self._op("start")
        self.started.setdefault(name, payload)

    def signal(self, token: str, output: dict[str, Any]) -> bool:
        self._op("signal")
        if token in self.closed:
            return False
        self.signals.append((token, output))
        return True


class FakeEvents(_Port):
    name = "events"

    def __init__(self, faults: Faults):
        super().__init__(faults)
        self.published: list[tuple[str, dict[str, Any]]] = []

    def publish(self, detail_type: str, detail: dict[str, Any]) -> None:
        self._op("publish")
        self.published.append((detail_type, detail))

    def types(self) -> list[str]:
        return [t for t, _ in self.published]


@dataclass(frozen=True)
class FakeStores(Stores):
    """``Stores`` of fakes, plus the shared fault plan."""

    faults: Faults = field(default_factory=Faults)


def fake_stores(*, track_storage: bool = True) -> FakeStores:
    """``track_storage``: the stores keep the stored-bytes ledger (governance on, the default)."""
    faults = Faults()
    stored = FakeStored(faults, track=track_storage)
    files = FakeFiles(faults, stored)
    objects, batches = FakeObjects(faults), FakeBatches(faults, files)
    audit = FakeAuditLog(faults, batches, objects)
    tenants = FakeTenants(faults)
    return FakeStores(
        objects=objects,
        files=files,
        uploads=FakeUploads(faults, files),
        keys=FakeKeys(faults, tenants),
        batches=batches,
        queues=FakeQueues(faults),
        workflows=FakeWorkflows(faults),
        events=FakeEvents(faults),
        tenants=tenants,
        stored=stored,
        audit_log=audit,
        faults=faults,
    )


class FakeWorm(_Port):
    """``WormStore``: write-once keys, as S3 conditional PUTs (If-None-Match: *) on an Object Lock
    bucket, each key with its versions. ``overwrite`` and ``hide`` play a tamperer with PutObject
    without If-None-Match (a new version) or DeleteObject (a delete marker), which the bucket
    policy refuses and Object Lock cannot: the first version stays, and ``originals`` shows both."""

    name = "worm"

    def __init__(self, faults: Faults | None = None):
        super().__init__(faults or Faults())
        self.versions: dict[str, list[bytes]] = {}
        self.hidden: set[str] = set()

    @property
    def objects(self) -> dict[str, bytes]:
        """The current bytes of each key not hidden."""
        return {k: v[-1] for k, v in self.versions.items() if k not in self.hidden}

    def put_once(self, key: str, body: bytes) -> bool:
        self._op("put_once")
        if key in self.versions and key not in self.hidden:
            return False
        self.versions.setdefault(key, []).append(bytes(body))
        self.hidden.discard(key)
        return True

    def find(self, key: str) -> bytes | None:
        self._op("find")
        return self.objects.get(key)

    def any_after(self, prefix: str, key: str) -> bool:
        self._op("any_after")
        return any(k.startswith(prefix) and k > key for k in self.objects)

    def originals(self, prefix: str) -> dict[str, Any]:
        from functions.core.anchor import WormObject

        self._op("originals")
        return {
            k: WormObject(body=v[0], versions=len(v), hidden=k in self.hidden)
            for k, v in sorted(self.versions.items())
            if k.startswith(prefix)
        }

    def overwrite(self, key: str, body: bytes) -> None:
        self.versions.setdefault(key, []).append(bytes(body))
        self.hidden.discard(key)

    def hide(self, key: str) -> None:
        self.hidden.add(key)
