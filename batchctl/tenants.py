"""``batchctl tenants create|get|set|list|disable|enable``: tenant policies
(``functions.core.tenants``), written straight into the deployment's table, effective at the next
batch create / ingest (no redeploy); the per-request checks (``--requests-per-minute``, disabled)
within the API's policy cache (``BATCHAPI_POLICY_CACHE_SECONDS``, 5 s).

A tenant without a record has the default policy (the defaults: every served model, no
limits). ``create`` refuses an existing record; ``set`` changes only the options given (on the
stored policy, or the default one); ``none`` clears a limit, ``all`` clears an allowlist (for
``--allowed-media-domains``: the deployment's hosts apply; ``none`` there: ``data:`` URLs only).
``disable`` marks the policy and every key of the tenant disabled (the authorizer refuses them:
at once locally, within the authorizer's result cache on AWS); ``enable`` undoes it."""

import argparse
import json
import time
from typing import Any, TextIO

from pydantic import ValidationError

from functions.core import auth, guard
from functions.core.aws.tenants import TenantRepo
from functions.core.ports import AuditLog, KeyStore
from functions.core.tenants import TenantPolicy, default_policy
from functions.core.work import PolicyBounds

from . import audit, targets
from .targets import Target


def tenant_repo(target: Target) -> TenantRepo:
    return TenantRepo(targets.table(target))


def _count(value: str) -> int | None:
    if value == "none":
        return None
    try:
        number = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number or 'none', got {value!r}") from None
    if number < 0:
        raise argparse.ArgumentTypeError(f"must not be negative: {value}")
    return number


def _switch(value: str) -> bool:
    if value not in ("on", "off"):
        raise argparse.ArgumentTypeError(f"expected on or off, got {value!r}")
    return value == "on"


def _per_minute(value: str) -> int | None:
    number = _count(value)
    if number == 0:
        raise argparse.ArgumentTypeError(
            "must be at least 1 (to refuse every request of a tenant: batchctl tenants disable)"
        )
    return number


#: Size suffixes ``--max-stored-bytes`` accepts (decimal and binary).
_SIZES = {"kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12, "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}


def _size(value: str) -> int | None:
    """A byte count: a whole number, optionally with a suffix (``500MB``, ``10GiB``), or 'none'."""
    if value == "none":
        return None
    text = value.strip().lower().replace(" ", "")
    digits = text.rstrip("kmgtib")
    unit = text[len(digits) :]
    if not digits.isdigit() or (unit and unit not in _SIZES):
        raise argparse.ArgumentTypeError(
            f"expected a byte count such as 1000000, 500MB or 10GiB (KB/MB/GB/TB, KiB/MiB/GiB/TiB), or 'none', got {value!r}"
        )
    return int(digits) * _SIZES.get(unit, 1)


def _models(value: str) -> list[str] | None:
    if value == "all":
        return None
    models = [m.strip() for m in value.split(",") if m.strip()]
    if not models:
        raise argparse.ArgumentTypeError("expected a comma-separated list of models, or 'all'")
    return models


def _hosts(value: str) -> list[str] | None:
    """``--allowed-media-domains``: hosts (comma-separated), ``all`` (the deployment's) or ``none``
    (no host: ``data:`` URLs only)."""
    if value == "all":
        return None
    if value == "none":
        return []
    hosts = [h.strip().lower() for h in value.split(",") if h.strip()]
    if not hosts:
        raise argparse.ArgumentTypeError("expected a comma-separated list of hosts, 'all' or 'none'")
    return hosts


def _cap(value: str) -> tuple[str, int | None]:
    model, sep, number = value.rpartition("=")
    if not sep or not model:
        raise argparse.ArgumentTypeError(f"expected MODEL=N (or MODEL=none), got {value!r}")
    return model, _count(number)


