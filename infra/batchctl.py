"""batchctl: the operator and user CLI of a deployment.

    batchctl keys create --tenant NAME     prints a new key for NAME
    batchctl keys revoke KEY               revokes KEY
    batchctl files upload PATH             uploads a file (large ones through the Uploads API)
    batchctl batches create|get|list|cancel|wait|download ...   (see infra/cli_batches.py)
    batchctl run-batch -i IN -o OUT [--errors ERR] --engine-url URL
                                           runs a local batch file through an engine (no AWS)

Target: the local deployment (``make up``) when its state file exists and its moto answers;
otherwise AWS, through the standard credential chain and the outputs of the CloudFormation stack
(``--stack``, else ``BATCHAPI_STACK``, else the default name). ``--local``/``--aws`` force one.
"""

import argparse
import os
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

import boto3
from botocore.config import Config
from botocore.exceptions import BotoCoreError, ClientError

from functions.core import auth
from functions.core.records import check_tenant
from functions.core.stores import KeyRepo, Table
from infra import cli_batches, names
from infra.local import state as local_state

STACK_ENV = "BATCHAPI_STACK"
#: A short, single-attempt probe: is the local deployment there?
_PROBE_CONFIG = Config(connect_timeout=1, read_timeout=2, retries={"total_max_attempts": 1})
_CONFIG = Config(retries={"mode": "standard", "max_attempts": 5})


class TargetError(Exception):
    """No deployment to talk to (the message says why and what to do)."""


@dataclass(frozen=True)
class Target:
    """Where the deployment's table lives. ``endpoint_url`` is set for the local deployment only."""

    kind: str  # "local" | "aws"
    table_name: str
    endpoint_url: str | None = None
    region: str | None = None
    description: str = ""


# --- Target resolution ------------------------------------------------------------------------
def local_target(state: local_state.LocalState) -> Target:
    return Target(
        kind="local", table_name=state.table_name, endpoint_url=state.moto_endpoint, region=state.region,
        description=f"local deployment at {state.api_base_url}",
    )


def local_session(region: str) -> boto3.Session:
    return boto3.Session(
        aws_access_key_id=local_state.ACCESS_KEY_ID,
        aws_secret_access_key=local_state.SECRET_ACCESS_KEY,
        region_name=region,
    )


def local_answers(state: local_state.LocalState) -> bool:
    """True if the moto endpoint in ``state`` answers and holds the deployment's table."""
    client = local_session(state.region).client("dynamodb", endpoint_url=state.moto_endpoint, config=_PROBE_CONFIG)
    try:
        client.describe_table(TableName=state.table_name)
    except (BotoCoreError, ClientError):
        return False
    return True


def stack_outputs(cloudformation: Any, stack: str) -> dict[str, str]:
    try:
        stacks = cloudformation.describe_stacks(StackName=stack)["Stacks"]
    except ClientError as exc:
        raise TargetError(f"cannot read stack {stack!r}: {exc.response['Error'].get('Message', exc)}") from None
    except BotoCoreError as exc:
        raise TargetError(f"cannot reach AWS: {exc}") from None
    return {o["OutputKey"]: o["OutputValue"] for o in stacks[0].get("Outputs", [])}


def aws_target(cloudformation: Any, stack: str) -> Target:
    outputs = stack_outputs(cloudformation, stack)
    if names.OUTPUT_TABLE not in outputs:
        raise TargetError(f"stack {stack!r} has no {names.OUTPUT_TABLE!r} output (is it this project's stack?)")
    api = outputs.get(names.OUTPUT_API_URL, "?")
    return Target(kind="aws", table_name=outputs[names.OUTPUT_TABLE], description=f"stack {stack} ({api})")


def api_url(cloudformation: Any, stack: str) -> str:
    outputs = stack_outputs(cloudformation, stack)
    if names.OUTPUT_API_URL not in outputs:
        raise TargetError(f"stack {stack!r} has no {names.OUTPUT_API_URL!r} output (is it this project's stack?)")
    return outputs[names.OUTPUT_API_URL]


