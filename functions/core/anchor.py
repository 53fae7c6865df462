"""What anchors the audit chains outside the table (docs/audit.md; ADR 0020): the WORM copy of
every record and signed checkpoints of the heads, both in the Object Lock bucket, and ``examine``,
which holds a chain as the table has it against them.

- ``chain/<tenant>/<seq, 12 digits>.json``: the record's canonical JSON (``AuditRecord.to_json``),
  written once by the audit appender right after its conditional append.
- ``checkpoints/<tenant>/<seq, 12 digits>.json``: ``SignedCheckpoint``: {tenant, seq, hash, at,
  key_id} and an ECDSA P-256 signature over ``CHECKPOINT_CONTEXT`` + its canonical JSON, by the
  appender's key (KMS in the cloud, a key file locally), after the copies up to that seq exist.

Every object is written with If-None-Match (a key is written once) into a bucket whose default
retention locks each version: what was written first stays readable, and ``examine`` reads the
first version of each key (``WormStore.originals``), so a later version or a delete marker
changes nothing but is itself reported.
"""

from __future__ import annotations

import base64
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Final, Literal

from pydantic import BaseModel, ConfigDict, ValidationError

from .audit import AuditRecord, canonical, verify

#: The two prefixes of the Object Lock bucket the appender writes (and nothing else there).
CHAIN_PREFIX: Final = "chain/"
CHECKPOINT_PREFIX: Final = "checkpoints/"
#: What every checkpoint signature covers before the checkpoint's JSON: a signature made for
#: anything else with the same key can never pass as a checkpoint's.
CHECKPOINT_CONTEXT: Final = b"batch-api audit checkpoint v1\n"
#: KMS's name of the one algorithm (ECDSA over P-256 with SHA-256; DER-encoded signatures).
SIGNING_ALGORITHM: Final = "ECDSA_SHA_256"
_SEQ_KEY = re.compile(r"(\d{12})\.json")


def worm_key(tenant: str, seq: int) -> str:
    return f"{CHAIN_PREFIX}{tenant}/{seq:012d}.json"


def worm_prefix(tenant: str) -> str:
    return f"{CHAIN_PREFIX}{tenant}/"


def checkpoint_key(tenant: str, seq: int) -> str:
    return f"{CHECKPOINT_PREFIX}{tenant}/{seq:012d}.json"


def checkpoint_prefix(tenant: str) -> str:
    return f"{CHECKPOINT_PREFIX}{tenant}/"


def by_seq(objects: dict[str, WormObject], prefix: str) -> dict[int, WormObject]:
    """``WormStore.originals`` keyed by the seq in each key's name (keys of another shape: dropped)."""
    out = {}
    for key, obj in objects.items():
        match = _SEQ_KEY.fullmatch(key.removeprefix(prefix))
        if match:
            out[int(match.group(1))] = obj
    return out


@dataclass(frozen=True)
class WormObject:
    """One key of the WORM bucket: its first version's bytes, how many versions it has, and
    whether a delete marker is its current version (``hidden``)."""

    body: bytes
    versions: int = 1
    hidden: bool = False


