"""``batchctl audit verify|export --tenant T``: a tenant's audit chain (docs/audit.md), read
straight from the deployment's table. ``verify`` re-walks the chain (OK with the count, or the
first broken link and exit 1); ``export`` writes it as JSONL (stdout, ``--out FILE``, or one
object in an S3 bucket, e.g. the stack's Object Lock bucket: ``--s3 BUCKET[/PREFIX]``).

Also the operator's own records: ``note`` appends what ``batchctl keys`` and ``batchctl tenants``
change (actor ``operator``). ``verify --worm BUCKET`` also compares the chain with the copies
the stream export wrote to the Object Lock bucket (docs/audit.md, "WORM copy")."""

import argparse
import time
from typing import Any, TextIO

import boto3

from functions.core import audit
from functions.core.audit import AuditRecord
from functions.core.aws.audit import AuditRepo
from functions.core.aws.s3 import WormObjects
from functions.core.ports import AuditStore, WormStore
from infra.local import state as local_state

from . import targets
from .targets import Target


def audit_repo(target: Target) -> AuditRepo:
    return AuditRepo(targets.table(target))


def s3_client(target: Target) -> Any:
    """An S3 client for ``target`` (the local deployment's moto, or the standard credential chain)."""
    if target.kind == "local":
        session = targets.local_session(target.region or local_state.REGION)
    else:
        session = boto3.Session(region_name=target.region)
    return session.client("s3", endpoint_url=target.endpoint_url, config=targets.CONFIG)


def worm_store(target: Target, bucket: str) -> WormObjects:
    return WormObjects(s3_client(target), bucket)


def note(store: AuditStore | None, tenant: str, action: str, *, target: str | None = None,
         details: dict[str, Any] | None = None, now: int | None = None) -> AuditRecord | None:
    """Append an operator's change to ``tenant``'s chain (no store: nothing)."""
    if store is None:
        return None
    return audit.append(store, tenant, at=int(time.time()) if now is None else now, actor=audit.OPERATOR,
                        action=action, outcome="ok", target=target, details=details)


def add_parsers(commands: argparse._SubParsersAction) -> None:
    chain = commands.add_parser("audit", help="tenants' audit chains").add_subparsers(dest="action", required=True)
    verify = chain.add_parser("verify", help="re-walk a tenant's chain: OK, or the first broken link (exit 1)")
    verify.add_argument("--tenant", required=True, type=targets.tenant_arg)
    verify.add_argument("--worm", metavar="BUCKET",
                        help="also compare the chain with its WORM copy in BUCKET (the stack's AuditBucketName): a chain "
                             "rewritten in the table, or a deleted tail, differs from the copies")
    export = chain.add_parser("export", help="write a tenant's chain as JSONL")
    export.add_argument("--tenant", required=True, type=targets.tenant_arg)
    where = export.add_mutually_exclusive_group()
    where.add_argument("--out", metavar="FILE", help="write to FILE (default: stdout)")
    where.add_argument("--s3", metavar="BUCKET[/PREFIX]",
                       help="write one object <PREFIX><tenant>/<first>-<last>.jsonl to BUCKET (e.g. the Object Lock bucket)")


def jsonl(records: list[AuditRecord]) -> bytes:
    return b"".join(r.to_json().encode() + b"\n" for r in records)


def export_key(prefix: str, tenant: str, records: list[AuditRecord]) -> str:
    """The object an S3 export writes: named by the seqs it holds, so a later export (a longer
    chain) writes a new object and never overwrites a locked one."""
    return f"{prefix}{tenant}/{records[0].seq:012d}-{records[-1].seq:012d}.jsonl"


def worm_copies(worm: WormStore, tenant: str) -> dict[int, str]:
    """seq -> the stored copy of each of ``tenant``'s records in the WORM store."""
    copies = {}
    for key in worm.list_keys(audit.worm_prefix(tenant)):
        copy = AuditRecord.model_validate_json(worm.get(key))
        copies[copy.seq] = copy.to_json()
    return copies


def run(args: argparse.Namespace, store: AuditStore, *, out: TextIO, err: TextIO, s3: Any = None,
        worm: WormStore | None = None) -> int:
    records = store.records(args.tenant)
    if args.action == "verify":
        broken = audit.verify(records)
        if broken is not None:
            print(f"BROKEN: tenant {args.tenant!r}: {broken}", file=out)
            return 1
        if worm is not None:
            check = audit.compare_with_copies(records, worm_copies(worm, args.tenant))
            if check.broken is not None:
                print(f"BROKEN: tenant {args.tenant!r}: WORM copy #{check.broken.position} (seq {check.broken.seq}): "
                      f"{check.broken.reason}", file=out)
                return 1
            print(f"OK: tenant {args.tenant!r}: {len(records)} records, chain intact, {check.copies} match their WORM "
                  f"copies ({check.not_copied} not copied yet)", file=out)
            return 0
        print(f"OK: tenant {args.tenant!r}: {len(records)} records, chain intact", file=out)
        return 0
    body = jsonl(records)
    if args.s3:
        if not records:
            print(f"batchctl: tenant {args.tenant!r} has no audit records", file=err)
            return 1
        bucket, _, prefix = args.s3.partition("/")
        key = export_key(prefix.rstrip("/") + "/" if prefix else "", args.tenant, records)
        # A checksum: S3 requires one on every PUT into an Object Lock bucket.
        s3.put_object(Bucket=bucket, Key=key, Body=body, ContentType="application/jsonl", ChecksumAlgorithm="SHA256")
        print(f"s3://{bucket}/{key}: {len(records)} records", file=out)
    elif args.out:
        with open(args.out, "wb") as f:
            f.write(body)
        print(f"{args.out}: {len(records)} records", file=err)
    else:
        out.write(body.decode())
    return 0
