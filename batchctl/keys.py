"""``batchctl keys create|revoke``: API keys, written straight into the deployment's table (stored
as hashes, ``functions.core.auth``)."""

import argparse
from typing import TextIO

from functions.core import audit as core_audit
from functions.core import auth
from functions.core.aws.repos import KeyRepo
from functions.core.ports import AuditLog

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


def add_parsers(commands: argparse._SubParsersAction) -> None:
    keys = commands.add_parser("keys", help="API keys").add_subparsers(dest="action", required=True)
    create = keys.add_parser("create", help="create a key for a tenant and print it")
    create.add_argument("--tenant", required=True, type=targets.tenant_arg, help="tenant name: 1-64 of [A-Za-z0-9_.-]")
    revoke = keys.add_parser("revoke", help="revoke a key")
    revoke.add_argument("key")


def run(args: argparse.Namespace, keys: KeyRepo, *, now: int, out: TextIO, err: TextIO,
        audit_store: AuditLog | None = None) -> int:
    """``audit_store``: where each change is sent for the tenant's audit chain (docs/audit.md),
    naming the key by its actor id (``key:<hash prefix>``), never the key."""
    if args.action == "create":
        key = create_key(keys, args.tenant, now)
        audit.note(audit_store, args.tenant, "keys.create", target=core_audit.key_actor(f"Bearer {key}"), now=now)
        print(key, file=out)
        return 0
    tenant = revoke_key(keys, args.key)
    if tenant is None:
        print("batchctl: no such key", file=err)
        return 1
    audit.note(audit_store, tenant, "keys.revoke", target=core_audit.key_actor(f"Bearer {args.key}"), now=now)
    print(f"revoked the key of tenant {tenant!r}", file=out)
    return 0
