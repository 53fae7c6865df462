"""``batchctl audit verify|export --tenant T``: a tenant's audit chain (docs/audit.md).

``verify`` holds the chain as the deployment's table has it against its anchors in the Object
Lock bucket (every record's WORM copy, the signed checkpoints, checked with the deployment's
public key: KMS GetPublicKey on AWS, the key file locally, or ``--public-key FILE``), and prints
OK with what is anchored and what is not yet (lag), or every finding. Exit codes: 0 intact (lag
included), 1 tampering found, 3 not verifiable (no audit chain or anchor in the target, or the
target could not be read). ``export`` writes the chain as JSONL (stdout, ``--out FILE``, or one
object in an S3 bucket: ``--s3 BUCKET[/PREFIX]``).

Also the operator's own records: ``note`` sends what ``batchctl keys`` and ``batchctl tenants``
change (actor ``operator``) to the audit queue, as every other writer does: the operator's
credentials write no chain either."""

import argparse
import time
from pathlib import Path
from typing import Any, TextIO

from functions.core import anchor, audit
from functions.core.audit import AuditRecord
from functions.core.aws.audit import AuditRepo
from functions.core.aws.kms import KmsSigner
from functions.core.aws.s3 import WormObjects
from functions.core.aws.sqs import SqsAuditLog
from functions.core.ports import AuditLog, AuditStore, WormStore

from . import targets
from .targets import Target

#: ``verify``'s exit codes.
INTACT, BROKEN, UNVERIFIABLE = 0, 1, 3
#: Findings printed in full; the rest are counted.
SHOWN_FINDINGS = 50


def audit_repo(target: Target) -> AuditRepo:
    return AuditRepo(targets.table(target))


def s3_client(target: Target) -> Any:
    """An S3 client for ``target`` (the local deployment's moto, or the standard credential chain)."""
    return targets.client(target, "s3")


def audit_log(target: Target) -> AuditLog | None:
    """The target's audit queue (None: the deployment keeps no audit chain)."""
    return SqsAuditLog(targets.client(target, "sqs"), target.audit_queue_url) if target.audit_queue_url else None


def worm_store(target: Target, bucket: str | None = None) -> WormObjects | None:
    bucket = bucket or target.audit_bucket
    return WormObjects(s3_client(target), bucket) if bucket else None


def public_key(target: Target, path: str | None = None) -> bytes | None:
    """The deployment's checkpoint key (DER): ``path`` (a PEM file) if given, else the local key
    file, else KMS GetPublicKey of the stack's key; None if the target names none."""
    from functions.core import signing  # needs `cryptography`, only verify does

    if path or target.kind == "local":
        file = path or target.audit_key
        return signing.public_key_der(Path(file).read_bytes()) if file else None
    return KmsSigner(targets.client(target, "kms"), target.audit_key).public_key() if target.audit_key else None


def note(
    log: AuditLog | None,
    tenant: str,
    action: str,
    *,
    target: str | None = None,
    details: dict[str, Any] | None = None,
    now: int | None = None,
) -> audit.AuditIntent | None:
    """Send an operator's change of ``tenant`` to the audit queue (no log: nothing)."""
    if log is None:
        return None
    intent = audit.operator_intent(
        tenant, action, at=int(time.time()) if now is None else now, target=target, details=details
    )
    log.record(intent)
    return intent


def add_parsers(commands: argparse._SubParsersAction) -> None:
    chain = commands.add_parser("audit", help="tenants' audit chains").add_subparsers(dest="action", required=True)
    verify = chain.add_parser(
        "verify",
        help="hold a tenant's chain against its WORM copies and signed checkpoints: exit 0 intact, "
        "1 tampering found, 3 not verifiable",
    )
    verify.add_argument("--tenant", required=True, type=targets.tenant_arg)
    verify.add_argument("--worm", metavar="BUCKET", help="the Object Lock bucket (default: the deployment's)")
    verify.add_argument(
        "--public-key",
        metavar="PEM",
        dest="public_key",
        help="verify checkpoints with this public key (default: the deployment's key; pin one you "
        "exported to be independent of the KMS key)",
    )
    export = chain.add_parser("export", help="write a tenant's chain as JSONL")
    export.add_argument("--tenant", required=True, type=targets.tenant_arg)
    where = export.add_mutually_exclusive_group()
    where.add_argument("--out", metavar="FILE", help="write to FILE (default: stdout)")
    where.add_argument(
        "--s3", metavar="BUCKET[/PREFIX]", help="write one object <PREFIX><tenant>/<first>-<last>.jsonl to BUCKET"
    )
    chain.add_parser("public-key", help="print the deployment's checkpoint public key (PEM), to pin it")


