"""``batchctl keys create|list|revoke|backfill``: API keys, written straight into the deployment's
table (stored as hashes, ``functions.core.auth``).

Every key has an id, ``key:<12 hex of its sha256>`` (the audit chain's actor for its requests):
``create`` prints the key on stdout and its id on stderr; ``list --tenant T`` prints one JSON
object a line (id, hint: the key's last four characters, created_at, status ``active`` or
``disabled``), never the key; ``revoke`` takes the key or ``--id``. ``backfill`` gives keys stored
before ids existed their id and listing (once, a table scan): until then they are not listed,
cannot be revoked by id and are not disabled by ``tenants disable``."""

import argparse
import json
from typing import TextIO

from functions.core import auth
from functions.core.aws.repos import KeyRepo
from functions.core.ports import AuditLog, TenantStore
from functions.core.records import KEY_ID_HEX, KEY_ID_PREFIX, ApiKeyRecord

from . import audit, targets
from .targets import Target


def key_repo(target: Target) -> KeyRepo:
    return KeyRepo(targets.table(target))


def create_key(keys: KeyRepo, tenant: str, now: int) -> str:
    return auth.create_key(keys, tenant, now=now)


def revoke_key(keys: KeyRepo, key: str) -> str | None:
    """Revoke ``key``; returns its tenant, or None if there was no such key."""
    record = auth.revoke_key(keys, key)
    return record.tenant if record else None


def key_id_arg(value: str) -> str:
    """An argparse ``type`` for ``--id``: ``key:`` and 12 lowercase hex digits."""
    digits = value.removeprefix(KEY_ID_PREFIX)
    if (
        not value.startswith(KEY_ID_PREFIX)
        or len(digits) != KEY_ID_HEX
        or any(c not in "0123456789abcdef" for c in digits)
    ):
        raise argparse.ArgumentTypeError(
            f"expected a key id such as key:3f2a9c01b7de (as `keys list` prints), got {value!r}"
        )
    return value


def listing(record: ApiKeyRecord) -> str:
    return json.dumps({"id": record.id, "hint": record.hint, "created_at": record.created_at, "status": record.status})


def add_parsers(commands: argparse._SubParsersAction) -> None:
    keys = commands.add_parser("keys", help="API keys").add_subparsers(dest="action", required=True)
    create = keys.add_parser("create", help="create a key for a tenant: the key on stdout, its id on stderr")
    create.add_argument("--tenant", required=True, type=targets.tenant_arg, help="tenant name: 1-64 of [A-Za-z0-9_.-]")
    listed = keys.add_parser("list", help="a tenant's keys, one JSON object a line (id, hint, created_at, status)")
    listed.add_argument("--tenant", required=True, type=targets.tenant_arg)
    revoke = keys.add_parser("revoke", help="revoke a key, given itself or its id")
    which = revoke.add_mutually_exclusive_group(required=True)
    which.add_argument("key", nargs="?", help="the key (sk-...)")
    which.add_argument("--id", dest="key_id", type=key_id_arg, help="the key's id (key:<12 hex>, from `keys list`)")
    keys.add_parser("backfill", help="give keys stored before key ids their id and listing (a table scan: run once)")


def run(
    args: argparse.Namespace,
    keys: KeyRepo,
    *,
    now: int,
    out: TextIO,
    err: TextIO,
    audit_store: AuditLog | None = None,
    tenants: TenantStore | None = None,
) -> int:
    """``audit_store``: where each change is sent for the tenant's audit chain (docs/audit.md),
    naming the key by its id (``key:<hash prefix>``), never the key. ``tenants``: the policies
    ``backfill`` reads (a disabled tenant's backfilled keys are marked disabled)."""
    if args.action == "create":
        try:
            key = create_key(keys, args.tenant, now)
        except ValueError as exc:  # a disabled tenant, or a key id taken
            print(f"batchctl: {exc}", file=err)
            return 1
        record_id = ApiKeyRecord(key_hash=auth.hash_key(key), tenant=args.tenant, created_at=now, hint=key[-4:]).id
        audit.note(audit_store, args.tenant, "keys.create", target=record_id, now=now)
        print(key, file=out)
        print(f"batchctl: key id {record_id} (tenant {args.tenant!r})", file=err)
        return 0
    if args.action == "list":
        for record in sorted(keys.list(args.tenant), key=lambda r: (r.created_at, r.id)):
            print(listing(record), file=out)
        return 0
    if args.action == "backfill":
        assert tenants is not None
        print(f"batchctl: {auth.backfill(keys, tenants)} keys got an id and a listing", file=err)
        return 0
    revoked = auth.revoke_key_id(keys, args.key_id) if args.key_id else auth.revoke_key(keys, args.key)
    if revoked is None:
        print("batchctl: no such key", file=err)
        return 1
    audit.note(audit_store, revoked.tenant, "keys.revoke", target=revoked.id, now=now)
    print(f"revoked key {revoked.id} of tenant {revoked.tenant!r}", file=out)
    return 0
