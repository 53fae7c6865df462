"""A tamper-evident audit chain per tenant (docs/audit.md).

Every record carries its tenant's sequence number (1, 2, 3...), the previous record's hash and its
own hash: sha256 over the canonical JSON (sorted keys, no spaces, UTF-8) of every other field. A
record is written only if its sequence number is still free (a conditional write), so two
concurrent writers cannot fork the chain: the loser re-reads the head and tries again. ``verify``
re-walks a chain and names the first broken link: an edited record (its hash no longer matches),
a deleted one (a gap in the sequence, or a prev_hash that does not match), a reordered pair.

Logic takes the ``AuditStore`` port; the DynamoDB adapter is ``functions.core.aws.audit``.
"""

from __future__ import annotations

import hashlib
import json
import random
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Final

from pydantic import BaseModel, ConfigDict, Field

from . import schema
from .errors import ConditionFailed, Throttled
from .messages import WorkMessage
from .ports import AuditStore, Stores
from .records import ChunkRecord

#: The prev_hash of a chain's first record.
GENESIS: Final = "0" * 64
#: Attempts of one append when other writers keep taking the next sequence number.
APPEND_ATTEMPTS: Final = 20
#: Full-jitter backoff between attempts: a random wait in [0, min(cap, base * 2**(n-1))).
BACKOFF_BASE_SECONDS: Final = 0.01
BACKOFF_CAP_SECONDS: Final = 0.5
#: The action of a per-chunk receipt, and its dedupe key (one receipt per counted chunk).
CHUNK_RECEIPT: Final = "chunk.receipt"
#: The actor of records the operator's tools write (``batchctl``), and of the worker's receipts.
OPERATOR: Final = "operator"
WORKER: Final = "worker"


def receipt_key(batch_id: str, chunk: int) -> str:
    """The dedupe key of a chunk receipt: a chunk is counted once, so it gets one receipt."""
    return f"{CHUNK_RECEIPT}:{batch_id}:{chunk:06d}"


