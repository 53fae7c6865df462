"""batchctl's parser and entry point (``main``); the package docstring lists the commands."""

import argparse
import os
import sys
import time
from collections.abc import Mapping, Sequence
from typing import TextIO

from botocore.exceptions import BotoCoreError, ClientError

from infra.local import state as local_state

from . import audit, batches, keys, targets, tenants, webhooks
from .settings import STACK_ENV, CliSettings


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="batchctl", description="Administer a Batch API deployment.")
    where = p.add_mutually_exclusive_group()
    where.add_argument(
        "--local", dest="target", action="store_const", const="local", help="use the running local deployment (make up)"
    )
    where.add_argument(
        "--aws",
        dest="target",
        action="store_const",
        const="aws",
        help="use the deployed stack (standard AWS credential chain)",
    )
    p.add_argument("--stack", help=f"CloudFormation stack name (default: ${STACK_ENV} or {CliSettings().stack})")
    commands = p.add_subparsers(dest="command", required=True)
    keys.add_parsers(commands)
    tenants.add_parsers(commands)
    webhooks.add_parsers(commands)
    audit.add_parsers(commands)
    batches.add_parsers(commands)
    from gpu_worker import offline  # run-batch: the worker's offline mode (no AWS)

    offline.add_parser(commands)
    return p


def main(
    argv: Sequence[str] | None = None,
    *,
    env: Mapping[str, str] | None = None,
    out: TextIO | None = None,
    err: TextIO | None = None,
) -> int:
    env = os.environ if env is None else env
    out, err = out or sys.stdout, err or sys.stderr
    args = parser().parse_args(argv)
    if args.command == "run-batch":
        from gpu_worker import offline

        return offline.command(args, err=err)
    try:
        settings = CliSettings.from_env(env)
    except ValueError as exc:
        print(f"batchctl: bad environment: {exc}", file=err)
        return 2
    stack = args.stack or settings.stack
    region = targets.aws_region(env)
    path = local_state.state_file(settings.local_state_dir)
    if args.command in ("files", "batches"):
        state = local_state.LocalState.read(path)
        return batches.main_user(
            args,
            settings,
            local_base_url=state.api_base_url if state is not None and targets.local_answers(state) else None,
            aws_base_url=lambda: targets.api_url(targets.cloudformation(region), stack),
            out=out,
            err=err,
        )
    try:
        target = targets.resolve_target(
            args.target,
            state=local_state.LocalState.read(path),
            answers=targets.local_answers,
            aws=lambda: targets.aws_target(targets.cloudformation(region), stack, region),
        )
        print(f"batchctl: {target.description}", file=err)
        if args.command == "webhooks":
            return webhooks.run(
                args,
                webhooks.webhook_repo(target),
                local=target.kind == "local",
                now=int(time.time()),
                out=out,
                err=err,
            )
        if args.command == "audit":
            return run_audit(args, target, out=out, err=err)
        if args.command == "tenants":
            return tenants.run(
                args,
                tenants.tenant_repo(target),
                now=int(time.time()),
                out=out,
                err=err,
                audit_store=audit.audit_log(target),
                keys=keys.key_repo(target),
            )
        return keys.run(
            args,
            keys.key_repo(target),
            now=int(time.time()),
            out=out,
            err=err,
            audit_store=audit.audit_log(target),
            tenants=tenants.tenant_repo(target),
        )
    except targets.TargetError as exc:
        print(f"batchctl: {exc}", file=err)
        return 1
    except (BotoCoreError, ClientError) as exc:
        print(f"batchctl: AWS call failed: {exc}", file=err)
        return 1


def run_audit(args: argparse.Namespace, target: targets.Target, *, out: TextIO, err: TextIO) -> int:
    """``batchctl audit``: a target that cannot be read is ``audit.UNVERIFIABLE`` (3), never
    ``BROKEN`` (1), so a script can tell a tampered chain from an unreachable one."""
    try:
        s3 = audit.s3_client(target) if getattr(args, "s3", None) else None
        verifying = args.action in ("verify", "public-key")
        worm = audit.worm_store(target, getattr(args, "worm", None)) if args.action == "verify" else None
        key = audit.public_key(target, getattr(args, "public_key", None)) if verifying else None
        return audit.run(args, audit.audit_repo(target), out=out, err=err, s3=s3, worm=worm, key=key)
    except (BotoCoreError, ClientError, OSError, ValueError) as exc:
        print(f"batchctl: cannot read the audit chain or its anchors: {exc}", file=err)
        return audit.UNVERIFIABLE if args.action in ("verify", "public-key") else 1


if __name__ == "__main__":
    sys.exit(main())