def resolve_target(
    mode: str | None,
    *,
    state: local_state.LocalState | None,
    answers: Callable[[local_state.LocalState], bool],
    aws: Callable[[], Target],
) -> Target:
    """``mode`` is "local", "aws" or None (local if it runs, else AWS)."""
    if mode != "aws" and state is not None and answers(state):
        return local_target(state)
    if mode == "local":
        raise TargetError("no local deployment is running (start it with `make up`)")
    if mode == "aws":
        return aws()
    try:
        return aws()
    except (TargetError, BotoCoreError, ClientError) as exc:
        raise TargetError(f"no local deployment is running (`make up`), and AWS failed: {exc}") from None


def key_repo(target: Target) -> KeyRepo:
    if target.kind == "local":
        session = local_session(target.region or local_state.REGION)
    else:
        session = boto3.Session()  # the standard credential chain
    dynamodb = session.resource("dynamodb", endpoint_url=target.endpoint_url, config=_CONFIG)
    return KeyRepo(Table(dynamodb.Table(target.table_name)))


# --- Commands ---------------------------------------------------------------------------------
def create_key(keys: KeyRepo, tenant: str, now: int) -> str:
    return auth.create_key(keys, tenant, now=now)


def revoke_key(keys: KeyRepo, key: str) -> str | None:
    """Revoke ``key``; returns its tenant, or None if there was no such key."""
    record = auth.revoke_key(keys, key)
    return record.tenant if record else None


# --- CLI --------------------------------------------------------------------------------------
def _tenant(value: str) -> str:
    try:
        return check_tenant(value)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="batchctl", description="Administer a Batch API deployment.")
    where = p.add_mutually_exclusive_group()
    where.add_argument("--local", dest="target", action="store_const", const="local",
                       help="use the running local deployment (make up)")
    where.add_argument("--aws", dest="target", action="store_const", const="aws",
                       help="use the deployed stack (standard AWS credential chain)")
    p.add_argument("--stack", help=f"CloudFormation stack name (default: ${STACK_ENV} or {names.STACK_NAME})")
    commands = p.add_subparsers(dest="command", required=True)
    keys = commands.add_parser("keys", help="API keys").add_subparsers(dest="action", required=True)
    create = keys.add_parser("create", help="create a key for a tenant and print it")
    create.add_argument("--tenant", required=True, type=_tenant, help="tenant name: 1-64 of [A-Za-z0-9_.-]")
    revoke = keys.add_parser("revoke", help="revoke a key")
    revoke.add_argument("key")
    cli_batches.add_parsers(commands)
    from gpu_worker import offline  # run-batch: the worker's offline mode (no AWS)

    offline.add_parser(commands)
    return p


def run(args: argparse.Namespace, keys: KeyRepo, *, now: int, out: TextIO, err: TextIO) -> int:
    if args.action == "create":
        print(create_key(keys, args.tenant, now), file=out)
        return 0
    tenant = revoke_key(keys, args.key)
    if tenant is None:
        print("batchctl: no such key", file=err)
        return 1
    print(f"revoked the key of tenant {tenant!r}", file=out)
    return 0


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
    stack = args.stack or env.get(STACK_ENV) or names.STACK_NAME
    path: Path = local_state.state_path(env)
    if args.command in ("files", "batches"):
        state = local_state.LocalState.read(path)
        return cli_batches.main_user(
            args, env,
            local_base_url=state.api_base_url if state is not None and local_answers(state) else None,
            aws_base_url=lambda: api_url(boto3.Session().client("cloudformation", config=_CONFIG), stack),
            out=out, err=err,
        )
    try:
        target = resolve_target(
            args.target,
            state=local_state.LocalState.read(path),
            answers=local_answers,
            aws=lambda: aws_target(boto3.Session().client("cloudformation", config=_CONFIG), stack),
        )
        print(f"batchctl: {target.description}", file=err)
        return run(args, key_repo(target), now=int(time.time()), out=out, err=err)
    except TargetError as exc:
        print(f"batchctl: {exc}", file=err)
        return 1
    except (BotoCoreError, ClientError) as exc:
        print(f"batchctl: AWS call failed: {exc}", file=err)
        return 1


if __name__ == "__main__":
    sys.exit(main())