class AuditRecord(BaseModel):
    """One link of a tenant's chain."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    tenant: str
    seq: int = Field(ge=1)
    #: Unix seconds.
    at: int
    #: ``key:<first 12 hex of the key's sha256>``, ``operator`` or ``worker``.
    actor: str
    #: ``files.create``, ``batches.cancel``, ``keys.create``, ``tenants.set``, ``chunk.receipt``...
    action: str
    target: str | None = None
    request_id: str | None = None
    #: The HTTP status (``"200"``, ``"429"``) or ``ok``.
    outcome: str
    details: dict[str, Any] = Field(default_factory=dict)
    prev_hash: str
    hash: str

    def body(self) -> dict[str, Any]:
        """Every field but ``hash``."""
        return self.model_dump(mode="json", exclude={"hash"})

    def computed_hash(self) -> str:
        return chain_hash(self.body())

    def to_json(self) -> str:
        """The record as one canonical JSON line (what is stored and exported)."""
        return canonical(self.model_dump(mode="json"))


def canonical(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def chain_hash(body: dict[str, Any]) -> str:
    return hashlib.sha256(canonical(body).encode()).hexdigest()


def link(
    tenant: str, seq: int, prev_hash: str, *, at: int, actor: str, action: str, outcome: str,
    target: str | None = None, request_id: str | None = None, details: dict[str, Any] | None = None,
) -> AuditRecord:
    """The record ``seq`` after ``prev_hash``, with its hash."""
    body = dict(tenant=tenant, seq=seq, at=at, actor=actor, action=action, target=target,
                request_id=request_id, outcome=outcome, details=details or {}, prev_hash=prev_hash)
    # Through the model once, so the hash covers exactly what the model serializes.
    draft = AuditRecord(**body, hash=GENESIS)
    return draft.model_copy(update={"hash": draft.computed_hash()})


def append(
    store: AuditStore,
    tenant: str,
    *,
    at: int,
    actor: str,
    action: str,
    outcome: str,
    target: str | None = None,
    request_id: str | None = None,
    details: dict[str, Any] | None = None,
    dedupe: str | None = None,
    attempts: int = APPEND_ATTEMPTS,
    sleep: Callable[[float], None] = time.sleep,
) -> AuditRecord | None:
    """Append one record at the head of ``tenant``'s chain and return it.

    With ``dedupe``, the record is written in one transaction with a marker of that key, so
    appending it again (a retried caller) writes nothing and returns None. Raises ``Throttled``
    when other writers took the next sequence number ``attempts`` times in a row."""
    for attempt in range(1, attempts + 1):
        if dedupe is not None and store.deduped(tenant, dedupe):
            return None
        head = store.head(tenant)
        record = link(
            tenant, head.seq + 1 if head else 1, head.hash if head else GENESIS, at=at, actor=actor,
            action=action, outcome=outcome, target=target, request_id=request_id, details=details,
        )
        try:
            store.put(record, dedupe=dedupe)
            return record
        except ConditionFailed:  # another writer took this seq (or this dedupe key): re-read
            if attempt < attempts:
                sleep(random.random() * min(BACKOFF_CAP_SECONDS, BACKOFF_BASE_SECONDS * 2 ** (attempt - 1)))
    raise Throttled(f"audit chain of tenant {tenant!r}: {attempts} appends lost to concurrent writers")


@dataclass(frozen=True)
class BrokenLink:
    """The first record of a chain that does not hold: ``position`` (1-based) in the walk, the
    ``seq`` it carries, and why."""

    position: int
    seq: int
    reason: str

    def __str__(self) -> str:
        return f"record #{self.position} (seq {self.seq}): {self.reason}"


def verify(records: Iterable[AuditRecord]) -> BrokenLink | None:
    """Walk a chain in its stored order; the first broken link, or None if every link holds."""
    prev = GENESIS
    for position, record in enumerate(records, start=1):
        if record.seq != position:
            return BrokenLink(
                position, record.seq, f"expected seq {position}, found {record.seq}: a record deleted or moved"
            )
        if record.prev_hash != prev:
            return BrokenLink(position, record.seq, "prev_hash does not match the previous record's hash")
        if record.computed_hash() != record.hash:
            return BrokenLink(position, record.seq, "hash does not match its content (edited)")
        prev = record.hash
    return None


# --- the WORM copy (docs/audit.md, "WORM copy") ----------------------------------------------
#: Where the stream-driven export (functions/audit_export) writes each record in the Object Lock
#: bucket: ``chain/<tenant>/<seq, 12 digits>.json``, the record's canonical JSON (``to_json``).
WORM_PREFIX: Final = "chain/"


def worm_key(tenant: str, seq: int) -> str:
    return f"{WORM_PREFIX}{tenant}/{seq:012d}.json"


def worm_prefix(tenant: str) -> str:
    return f"{WORM_PREFIX}{tenant}/"


@dataclass(frozen=True)
class CopyCheck:
    """The table's chain against its WORM copies: the first record that differs from its copy, or
    whose copy exists but which the table no longer has (deleted, or the tail truncated), and how
    many of the table's records have no copy yet (export lag, not a break)."""

    broken: BrokenLink | None
    copies: int
    not_copied: int


def compare_with_copies(records: list[AuditRecord], copies: dict[int, str]) -> CopyCheck:
    """``copies``: seq -> the stored copy's JSON. A table that was rewritten from some record on
    (every hash recomputed, so ``verify`` passes) still differs from the copies written when the
    records were first appended, which nobody can change."""
    table = {r.seq: r for r in records}
    for position, seq in enumerate(sorted(copies), start=1):
        record = table.get(seq)
        if record is None:
            return CopyCheck(BrokenLink(position, seq, "in the WORM copy but not in the table: deleted"),
                             len(copies), 0)
        if record.to_json() != copies[seq]:
            return CopyCheck(BrokenLink(position, seq, "differs from its WORM copy: rewritten"), len(copies), 0)
    return CopyCheck(None, len(copies), sum(1 for seq in table if seq not in copies))


# --- what the API appends --------------------------------------------------------------------
#: (method, route) of every audited API action: the mutating ones. Reads are not audited (docs/audit.md).
API_ACTIONS: Final = {
    ("POST", "/v1/files"): "files.create",
    ("DELETE", "/v1/files/<file_id>"): "files.delete",
    ("POST", "/v1/uploads"): "uploads.create",
    ("POST", "/v1/uploads/<upload_id>/parts"): "uploads.add_part",
    ("POST", "/v1/uploads/<upload_id>/complete"): "uploads.complete",
    ("POST", "/v1/uploads/<upload_id>/cancel"): "uploads.cancel",
    ("POST", "/v1/batches"): "batches.create",
    ("POST", "/v1/batches/<batch_id>/cancel"): "batches.cancel",
}


