"""A tamper-evident audit chain per tenant (docs/audit.md).

Every record carries its tenant's sequence number (1, 2, 3...), the previous record's hash and its
own hash: sha256 over the canonical JSON (sorted keys, no spaces, UTF-8) of every other field. A
record is written only if its sequence number is still free (a conditional write), so two
concurrent writers cannot fork the chain: the loser re-reads the head and tries again. ``verify``
re-walks a chain and names the first broken link: an edited record (its hash no longer matches),
a deleted one (a gap in the sequence, or a prev_hash that does not match), a reordered pair.

Writers never append themselves: each sends an ``AuditIntent`` (what happened, for which tenant,
with a dedupe key) through the ``AuditLog`` port to the audit queue, and the audit appender
(``functions/audit_append``), the one role that may write the chains, turns intents into records,
copies each to the WORM bucket and signs checkpoints of the heads (``functions.core.anchor``).

Logic takes the ``AuditStore`` and ``AuditLog`` ports; the DynamoDB adapter is
``functions.core.aws.audit``, the queue's ``functions.core.aws.sqs.SqsAuditLog``.
"""

from __future__ import annotations

import hashlib
import json
import random
import time
import uuid
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Final

from pydantic import BaseModel, ConfigDict, Field, field_validator

from .budgets import Charge
from .errors import ConditionFailed, Throttled
from .messages import WorkMessage
from .ports import AuditLog, AuditStore, Stores
from .records import ChunkRecord, check_tenant

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
#: The longest dedupe key an intent may carry (DynamoDB sort keys take 1 KiB; ours stay far below).
DEDUPE_MAX_CHARS: Final = 200


def receipt_key(batch_id: str, chunk: int) -> str:
    """The dedupe key of a chunk receipt: a chunk is counted once, so it gets one receipt."""
    return f"{CHUNK_RECEIPT}:{batch_id}:{chunk:06d}"


def api_key(request_id: str) -> str:
    """The dedupe key of an API action: API Gateway's request id, unique per request (a client's
    retry is a new request, which the chain shows)."""
    return f"api:{request_id}"


def operator_key() -> str:
    """The dedupe key of an operator's change: a fresh uuid per ``batchctl`` run of the change."""
    return f"operator:{uuid.uuid4().hex}"


class Content(BaseModel):
    """What happened: the fields a record and the intent asking for it share."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    tenant: str
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

    def content(self) -> dict[str, Any]:
        """The ``Content`` fields only, as JSON values."""
        return self.model_dump(mode="json", include=set(Content.model_fields))


class AuditRecord(Content):
    """One link of a tenant's chain."""

    seq: int = Field(ge=1)
    prev_hash: str
    hash: str

    def body(self) -> dict[str, Any]:
        """Every field but ``hash``."""
        return self.model_dump(mode="json", exclude={"hash"})

    def computed_hash(self) -> str:
        return chain_hash(self.body())

    def to_json(self) -> str:
        """The record as one canonical JSON line (what is stored and copied)."""
        return canonical(self.model_dump(mode="json"))


class AuditIntent(Content):
    """What a writer asks the appender to record: a record's content and a dedupe key, so that
    however often the audit queue delivers it, the chain holds it once."""

    dedupe: str = Field(min_length=1, max_length=DEDUPE_MAX_CHARS)

    _check_tenant = field_validator("tenant")(classmethod(lambda cls, v: check_tenant(v)))


def canonical(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def chain_hash(body: dict[str, Any]) -> str:
    return hashlib.sha256(canonical(body).encode()).hexdigest()


def link(
    tenant: str,
    seq: int,
    prev_hash: str,
    *,
    at: int,
    actor: str,
    action: str,
    outcome: str,
    target: str | None = None,
    request_id: str | None = None,
    details: dict[str, Any] | None = None,
) -> AuditRecord:
    """The record ``seq`` after ``prev_hash``, with its hash."""
    body: dict[str, Any] = dict(
        tenant=tenant,
        seq=seq,
        at=at,
        actor=actor,
        action=action,
        target=target,
        request_id=request_id,
        outcome=outcome,
        details=details or {},
        prev_hash=prev_hash,
    )
    # Through the model once, so the hash covers exactly what the model serializes.
    draft = AuditRecord(**body, hash=GENESIS)
    return draft.model_copy(update={"hash": draft.computed_hash()})


#: Where the next record goes, given the chain's head: (seq, prev_hash). The default follows the
#: head; the appender also skips seqs its WORM copy already holds (a cut tail).
Position = Callable[["AuditRecord | None"], tuple[int, str]]


def after(head: AuditRecord | None) -> tuple[int, str]:
    return (head.seq + 1, head.hash) if head else (1, GENESIS)


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
    charge: Charge | None = None,
    position: Position = after,
    known_new: bool = False,
    attempts: int = APPEND_ATTEMPTS,
    sleep: Callable[[float], None] = time.sleep,
) -> AuditRecord | None:
    """Append one record at the head of ``tenant``'s chain and return it (only the audit
    appender calls this on a deployment: no other role may write the chains).

    With ``dedupe``, the record is written in one transaction with a marker of that key (which
    remembers the record's seq), so appending it again writes nothing and returns None
    (``known_new``: the caller has just read that the key is new, so the first attempt does not
    read it again). ``charge``: a budget charge written in the same transaction (a chunk receipt's;
    needs ``dedupe``, so it is charged once). Raises ``Throttled`` when other writers took the next sequence number
    ``attempts`` times in a row."""
    for attempt in range(1, attempts + 1):
        if dedupe is not None and not (known_new and attempt == 1) and store.dedupe_seq(tenant, dedupe) is not None:
            return None
        seq, prev_hash = position(store.head(tenant))
        record = link(
            tenant,
            seq,
            prev_hash,
            at=at,
            actor=actor,
            action=action,
            outcome=outcome,
            target=target,
            request_id=request_id,
            details=details,
        )
        try:
            store.put(record, dedupe=dedupe, charge=charge)
            return record
        except ConditionFailed:  # another writer took this seq (or this dedupe key): re-read
            if attempt < attempts:
                sleep(random.random() * min(BACKOFF_CAP_SECONDS, BACKOFF_BASE_SECONDS * 2 ** (attempt - 1)))
    raise Throttled(f"audit chain of tenant {tenant!r}: {attempts} appends lost to concurrent writers")