class Checkpoint(BaseModel):
    """The head of a tenant's chain as the appender left it."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    tenant: str
    seq: int
    hash: str
    #: Unix seconds: when it was signed.
    at: int
    key_id: str

    def message(self) -> bytes:
        """The bytes the signature covers."""
        return CHECKPOINT_CONTEXT + canonical(self.model_dump(mode="json")).encode()


class SignedCheckpoint(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    checkpoint: Checkpoint
    algorithm: Literal["ECDSA_SHA_256"] = SIGNING_ALGORITHM
    #: base64 of the DER-encoded signature.
    signature: str

    def to_json(self) -> str:
        return canonical(self.model_dump(mode="json"))

    def signature_bytes(self) -> bytes:
        return base64.b64decode(self.signature, validate=True)


def signed(checkpoint: Checkpoint, signature: bytes) -> SignedCheckpoint:
    return SignedCheckpoint(checkpoint=checkpoint, signature=base64.b64encode(signature).decode())


# --- examine: the table's chain against its anchors ---------------------------------------------
#: Verifies a signature over a message with the deployment's public key (``signing.verifier``).
SignatureCheck = Callable[[bytes, bytes], bool]

Kind = Literal[
    "link",
    "rewritten",
    "deleted",
    "cut_tail",
    "forged_insert",
    "forged_checkpoint",
    "copy_invalid",
    "copy_overwritten",
    "copy_hidden",
    "copy_missing",
]


@dataclass(frozen=True)
class Finding:
    """One thing that does not hold: a ``kind`` (below), the seq it concerns, and why."""

    kind: Kind
    seq: int
    reason: str

    def __str__(self) -> str:
        return f"seq {self.seq}: {self.kind}: {self.reason}"


@dataclass(frozen=True)
class Examination:
    """What ``examine`` found for one tenant. ``findings`` are breaks (tampering, or a copy an
    appender could not write, see docs/audit.md); ``unanchored`` records after the newest valid
    checkpoint are lag, not a break (``uncopied`` of them have no WORM copy yet)."""

    records: int
    copies: int
    checkpoints: int
    #: The seq of the newest checkpoint whose signature holds (0: none).
    anchored: int
    unanchored: int
    uncopied: int
    findings: list[Finding] = field(default_factory=list)

    @property
    def intact(self) -> bool:
        return not self.findings


def _copy(tenant: str, seq: int, obj: WormObject) -> tuple[AuditRecord | None, list[Finding]]:
    """The record a WORM copy holds, and what is wrong with the copy itself."""
    found: list[Finding] = []
    if obj.versions > 1:
        found.append(
            Finding(
                "copy_overwritten",
                seq,
                f"its WORM copy has {obj.versions} versions (a write without If-None-Match); the first one is used",
            )
        )
    if obj.hidden:
        found.append(Finding("copy_hidden", seq, "a delete marker hides its WORM copy; the first version is used"))
    try:
        record = AuditRecord.model_validate_json(obj.body)
    except ValidationError:
        return None, [*found, Finding("copy_invalid", seq, "its WORM copy is not an audit record")]
    if (record.tenant, record.seq) != (tenant, seq) or record.computed_hash() != record.hash:
        return None, [*found, Finding("copy_invalid", seq, "its WORM copy names another place or does not hash")]
    return record, found


def _missing(seq: int, head: int, where: str) -> Finding:
    if seq > head:
        return Finding("cut_tail", seq, f"{where}, beyond the table's head (seq {head}): the tail was cut")
    return Finding("deleted", seq, f"{where}, but not in the table: deleted")


def _check_copies(
    tenant: str, table: dict[int, AuditRecord], copies: dict[int, WormObject], findings: list[Finding]
) -> dict[int, AuditRecord]:
    """The records the WORM copies hold, by seq; what is wrong with them goes to ``findings``."""
    head = max(table, default=0)
    copied: dict[int, AuditRecord] = {}
    for seq in sorted(copies):
        record, problems = _copy(tenant, seq, copies[seq])
        findings += problems
        if record is None:
            continue
        copied[seq] = record
        if seq not in table:
            findings.append(_missing(seq, head, "in the WORM copy"))
        elif table[seq].to_json() != record.to_json():
            findings.append(Finding("rewritten", seq, "differs from its WORM copy"))
    return copied


def _signed(tenant: str, seq: int, obj: WormObject, signature_ok: SignatureCheck) -> Checkpoint | None:
    """The checkpoint ``obj`` holds if it is of its place and its signature holds, else None."""
    try:
        signed_checkpoint = SignedCheckpoint.model_validate_json(obj.body)
        checkpoint = signed_checkpoint.checkpoint
        ok = (checkpoint.tenant, checkpoint.seq) == (tenant, seq) and signature_ok(
            checkpoint.message(), signed_checkpoint.signature_bytes()
        )
    except (ValidationError, ValueError):
        return None
    return checkpoint if ok else None


def _check_checkpoints(
    tenant: str,
    table: dict[int, AuditRecord],
    copied: dict[int, AuditRecord],
    checkpoints: dict[int, WormObject],
    signature_ok: SignatureCheck,
    findings: list[Finding],
) -> tuple[int, int]:
    """(the newest valid checkpoint's seq, how many are valid); what is wrong goes to ``findings``."""
    head = max(table, default=0)
    anchored, valid = 0, 0
    for seq in sorted(checkpoints):
        checkpoint = _signed(tenant, seq, checkpoints[seq], signature_ok)
        if checkpoint is None:
            findings.append(
                Finding(
                    "forged_checkpoint", seq, "a checkpoint whose signature does not hold with the deployment's key"
                )
            )
            continue
        valid += 1
        anchored = max(anchored, seq)
        if seq not in table:
            findings.append(_missing(seq, head, "signed in a checkpoint"))
        elif table[seq].hash != checkpoint.hash:
            findings.append(Finding("rewritten", seq, "its hash is not the one its signed checkpoint holds"))
        if seq not in copied:
            findings.append(Finding("copy_missing", seq, "a signed checkpoint with no WORM copy of its record"))
        elif copied[seq].hash != checkpoint.hash:
            findings.append(
                Finding("copy_invalid", seq, "its WORM copy's hash is not the one its signed checkpoint holds")
            )
    return anchored, valid


def examine(
    tenant: str,
    records: Iterable[AuditRecord],
    copies: dict[int, WormObject],
    checkpoints: dict[int, WormObject],
    signature_ok: SignatureCheck,
) -> Examination:
    """The table's chain (``records``, as stored) against its WORM copies and signed checkpoints
    (by seq: ``by_seq(WormStore.originals(...))``). ``signature_ok`` checks with the deployment's
    public key, never one a checkpoint names. Finds:

    - ``link``: the chain's own first broken link (``audit.verify``);
    - ``rewritten``: a record that differs from its copy, or whose hash is not a checkpoint's;
    - ``deleted`` / ``cut_tail``: a copy or checkpoint whose record the table does not have
      (below / beyond the table's head);
    - ``forged_insert``: a record at or below the newest checkpoint with no valid copy (the
      appender copies every record before it signs a checkpoint above it);
    - ``forged_checkpoint``: a checkpoint whose signature does not hold (not the deployment's key);
    - ``copy_*``: a copy that is not a record of its place, has more than one version, is hidden
      by a delete marker, or is missing under a checkpoint."""
    records = list(records)
    findings: list[Finding] = []
    broken = verify(records)
    if broken is not None:
        findings.append(Finding("link", broken.seq, broken.reason))
    table = {r.seq: r for r in records}
    copied = _check_copies(tenant, table, copies, findings)
    anchored, valid = _check_checkpoints(tenant, table, copied, checkpoints, signature_ok, findings)
    for record in records:
        if record.seq <= anchored and record.seq not in copied:
            findings.append(
                Finding(
                    "forged_insert",
                    record.seq,
                    f"no WORM copy, at or below the newest checkpoint "
                    f"(seq {anchored}): inserted outside the appender (or its intent is "
                    f"dead-lettered, docs/audit.md)",
                )
            )
    later = [r for r in records if r.seq > anchored]
    return Examination(
        records=len(records),
        copies=len(copies),
        checkpoints=valid,
        anchored=anchored,
        unanchored=len(later),
        uncopied=sum(1 for r in later if r.seq not in copied),
        findings=sorted(findings, key=lambda f: (f.seq, f.kind)),
    )