def api_action(method: str, path: str) -> tuple[str, str | None] | None:
    """(action, target id in the path) of an API request, or None if it is not audited."""
    segments = [s for s in path.split("/") if s]
    for (verb, route), action in API_ACTIONS.items():
        pattern = [s for s in route.split("/") if s]
        if verb != method.upper() or len(pattern) != len(segments):
            continue
        target = None
        for want, got in zip(pattern, segments):
            if want.startswith("<"):
                target = got
            elif want != got:
                break
        else:
            return action, target
    return None


#: How many hex digits of a key's sha256 name it as an actor (the stored key hash starts with them).
ACTOR_KEY_HEX: Final = 12


def key_actor(authorization: str | None) -> str:
    """The actor of an API request: ``key:`` + the first hex digits of its key's sha256 (the same
    hash the key store keys on, so an operator can find the key; never the key itself)."""
    scheme, _, token = (authorization or "").strip().partition(" ")
    token = token.strip() if scheme.lower() == "bearer" else ""
    return f"key:{hashlib.sha256(token.encode()).hexdigest()[:ACTOR_KEY_HEX]}" if token else "key:none"


def record_api_request(
    store: AuditStore, tenant: str, *, method: str, path: str, status: int, body: str | None,
    authorization: str | None, request_id: str | None, at: int,
) -> AuditRecord | None:
    """Append the record of one API request if its action is audited (None otherwise): the
    target is the id in the path, else the id the answer names (a create); a refusal carries its
    error code. API Gateway does not retry a Lambda proxy integration, so no dedupe key."""
    found = api_action(method, path)
    if found is None:
        return None
    action, target = found
    details: dict[str, Any] = {}
    try:
        answer = json.loads(body) if body else None
    except ValueError:
        answer = None
    if isinstance(answer, dict):
        if status < 400 and target is None and isinstance(answer.get("id"), str):
            target = answer["id"]
        error = answer.get("error")
        if status >= 400 and isinstance(error, dict):
            details = {"error_code": error.get("code"), "error_type": error.get("type")}
    return append(store, tenant, at=at, actor=key_actor(authorization), action=action, outcome=str(status),
                  target=target, request_id=request_id, details=details)


def append_receipt(stores: Stores, message: WorkMessage, marker: ChunkRecord, *, at: int,
                   digests: dict[str, str] | None = None) -> AuditRecord | None:
    """The receipt of a counted chunk (``marker``): its batch, chunk, input lines, the sha256 of
    each result part of the counted attempt (the bytes the batch's output and error files are
    made of), its counts and usage. Keyed on (batch, chunk): a chunk is counted once, so however
    often this runs (a redelivered message, a retried worker) the chain holds one receipt. None
    if already there, or if these stores append no receipts (``Stores.receipts`` None).
    ``digests``: the parts' sha256 as the counting worker wrote them (``Parts.digests``); without
    them (a redelivery re-signalling, the DLQ consumer) the parts are read back and hashed."""
    if stores.receipts is None:
        return None
    key = receipt_key(marker.batch_id, marker.chunk)
    if not digests:
        # Reading the parts back costs a LIST and two GETs: not for a receipt already there.
        # (With the digests at hand, ``append``'s own dedupe check is the only read.)
        if stores.receipts.deduped(marker.tenant, key):
            return None
        parts = {
            kind: schema.chunk_part_key(marker.tenant, marker.batch_id, marker.chunk, marker.attempt, kind)
            for kind in ("out", "err")
        }
        # One LIST of the attempt's parts, then a GET of each (a part that is not there: null).
        stored = set(stores.objects.list_keys(parts["out"].rsplit(".", 2)[0] + "."))
        digests = {
            f"{kind}_sha256": hashlib.sha256(stores.objects.get(key)).hexdigest() if key in stored else None
            for kind, key in parts.items()
        }
    details = {
        "batch": marker.batch_id, "chunk": marker.chunk, "attempt": marker.attempt,
        "first_line": message.first_line, "line_count": message.line_count,
        "completed": marker.completed, "failed": marker.failed, **digests,
        "usage": {k: getattr(marker, k) for k in ("input_tokens", "cached_tokens", "output_tokens", "reasoning_tokens")},
    }
    return append(stores.receipts, marker.tenant, at=at, actor=WORKER, action=CHUNK_RECEIPT, outcome="ok",
                  target=marker.batch_id, details=details, dedupe=key)