def jsonl(records: list[AuditRecord]) -> bytes:
    return b"".join(r.to_json().encode() + b"\n" for r in records)


def export_key(prefix: str, tenant: str, records: list[AuditRecord]) -> str:
    """The object an S3 export writes: named by the seqs it holds, so a later export (a longer
    chain) writes a new object and never overwrites a locked one."""
    return f"{prefix}{tenant}/{records[0].seq:012d}-{records[-1].seq:012d}.jsonl"


def examine(store: AuditStore, worm: WormStore, tenant: str, key: bytes) -> anchor.Examination:
    """The tenant's chain in the table against its anchors in ``worm``, checked with ``key``."""
    from functions.core import signing  # needs `cryptography`, only verify does

    copies = anchor.by_seq(worm.originals(anchor.worm_prefix(tenant)), anchor.worm_prefix(tenant))
    checkpoints = anchor.by_seq(worm.originals(anchor.checkpoint_prefix(tenant)), anchor.checkpoint_prefix(tenant))
    return anchor.examine(tenant, store.records(tenant), copies, checkpoints, signing.verifier(key))


def report(tenant: str, found: anchor.Examination) -> str:
    lag = (
        f"{found.unanchored} after it not anchored yet ({found.uncopied} of them not copied yet)"
        if found.anchored
        else f"none anchored yet ({found.uncopied} not copied yet)"
    )
    summary = (
        f"{found.records} records, {found.copies} WORM copies, newest signed checkpoint at seq {found.anchored}: {lag}"
        if found.anchored
        else f"{found.records} records, {found.copies} WORM copies, no signed checkpoint: {lag}"
    )
    if found.intact:
        return f"OK: tenant {tenant!r}: {summary}\n"
    lines = [f"BROKEN: tenant {tenant!r}: {len(found.findings)} findings; {summary}"]
    lines += [f"  {finding}" for finding in found.findings[:SHOWN_FINDINGS]]
    if len(found.findings) > SHOWN_FINDINGS:
        lines.append(f"  ... and {len(found.findings) - SHOWN_FINDINGS} more")
    return "\n".join(lines) + "\n"


def run(
    args: argparse.Namespace,
    store: AuditStore,
    *,
    out: TextIO,
    err: TextIO,
    s3: Any = None,
    worm: WormStore | None = None,
    key: bytes | None = None,
) -> int:
    """``worm`` and ``key``: the target's Object Lock bucket and checkpoint key (``verify``);
    ``key`` alone for ``public-key``."""
    if args.action == "public-key":
        if key is None:
            print("batchctl: this deployment has no audit signing key", file=err)
            return UNVERIFIABLE
        from functions.core import signing  # needs `cryptography`

        out.write(signing.public_key_pem(key).decode())
        return 0
    if args.action == "verify":
        if worm is None or key is None:
            print(
                "batchctl: this deployment has no audit anchors (governance off?): nothing to verify against", file=err
            )
            return UNVERIFIABLE
        found = examine(store, worm, args.tenant, key)
        out.write(report(args.tenant, found))
        return INTACT if found.intact else BROKEN
    records = store.records(args.tenant)
    body = jsonl(records)
    if args.s3:
        if not records:
            print(f"batchctl: tenant {args.tenant!r} has no audit records", file=err)
            return 1
        bucket, _, prefix = args.s3.partition("/")
        key_name = export_key(prefix.rstrip("/") + "/" if prefix else "", args.tenant, records)
        # A checksum: S3 requires one on every PUT into an Object Lock bucket.
        s3.put_object(
            Bucket=bucket, Key=key_name, Body=body, ContentType="application/jsonl", ChecksumAlgorithm="SHA256"
        )
        print(f"s3://{bucket}/{key_name}: {len(records)} records", file=out)
    elif args.out:
        with open(args.out, "wb") as f:
            f.write(body)
        print(f"{args.out}: {len(records)} records", file=err)
    else:
        out.write(body.decode())
    return 0
