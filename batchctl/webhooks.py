"""``batchctl webhooks create|list|rotate|delete|deliveries``: a tenant's webhook endpoints
(docs/webhooks.md), written straight into the deployment's table. The signing secret is printed
once, by ``create`` and ``rotate``; ``list`` shows a masked hint."""

import argparse
import json
from typing import TextIO

from functions.webhooks import logic, signing
from functions.webhooks.store import EndpointRecord, WebhookRepo, new_endpoint_id

from . import targets
from .targets import Target


def webhook_repo(target: Target) -> WebhookRepo:
    return WebhookRepo(targets.table(target))


def _events(value: str) -> list[str]:
    events = [e.strip() for e in value.split(",") if e.strip()]
    unknown = sorted(set(events) - set(logic.EVENT_TYPES))
    if not events or unknown:
        raise argparse.ArgumentTypeError(f"events are a comma-separated subset of {', '.join(logic.EVENT_TYPES)}")
    return list(dict.fromkeys(events))


def add_parsers(commands: argparse._SubParsersAction) -> None:
    hooks = commands.add_parser("webhooks", help="webhook endpoints").add_subparsers(dest="action", required=True)
    create = hooks.add_parser("create", help="add an endpoint and print its signing secret (shown once)")
    create.add_argument("--tenant", required=True, type=targets.tenant_arg)
    create.add_argument("--url", required=True, help="https:// (plain http to loopback in the local deployment only)")
    create.add_argument(
        "--events",
        type=_events,
        default=list(logic.EVENT_TYPES),
        help=f"comma-separated (default: all of {','.join(logic.EVENT_TYPES)})",
    )
    listing = hooks.add_parser("list", help="a tenant's endpoints (secrets masked)")
    listing.add_argument("--tenant", required=True, type=targets.tenant_arg)
    rotate = hooks.add_parser("rotate", help="replace an endpoint's signing secret and print the new one")
    rotate.add_argument("--tenant", required=True, type=targets.tenant_arg)
    rotate.add_argument("endpoint_id")
    rotate.add_argument("--keep-old-24h", action="store_true", help="also sign with the old secret for 24 hours")
    delete = hooks.add_parser("delete", help="delete an endpoint (pending deliveries to it are dropped)")
    delete.add_argument("--tenant", required=True, type=targets.tenant_arg)
    delete.add_argument("endpoint_id")
    deliveries = hooks.add_parser("deliveries", help="the latest delivery attempts, newest first")
    deliveries.add_argument("--tenant", required=True, type=targets.tenant_arg)
    deliveries.add_argument("--endpoint", dest="endpoint_id")
    deliveries.add_argument("--limit", type=int, default=20)


def _public(record: EndpointRecord) -> dict[str, object]:
    return {
        "id": record.id,
        "url": record.url,
        "events": record.events,
        "created_at": record.created_at,
        "updated_at": record.updated_at,
        "signing_secret_hint": signing.secret_hint(record.secret),
    }


def run(args: argparse.Namespace, repo: WebhookRepo, *, local: bool, now: int, out: TextIO, err: TextIO) -> int:
    if args.action == "create":
        problem = logic.url_problem(args.url, allow_loopback_http=local)
        if problem:
            print(f"batchctl: {problem}", file=err)
            return 2
        record = EndpointRecord(
            tenant=args.tenant,
            id=new_endpoint_id(),
            url=args.url,
            events=args.events,
            secret=signing.new_secret(),
            created_at=now,
            updated_at=now,
        )
        repo.create(record)
        print(json.dumps({**_public(record), "signing_secret": record.secret}, indent=2), file=out)
        print("batchctl: the signing secret is shown once; store it now", file=err)
        return 0
    if args.action == "list":
        print(json.dumps([_public(r) for r in repo.list(args.tenant)], indent=2), file=out)
        return 0
    if args.action == "deliveries":
        attempts = repo.attempts(args.tenant, limit=args.limit, now=now, endpoint_id=args.endpoint_id)
        for a in attempts:
            print(json.dumps(a.model_dump(exclude_none=True, exclude={"tenant"})), file=out)
        return 0
    if args.action == "rotate":
        rotated = repo.rotate(args.tenant, args.endpoint_id, signing.new_secret(), now=now, keep_old=args.keep_old_24h)
        if rotated is None:
            print("batchctl: no such endpoint", file=err)
            return 1
        print(json.dumps({**_public(rotated), "signing_secret": rotated.secret}, indent=2), file=out)
        return 0
    deleted = repo.delete(args.tenant, args.endpoint_id)
    if deleted is None:
        print("batchctl: no such endpoint", file=err)
        return 1
    print(f"deleted webhook endpoint {deleted.id} of tenant {deleted.tenant!r}", file=out)
    return 0
