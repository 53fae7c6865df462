"""The audit appender (docs/audit.md): the one role that writes the tenants' audit chains. It
takes the intents every other role sends to the audit queue and, per intent:

1. if its dedupe key was appended before (a redelivery), finds that record again (the marker
   holds its seq) and only makes sure its WORM copy exists: the copy may be what a crash between
   the append and the copy left undone;
2. otherwise builds the record on the chain's head and appends it (conditional write of the seq,
   with the dedupe marker, in one transaction), past any seq the WORM copy already holds (a tail
   cut from the table is not written over: the chain goes on from the copy, and the cut shows);
3. writes the record's WORM copy (``anchor.worm_key``, once: If-None-Match).

After the batch it signs one checkpoint per tenant it appended to (the last record it appended or
confirmed for that tenant) and writes it to ``anchor.checkpoint_key`` (once). A chunk receipt is
built from the chunk's count marker, read here (its attempt, counts, usage and time), never from
the sender's numbers; only its input lines and part digests come from the message (and the
digests are computed here from the parts when the sender had none). The receipt's append also
charges the tenant's token budget from that marker (``ChunkRecord.budget_charge``), in the same
transaction: a chunk is charged exactly once, by this role alone.

Logic takes its stores (``AppenderStores``); the handler builds them.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

from functions.core import anchor, audit, limits, schema
from functions.core.anchor import Checkpoint
from functions.core.audit import AuditIntent, AuditRecord
from functions.core.budgets import Charge
from functions.core.ports import AuditStore, BatchStore, Objects, Signer, WormStore

#: A sha256 hex digest.
_HEX = frozenset("0123456789abcdef")


@dataclass(frozen=True)
class AppenderStores:
    chain: AuditStore
    worm: WormStore
    signer: Signer
    #: The chunk count markers a receipt is built from (read only).
    batches: BatchStore
    #: The chunk parts a receipt without digests hashes (read only).
    objects: Objects


Outcome = Literal["appended", "duplicate", "refused", "conflict"]


@dataclass(frozen=True)
class Taken:
    """What one intent came to. ``appended``: a new record (``record``), copied; ``duplicate``:
    appended before, its copy made sure of; ``refused``: nothing appended (``reason``; a retry
    cannot help); ``conflict``: the record's WORM copy holds other bytes (``reason``: the table
    was changed under the appender), so no checkpoint covers it. ``skipped``: seqs the WORM copy
    already held past the table's head (a cut tail), which the record was appended after."""

    outcome: Outcome
    record: AuditRecord | None = None
    reason: str = ""
    skipped: tuple[int, ...] = ()


def _digest(value: Any) -> bool:
    return isinstance(value, str) and len(value) == 64 and set(value) <= _HEX


def _part_digests(objects: Objects, tenant: str, batch_id: str, chunk: int, attempt: str) -> dict[str, str | None]:
    """The sha256 of the attempt's two parts, read back (a part that is not there: null)."""
    keys = {kind: schema.chunk_part_key(tenant, batch_id, chunk, attempt, kind) for kind in ("out", "err")}
    stored = set(objects.list_keys(keys["out"].rsplit(".", 2)[0] + "."))
    out: dict[str, str | None] = {}
    for kind, key in keys.items():
        if key not in stored:
            out[f"{kind}_sha256"] = None
            continue
        digest = hashlib.sha256()
        for block in objects.iter_bytes(key):
            digest.update(block)
        out[f"{kind}_sha256"] = digest.hexdigest()
    return out


def _chunk_of(intent: AuditIntent) -> tuple[str, int] | None:
    batch_id, chunk = intent.details.get("batch"), intent.details.get("chunk")
    if not isinstance(batch_id, str) or not isinstance(chunk, int) or isinstance(chunk, bool):
        return None
    return batch_id, chunk


@dataclass(frozen=True)
class Receipt:
    """A chunk receipt as the appender appends it: the intent built from the count marker, and
    the budget charge its append writes (None: the chunk's batch has no budget)."""

    intent: AuditIntent
    charge: Charge | None