def _policy_options(parser: argparse.ArgumentParser) -> None:
    """The policy's options; an option not given is absent from the namespace (SUPPRESS), so
    ``none``/``all`` (None) can clear a value."""
    parser.add_argument("--tenant", required=True, type=targets.tenant_arg, help="tenant name: 1-64 of [A-Za-z0-9_.-]")
    option = parser.add_argument_group("policy").add_argument
    unset = argparse.SUPPRESS
    option("--allowed-models", type=_models, default=unset, help="comma-separated models this tenant may use, or 'all'")
    option(
        "--allowed-media-domains",
        type=_hosts,
        default=unset,
        metavar="HOSTS",
        help="comma-separated hosts audio lines may fetch from, within the deployment's allowed_media_domains "
        "(a host it does not list stays refused); 'all': the deployment's; 'none': data: URLs only",
    )
    option("--batches-per-hour", type=_count, default=unset, help="batch creations per clock hour, or 'none'")
    option(
        "--max-enqueued-requests",
        type=_cap,
        action="append",
        default=unset,
        metavar="MODEL=N",
        help="per model: requests enqueued at once, or MODEL=none (over it a batch fails: token_limit_exceeded); repeatable",
    )
    option(
        "--max-enqueued-tokens",
        type=_cap,
        action="append",
        default=unset,
        metavar="MODEL=N",
        help="per model: prompt tokens enqueued at once (estimated: bytes / 4), or MODEL=none; repeatable",
    )
    option(
        "--output-token-budget",
        type=_count,
        default=unset,
        help="output tokens per period (every attempt's, charged as chunks are counted), or 'none'",
    )
    option("--input-token-budget", type=_count, default=unset, help="input (prompt) tokens per period, or 'none'")
    option("--budget-period", choices=("day", "month"), default=unset)
    option("--budget-action", choices=("reject", "stop"), default=unset)
    option(
        "--requests-per-minute",
        type=_per_minute,
        default=unset,
        help="API requests per clock minute, every route (over it: 429 with Retry-After), or 'none'",
    )
    option(
        "--max-stored-bytes",
        type=_size,
        default=unset,
        metavar="BYTES",
        help="bytes of files and pending uploads the tenant may hold (500MB, 10GiB...; over it a create is a 400), or 'none'",
    )
    option(
        "--reserve-output-tokens",
        type=_switch,
        default=unset,
        help="on|off: the token cap also reserves the output tokens the lines ask for",
    )
    bounds = parser.add_argument_group(
        "work one line may ask (lower than the deployment's; 'none' leaves the deployment's)"
    ).add_argument
    for name, what in (
        ("max-n", "n (or best_of) per line"),
        ("max-inputs", "inputs per line (prompts, embedding inputs, documents)"),
        ("max-output-tokens", "output tokens per line, all its sequences together"),
    ):
        bounds(f"--line-{name}", type=_count, default=unset, help=f"{what}, or 'none'")
    guard.add_arguments(parser.add_argument_group("prompt and output policy"), default=unset)


def add_parsers(commands: argparse._SubParsersAction) -> None:
    tenants = commands.add_parser("tenants", help="tenant policies").add_subparsers(dest="action", required=True)
    _policy_options(tenants.add_parser("create", help="store a tenant's policy (refused if it has one)"))
    _policy_options(tenants.add_parser("set", help="change the options given of a tenant's policy"))
    get = tenants.add_parser("get", help="print a tenant's policy (the default one if none is stored)")
    get.add_argument("--tenant", required=True, type=targets.tenant_arg)
    tenants.add_parser("list", help="print every stored policy, one JSON object a line")
    for action, what in (
        ("disable", "refuse every key of a tenant (the authorizer answers 401 account_deactivated)"),
        ("enable", "accept a disabled tenant's keys again"),
    ):
        switch = tenants.add_parser(action, help=what)
        switch.add_argument("name", nargs="?", type=targets.tenant_arg, metavar="TENANT")
        switch.add_argument("--tenant", type=targets.tenant_arg, help="the tenant (or give it as TENANT)")


