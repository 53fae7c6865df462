"""Chunk receipts as the audit appender records them (docs/audit.md): built from the chunk's count
marker, read here (its attempt, counts, usage and time; the tenant's budget charge), never from
the sender's numbers; only the input lines and the part digests come from the message, and the
digests are computed from the parts when the sender had none. Every intent's dedupe key: a
receipt's is its chunk's, so a chunk has one receipt."""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from functions.core import audit, limits, schema
from functions.core.audit import AuditIntent, AuditRecord
from functions.core.budgets import Charge
from functions.core.ports import BatchStore, Objects
from functions.core.records import ChunkRecord

#: A sha256 hex digest.
_HEX = frozenset("0123456789abcdef")
#: Count markers read ahead of the receipts that need them, by (tenant, batch, chunk).
Markers = Mapping[tuple[str, str, int], ChunkRecord | None]


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


def _shards(intent: AuditIntent) -> int | None:
    """The counting shards a receipt names (1 when it names none; None if not a shard count)."""
    shards = intent.details.get("count_shards", 1)
    ok = isinstance(shards, int) and not isinstance(shards, bool) and 1 <= shards <= limits.MAX_COUNT_SHARDS
    return shards if ok else None


def marker_key(intent: AuditIntent) -> tuple[str, str, int, int] | None:
    """Where a receipt's count marker is: (tenant, batch, chunk, shards); None if it names none."""
    named, shards = _chunk_of(intent), _shards(intent)
    if intent.action != audit.CHUNK_RECEIPT or named is None or shards is None:
        return None
    return (intent.tenant, *named, shards)


def resent(intent: AuditIntent) -> bool:
    """A receipt without digests: sent again after its worker died (a redelivery re-signalling,
    the chunk DLQ consumer), so likely appended before, and building it reads the parts back."""
    return intent.action == audit.CHUNK_RECEIPT and all(intent.details.get(k) is None for k in audit.RECEIPT_DIGESTS)


def receipt(
    batches: BatchStore, objects: Objects, intent: AuditIntent, markers: Markers | None = None
) -> Receipt | str:
    """The receipt as the appender records it, or why it refuses it: batch, chunk, input lines
    and digests from the sender, everything counted (and charged) from the chunk's own count
    marker (from ``markers`` when read ahead, else read here)."""
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
    shards = _shards(intent)
    if shards is None:
        return "a receipt's count_shards must be a shard count"
    key = (intent.tenant, batch_id, chunk)
    marker = markers[key] if markers is not None and key in markers else batches.counted_chunk(*key, shards)
    if marker is None:
        return f"chunk {chunk} of batch {batch_id} is not counted"
    if all(v is None for v in digests.values()):
        digests = _part_digests(objects, intent.tenant, batch_id, chunk, marker.attempt)
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


def is_its_record(record: AuditRecord, intent: AuditIntent) -> bool:
    """Whether ``record`` is what ``intent`` was appended as (a receipt: the same chunk's receipt;
    its numbers are the marker's, not the sender's)."""
    if intent.action == audit.CHUNK_RECEIPT:
        batch_id, chunk = _chunk_of(intent) or ("", -1)
        return (record.action, record.target, record.details.get("chunk")) == (audit.CHUNK_RECEIPT, batch_id, chunk)
    return record.content() == intent.content()