def receipt(stores: AppenderStores, intent: AuditIntent) -> Receipt | str:
    """The receipt as the appender records it, or why it refuses it: batch, chunk, input lines
    and digests from the sender, everything counted (and charged) from the chunk's own count
    marker."""
    named = _chunk_of(intent)
    if named is None:
        return "a receipt must name its batch and chunk"
    batch_id, chunk = named
    details = intent.details
    lines = {k: details.get(k) for k in ("first_line", "line_count")}
    if not all(isinstance(v, int) and not isinstance(v, bool) for v in lines.values()):
        return "a receipt must name its input lines"
    digests = {k: details.get(k) for k in audit.RECEIPT_DIGESTS}
    if not all(v is None or _digest(v) for v in digests.values()):
        return "a receipt's digests must be sha256 hex digests"
    shards = details.get("count_shards", 1)
    if not (isinstance(shards, int) and not isinstance(shards, bool) and 1 <= shards <= limits.MAX_COUNT_SHARDS):
        return "a receipt's count_shards must be a shard count"
    marker = stores.batches.counted_chunk(intent.tenant, batch_id, chunk, shards)
    if marker is None:
        return f"chunk {chunk} of batch {batch_id} is not counted"
    if all(v is None for v in digests.values()):
        digests = _part_digests(stores.objects, intent.tenant, batch_id, chunk, marker.attempt)
    return Receipt(
        AuditIntent(
            tenant=intent.tenant,
            at=marker.recorded_at,
            actor=audit.WORKER,
            action=audit.CHUNK_RECEIPT,
            outcome="ok",
            target=batch_id,
            dedupe=audit.receipt_key(batch_id, chunk),
            details={
                "batch": batch_id,
                "chunk": chunk,
                "attempt": marker.attempt,
                **lines,
                "completed": marker.completed,
                "failed": marker.failed,
                **digests,
                "usage": {
                    k: getattr(marker, k)
                    for k in ("input_tokens", "cached_tokens", "output_tokens", "reasoning_tokens")
                },
            },
        ),
        marker.budget_charge(),
    )


def dedupe_key(intent: AuditIntent) -> str | None:
    """The key an intent is appended under: a receipt's is its chunk's (whatever the sender
    named), so a chunk has one receipt; None for a receipt that names no chunk."""
    if intent.action != audit.CHUNK_RECEIPT:
        return intent.dedupe
    named = _chunk_of(intent)
    return audit.receipt_key(*named) if named else None


def _is_its_record(record: AuditRecord, intent: AuditIntent) -> bool:
    """Whether ``record`` is what ``intent`` was appended as (a receipt: the same chunk's receipt;
    its numbers are the marker's, not the sender's)."""
    if intent.action == audit.CHUNK_RECEIPT:
        batch_id, chunk = _chunk_of(intent) or ("", -1)
        return (record.action, record.target, record.details.get("chunk")) == (audit.CHUNK_RECEIPT, batch_id, chunk)
    return record.content() == intent.content()


class KnownHeads:
    """The chain store, with each tenant's head as this invocation last read or wrote it, so an
    append after its own reads no head. The appender is the chains' only writer and takes one
    tenant's intents in one invocation at a time (FIFO groups); should another write come between,
    the seq's conditional write refuses the stale head, which is then read again."""

    def __init__(self, chain: AuditStore):
        self._chain = chain
        self._heads: dict[str, AuditRecord | None] = {}

    def head(self, tenant: str) -> AuditRecord | None:
        if tenant not in self._heads:
            self._heads[tenant] = self._chain.head(tenant)
        return self._heads[tenant]

    def put(self, record: AuditRecord, *, dedupe: str | None = None, charge: Charge | None = None) -> None:
        try:
            self._chain.put(record, dedupe=dedupe, charge=charge)
        except Exception:
            self._heads.pop(record.tenant, None)  # refused, or not known to be written: read again
            raise
        self._heads[record.tenant] = record

    def dedupe_seq(self, tenant: str, key: str) -> int | None:
        return self._chain.dedupe_seq(tenant, key)

    def record(self, tenant: str, seq: int) -> AuditRecord | None:
        return self._chain.record(tenant, seq)

    def records(self, tenant: str) -> list[AuditRecord]:
        return self._chain.records(tenant)