def apply(policy: TenantPolicy, args: argparse.Namespace, *, now: int) -> TenantPolicy:
    """``policy`` with the options given in ``args`` (options not given keep their value)."""
    data: dict[str, Any] = policy.model_dump()
    given = vars(args)
    for name in (
        "allowed_models",
        "allowed_media_domains",
        "batches_per_hour",
        "output_token_budget",
        "input_token_budget",
        "budget_period",
        "budget_action",
        "reserve_output_tokens",
        "requests_per_minute",
        "max_stored_bytes",
    ):
        if name in given:
            data[name] = given[name]
    line_bounds = {name: given[f"line_{name}"] for name in PolicyBounds.model_fields if f"line_{name}" in given}
    if line_bounds:
        data["line_bounds"] = {**(data["line_bounds"] or {}), **line_bounds}
    for name in ("max_enqueued_requests", "max_enqueued_tokens"):
        for model, number in given.get(name) or ():
            if number is None:
                data[name].pop(model, None)
            else:
                data[name][model] = number
    if any(name in given for name in ("prompt_secrets", "output_deny", "output_check")):
        updated = guard.from_arguments(args, policy.guard)
        assert updated is not None  # an option was given
        data["guard"] = updated.model_dump()
    data["updated_at"] = now
    return TenantPolicy.model_validate(data)


def show(policy: TenantPolicy) -> str:
    return json.dumps(policy.model_dump(), sort_keys=True)


def run(
    args: argparse.Namespace,
    tenants: TenantRepo,
    *,
    now: int | None = None,
    out: TextIO,
    err: TextIO,
    audit_store: AuditLog | None = None,
    keys: KeyStore | None = None,
) -> int:
    """``keys``: the key store ``disable``/``enable`` mark."""
    now = int(time.time()) if now is None else now
    if args.action == "list":
        for policy in tenants.list():
            print(show(policy), file=out)
        return 0
    if args.action in ("disable", "enable"):
        tenant = args.name or args.tenant
        if not tenant or (args.name and args.tenant and args.name != args.tenant):
            print(f"batchctl: tenants {args.action}: give one tenant (TENANT or --tenant)", file=err)
            return 2
        assert keys is not None
        policy, changed = auth.set_disabled(keys, tenants, tenant, args.action == "disable", now=now)
        details = {"policy": policy.model_dump(mode="json"), "keys": changed}
        audit.note(audit_store, tenant, f"tenants.{args.action}", target=tenant, details=details, now=now)
        print(show(policy), file=out)
        print(f"batchctl: tenant {tenant!r} {args.action}d ({changed} keys marked)", file=err)
        return 0
    stored = tenants.get(args.tenant)
    if args.action == "get":
        if stored is None:
            print(f"batchctl: tenant {args.tenant!r} has no policy: the defaults apply", file=err)
        policy = stored or default_policy(args.tenant)
        # With the current usage of its caps and budget (docs/governance.md), when it has any.
        print(json.dumps({**policy.model_dump(), "usage": tenants.usage(policy, now=now)}, sort_keys=True), file=out)
        return 0
    if args.action == "create" and stored is not None:
        print(f"batchctl: tenant {args.tenant!r} already has a policy (change it with `tenants set`)", file=err)
        return 1
    try:
        policy = apply(stored or default_policy(args.tenant), args, now=now)
    except ValidationError as exc:
        print(f"batchctl: invalid policy: {exc.errors()[0]['msg']}", file=err)
        return 2
    except ValueError as exc:  # a stored deny pattern RE2 cannot run (guard.GuardPolicy.compiled)
        print(f"batchctl: invalid policy: {exc}", file=err)
        return 2
    tenants.put(policy)
    # The tenant's audit chain records the change and the policy as now stored (docs/audit.md).
    audit.note(
        audit_store,
        args.tenant,
        f"tenants.{args.action}",
        target=args.tenant,
        details={"policy": policy.model_dump(mode="json")},
        now=now,
    )
    print(show(policy), file=out)
    return 0
