"""The WORM copy of the audit chains (docs/audit.md, "WORM copy"): every record appended to a
tenant's chain is written, as its canonical JSON, to ``audit.worm_key(tenant, seq)`` in the Object
Lock bucket, once. Driven by the table's stream (new images of ``AUDIT#*`` / ``SEQ#*`` items), so
the copy follows the chain within seconds, with nobody to run it.

At least once: a redelivered stream record finds its key taken (``WormStore.put_once`` is
False) and compares: the same bytes are a duplicate (nothing to do); other bytes mean the table
holds a different record under a seq already copied (a record deleted and written again):
reported as a conflict (logged at error level by the handler, alarmable), never overwritten (the
bucket could not anyway) and never raised (a retry cannot succeed)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from functions.core import audit
from functions.core.audit import AuditRecord
from functions.core.ports import WormStore


@dataclass
class Exported:
    written: list[str] = field(default_factory=list)
    duplicates: list[str] = field(default_factory=list)
    #: Keys whose stored copy differs from the record the table now has.
    conflicts: list[str] = field(default_factory=list)


def export(worm: WormStore, records: Iterable[str]) -> Exported:
    """Copy each record (its stored canonical JSON, ``AuditRecord.to_json``) to the WORM store."""
    done = Exported()
    for text in records:
        record = AuditRecord.model_validate_json(text)
        body = record.to_json().encode()
        key = audit.worm_key(record.tenant, record.seq)
        if worm.put_once(key, body):
            done.written.append(key)
        elif worm.get(key) == body:
            done.duplicates.append(key)
        else:
            done.conflicts.append(key)
    return done