@dataclass
class Invocation:
    """One invocation of the appender: takes intents (in the queue's order per tenant) and then
    checkpoints each tenant it appended to once.

    What it reads per intent is what an intent needs alone: an intent is appended at once (its
    dedupe marker is written in the same transaction, so a duplicate's append is refused and then
    found by its key), but for a receipt that was sent again (``take``); a tenant's head is read
    once (``KnownHeads``); whether WORM copies already hold the seqs past the head (a cut tail) is
    one LIST per tenant, after which this invocation's own appends are known to be the only
    copies."""

    stores: AppenderStores
    now: Callable[[], int]
    sleep: Callable[[float], None] = time.sleep
    #: Per tenant: the last record appended or confirmed, and whether a checkpoint may cover it.
    heads: dict[str, tuple[AuditRecord, bool]] = field(default_factory=dict)
    #: Per tenant: the seq from which no WORM copy existed when this invocation looked (its own
    #: copies, all below the chain's next seq, aside).
    free_from: dict[str, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.chain = KnownHeads(self.stores.chain)

    def _no_copy_from(self, tenant: str, seq: int) -> bool:
        """No WORM copy holds ``seq`` or a later seq of ``tenant``'s chain."""
        known = self.free_from.get(tenant)
        if known is not None and seq >= known:
            return True
        if self.stores.worm.any_after(anchor.worm_prefix(tenant), anchor.worm_key(tenant, seq - 1)):
            return False
        self.free_from[tenant] = seq
        return True

    def take(self, intent: AuditIntent, *, seen: bool = False) -> Taken:
        """Append ``intent``. Its dedupe key is read first only when it is likely a duplicate:
        ``seen`` (its append was just refused as one), or a receipt without digests (sent again
        after a worker died, and building it would read the chunk's parts back)."""
        key = dedupe_key(intent)
        if key is None:
            return Taken("refused", reason="a receipt must name its batch and chunk")
        chain, worm = self.chain, self.stores.worm
        resent = intent.action == audit.CHUNK_RECEIPT and all(
            intent.details.get(k) is None for k in audit.RECEIPT_DIGESTS
        )
        seq = chain.dedupe_seq(intent.tenant, key) if seen or resent else None
        skipped: list[int] = []
        if seq is not None:  # appended before: make sure of its copy
            record = chain.record(intent.tenant, seq)
            if record is None or not _is_its_record(record, intent):
                return self._note(Taken("conflict", record, f"the table's record at seq {seq} is not this intent's"))
            outcome: Outcome = "duplicate"
        else:
            charge = None
            if intent.action == audit.CHUNK_RECEIPT:
                built = receipt(self.stores, intent)
                if isinstance(built, str):
                    return Taken("refused", reason=built)
                intent, charge = built.intent, built.charge

            def position(head: AuditRecord | None) -> tuple[int, str]:
                """After the head, past every seq the WORM copy already holds (a cut tail)."""
                skipped.clear()
                seq, prev = audit.after(head)
                if self._no_copy_from(intent.tenant, seq):
                    return seq, prev
                while (copy := worm.find(anchor.worm_key(intent.tenant, seq))) is not None:
                    skipped.append(seq)
                    seq, prev = seq + 1, AuditRecord.model_validate_json(copy).hash
                return seq, prev

            appended = audit.append_intent(
                chain, intent, charge=charge, position=position, known_new=True, sleep=self.sleep
            )
            if appended is None:  # appended before (or meanwhile) under the same key: confirm that one
                return self.take(intent, seen=True)
            record, outcome = appended, "appended"
        if not self._copied(record, new=outcome == "appended"):
            key = anchor.worm_key(record.tenant, record.seq)
            return self._note(Taken("conflict", record, f"its WORM copy {key} holds another record"))
        return self._note(Taken(outcome, record, skipped=tuple(skipped)))

    def _copied(self, record: AuditRecord, *, new: bool) -> bool:
        """Make sure ``record``'s WORM copy exists; False if its key holds other bytes. A new
        record's copy is written (If-None-Match); a duplicate's is usually there already, so it is
        read first (a GET, not a refused PUT and a GET)."""
        worm, body, key = self.stores.worm, record.to_json().encode(), anchor.worm_key(record.tenant, record.seq)
        if new:
            return worm.put_once(key, body) or worm.find(key) == body
        existing = worm.find(key)
        if existing is None:
            return worm.put_once(key, body) or worm.find(key) == body
        return existing == body

    def _note(self, taken: Taken) -> Taken:
        if taken.record is not None:
            self.heads[taken.record.tenant] = (taken.record, taken.outcome != "conflict")
        return taken

    def checkpoint(self, tenant: str) -> Checkpoint | None:
        """Sign and write the checkpoint of the last record taken for ``tenant`` (None: none to
        write, its last record being a conflict). Writing one a redelivery already wrote is a no-op."""
        record, coverable = self.heads[tenant]
        if not coverable:
            return None
        checkpoint = Checkpoint(
            tenant=tenant, seq=record.seq, hash=record.hash, at=self.now(), key_id=self.stores.signer.key_id
        )
        body = anchor.signed(checkpoint, self.stores.signer.sign(checkpoint.message())).to_json().encode()
        self.stores.worm.put_once(anchor.checkpoint_key(tenant, record.seq), body)
        return checkpoint
