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
built from the chunk's count marker (``receipts``), and its append also charges the tenant's token
budget from that marker (``ChunkRecord.budget_charge``), in the same transaction: a chunk is
charged exactly once, by this role alone.

Logic takes its stores (``AppenderStores``); the handler builds them.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Literal

from functions.core import anchor, audit
from functions.core.anchor import Checkpoint
from functions.core.audit import AuditIntent, AuditRecord
from functions.core.budgets import Charge
from functions.core.errors import ConditionFailed
from functions.core.ports import AuditStore, BatchStore, Objects, Signer, WormStore
from functions.core.records import ChunkRecord

from .receipts import dedupe_key, is_its_record, marker_key, receipt, resent


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


class NotTaken(Exception):
    """An intent left for the queue to give again: an earlier intent of its tenant failed."""


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
        self.put_many([(record, dedupe, charge)])

    def put_many(self, entries: Sequence[tuple[AuditRecord, str | None, Charge | None]]) -> None:
        tenant = entries[-1][0].tenant
        try:
            if len(entries) == 1:
                record, dedupe, charge = entries[0]
                self._chain.put(record, dedupe=dedupe, charge=charge)
            else:
                self._chain.put_many(entries)
        except Exception:
            self._heads.pop(tenant, None)  # refused, or not known to be written: read again
            raise
        self._heads[tenant] = entries[-1][0]

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

    What it reads and writes per intent is what an intent needs alone (``take_all``): the count
    markers of its receipts are read together; a tenant's new intents are appended together, in one
    transaction (each with its dedupe marker, so a duplicate refuses it and they are then taken one
    by one, the duplicate found by its key), a receipt sent again one by one after reading its key
    (``take``); a tenant's head is read once (``KnownHeads``); whether WORM copies already hold the
    seqs past the head (a cut tail) is one LIST per tenant, after which this invocation's own
    appends are known to be the only copies. Each record is then copied (one PUT)."""

    stores: AppenderStores
    now: Callable[[], int]
    sleep: Callable[[float], None] = time.sleep
    #: Per tenant: the last record appended or confirmed, and whether a checkpoint may cover it.
    heads: dict[str, tuple[AuditRecord, bool]] = field(default_factory=dict)
    #: Per tenant: the seq from which no WORM copy existed when this invocation looked (its own
    #: copies, all below the chain's next seq, aside).
    free_from: dict[str, int] = field(default_factory=dict)
    #: The count markers of this invocation's receipts, read together (``take_all``).
    markers: dict[tuple[str, str, int], ChunkRecord | None] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.chain = KnownHeads(self.stores.chain)

    def take_all(self, intents: Sequence[AuditIntent]) -> list[Taken | Exception]:
        """Take ``intents`` in the queue's order: each tenant's new intents together when it has
        several (``_append_together``), else one by one. An intent that raised is its exception,
        and every later intent of its tenant is not taken (the queue gives them again, in order)."""
        keys = [k for i in intents if not resent(i) and (k := marker_key(i)) is not None]
        if keys:
            found = self.stores.batches.count_markers(keys)
            self.markers.update({k[:3]: found.get(k[:3]) for k in keys})
        out: list[Taken | Exception] = [NotTaken("not taken")] * len(intents)
        by_tenant: dict[str, list[int]] = {}
        for i, intent in enumerate(intents):
            by_tenant.setdefault(intent.tenant, []).append(i)
        for positions in by_tenant.values():
            group = [intents[i] for i in positions]
            try:
                together = self._append_together(group) if len(group) > 1 else None
            except Exception as exc:  # noqa: BLE001 - nothing was appended: every one of them comes again
                out[positions[0]] = exc
                continue
            if together is not None:
                for i, taken in zip(positions, together, strict=True):
                    out[i] = taken
                continue
            for i in positions:
                try:
                    out[i] = self.take(intents[i])
                except Exception as exc:  # noqa: BLE001 - the handler fails this intent and the rest of its tenant
                    out[i] = exc
                    break
        return out

    def _append_together(self, intents: Sequence[AuditIntent]) -> list[Taken] | None:
        """Append one tenant's new intents in one transaction and copy each; None when they must
        be taken one by one: one is a receipt sent again or refused, two share a dedupe key (a
        transaction names an item once), the WORM copy holds a seq past the head (a cut tail), or
        the transaction was refused (a duplicate, a concurrent write)."""
        keys = [dedupe_key(i) for i in intents]
        if len(set(keys)) < len(keys):
            return None
        built: list[tuple[AuditIntent, Charge | None]] = []
        for intent in intents:
            if resent(intent) or dedupe_key(intent) is None:
                return None
            charge = None
            if intent.action == audit.CHUNK_RECEIPT:
                made = receipt(self.stores.batches, self.stores.objects, intent, self.markers)
                if isinstance(made, str):
                    return None
                intent, charge = made.intent, made.charge
            built.append((intent, charge))
        tenant = intents[0].tenant
        seq, prev = audit.after(self.chain.head(tenant))
        if not self._no_copy_from(tenant, seq):
            return None
        entries: list[tuple[AuditRecord, str | None, Charge | None]] = []
        for intent, charge in built:
            fields = intent.content()
            fields.pop("tenant")
            record = audit.link(tenant, seq, prev, **fields)
            entries.append((record, intent.dedupe, charge))
            seq, prev = seq + 1, record.hash
        try:
            self.chain.put_many(entries)
        except ConditionFailed:
            return None
        taken = []
        for record, _, _ in entries:
            if self._copied(record, new=True):
                taken.append(self._note(Taken("appended", record)))
            else:
                key = anchor.worm_key(record.tenant, record.seq)
                taken.append(self._note(Taken("conflict", record, f"its WORM copy {key} holds another record")))
        return taken

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
        seq = chain.dedupe_seq(intent.tenant, key) if seen or resent(intent) else None
        skipped: list[int] = []
        if seq is not None:  # appended before: make sure of its copy
            record = chain.record(intent.tenant, seq)
            if record is None or not is_its_record(record, intent):
                return self._note(Taken("conflict", record, f"the table's record at seq {seq} is not this intent's"))
            outcome: Outcome = "duplicate"
        else:
            charge = None
            if intent.action == audit.CHUNK_RECEIPT:
                built = receipt(self.stores.batches, self.stores.objects, intent, self.markers)
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