def append_intent(
    store: AuditStore,
    intent: AuditIntent,
    *,
    charge: Charge | None = None,
    position: Position = after,
    known_new: bool = False,
    sleep: Callable[[float], None] = time.sleep,
) -> AuditRecord | None:
    """``append`` of an intent's content under its dedupe key."""
    fields = intent.content()
    tenant = fields.pop("tenant")
    return append(
        store,
        tenant,
        **fields,
        dedupe=intent.dedupe,
        charge=charge,
        position=position,
        known_new=known_new,
        sleep=sleep,
    )


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


# --- what the API records --------------------------------------------------------------------
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
        for want, got in zip(pattern, segments, strict=True):
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


def api_intent(
    tenant: str,
    *,
    method: str,
    path: str,
    status: int,
    body: str | None,
    authorization: str | None,
    request_id: str | None,
    at: int,
) -> AuditIntent | None:
    """The intent of one API request if its action is audited (None otherwise): the target is the
    id in the path, else the id the answer names (a create); a refusal carries its error code.
    Keyed on the request id (a fresh uuid where there is none)."""
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
    return AuditIntent(
        tenant=tenant,
        at=at,
        actor=key_actor(authorization),
        action=action,
        outcome=str(status),
        target=target,
        request_id=request_id,
        details=details,
        dedupe=api_key(request_id or uuid.uuid4().hex),
    )


def record_api_request(log: AuditLog, tenant: str, **request: Any) -> AuditIntent | None:
    """Send the intent of one API request (``api_intent``) if its action is audited."""
    intent = api_intent(tenant, **request)
    if intent is not None:
        log.record(intent)
    return intent


def operator_intent(
    tenant: str, action: str, *, at: int, target: str | None = None, details: dict[str, Any] | None = None
) -> AuditIntent:
    """An operator's change (``batchctl keys|tenants``), keyed on a fresh uuid."""
    return AuditIntent(
        tenant=tenant,
        at=at,
        actor=OPERATOR,
        action=action,
        outcome="ok",
        target=target,
        details=details or {},
        dedupe=operator_key(),
    )


#: What a receipt's sender names beside the chunk: its input lines and the parts' digests. The
#: counts, usage and attempt the appender reads from the chunk's count marker itself.
RECEIPT_DIGESTS: Final = ("out_sha256", "err_sha256")


def receipt_intent(
    message: WorkMessage, marker: ChunkRecord, *, at: int, digests: Mapping[str, str | None] | None = None
) -> AuditIntent:
    """The receipt of a counted chunk (``marker``): its batch, chunk and input lines, and the
    sha256 of each result part of the counted attempt when the sender has them (the counting
    worker computed them while writing the parts, ``Parts.digests``); without them the appender
    reads the parts back and hashes them."""
    details: dict[str, Any] = {
        "batch": marker.batch_id,
        "chunk": marker.chunk,
        "first_line": message.first_line,
        "line_count": message.line_count,
    }
    if marker.count_shards > 1:  # where the appender finds the marker
        details["count_shards"] = marker.count_shards
    if digests:
        details |= {name: digests.get(name) for name in RECEIPT_DIGESTS}
    return AuditIntent(
        tenant=marker.tenant,
        at=at,
        actor=WORKER,
        action=CHUNK_RECEIPT,
        outcome="ok",
        target=marker.batch_id,
        details=details,
        dedupe=receipt_key(marker.batch_id, marker.chunk),
    )


def append_receipt(
    stores: Stores,
    message: WorkMessage,
    marker: ChunkRecord,
    *,
    at: int,
    digests: Mapping[str, str | None] | None = None,
) -> AuditIntent | None:
    """Send the receipt of a counted chunk (``receipt_intent``) to the audit queue; keyed on
    (batch, chunk), so however often this runs (a redelivered message, a retried worker) the
    chain holds one receipt. None if these stores record no receipts (``Stores.audit_log`` None)."""
    if stores.audit_log is None:
        return None
    intent = receipt_intent(message, marker, at=at, digests=digests)
    stores.audit_log.record(intent)
    return intent
