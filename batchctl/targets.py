"""Which deployment batchctl talks to.

The local deployment (``make up``) when its state file exists and its moto answers; otherwise AWS,
through the standard credential chain and the outputs of the CloudFormation stack (``--stack``,
else ``BATCHAPI_STACK``, else the default name). ``--local``/``--aws`` force one. The region is
``AWS_REGION`` if set (the variable the AWS CLI v2 and the other SDKs read, and boto3 does not),
else boto3's own chain (``AWS_DEFAULT_REGION``, the profile).
"""

import argparse
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import boto3
from botocore.config import Config
from botocore.exceptions import BotoCoreError, ClientError

from functions.core.aws.dynamodb import Table
from functions.core.records import check_tenant
from infra import names
from infra.local import state as local_state

#: A short, single-attempt probe: is the local deployment there?
_PROBE_CONFIG = Config(connect_timeout=1, read_timeout=2, retries={"total_max_attempts": 1})
CONFIG = Config(retries={"mode": "standard", "max_attempts": 5})


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
    #: The audit chains' queue and Object Lock bucket, and the checkpoints' key: a KMS key ARN
    #: (AWS) or a public key PEM file (local). Empty: the deployment keeps no audit chain.
    audit_queue_url: str = ""
    audit_bucket: str = ""
    audit_key: str = ""


def local_target(state: local_state.LocalState) -> Target:
    return Target(
        kind="local",
        table_name=state.table_name,
        endpoint_url=state.moto_endpoint,
        region=state.region,
        description=f"local deployment at {state.api_base_url}",
        audit_queue_url=state.audit_queue_url,
        audit_bucket=state.audit_bucket_name,
        audit_key=state.audit_public_key_file,
    )


def session(target: Target) -> boto3.Session:
    """A session for ``target``: the local deployment's moto credentials, or the standard chain."""
    if target.kind == "local":
        return local_session(target.region or local_state.REGION)
    return boto3.Session(region_name=target.region)


def client(target: Target, service: str) -> Any:
    """A client of ``service`` for ``target`` (its endpoint and region)."""
    return session(target).client(service, endpoint_url=target.endpoint_url, config=CONFIG)


def local_session(region: str) -> boto3.Session:
    return boto3.Session(
        aws_access_key_id=local_state.ACCESS_KEY_ID,
        aws_secret_access_key=local_state.SECRET_ACCESS_KEY,
        region_name=region,
    )


def table(target: Target) -> Table:
    """The target's table: the local deployment's moto with its fixed credentials, or the standard
    chain (region: ``aws_region``) for a deployed stack."""
    dynamodb = session(target).resource("dynamodb", endpoint_url=target.endpoint_url, config=CONFIG)
    return Table(dynamodb.Table(target.table_name))


def tenant_arg(value: str) -> str:
    """An argparse ``type`` for ``--tenant``: the tenant-name rule, as a usage error."""
    try:
        return check_tenant(value)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def local_answers(state: local_state.LocalState) -> bool:
    """True if the moto endpoint in ``state`` answers and holds the deployment's table."""
    client = local_session(state.region).client("dynamodb", endpoint_url=state.moto_endpoint, config=_PROBE_CONFIG)
    try:
        client.describe_table(TableName=state.table_name)
    except (BotoCoreError, ClientError):
        return False
    return True


def aws_region(env: Mapping[str, str]) -> str | None:
    """``AWS_REGION`` if set, else None (boto3's chain decides)."""
    return env.get("AWS_REGION") or None


def cloudformation(region: str | None = None) -> Any:
    return boto3.Session(region_name=region).client("cloudformation", config=CONFIG)


def stack_outputs(cloudformation: Any, stack: str) -> dict[str, str]:
    try:
        stacks = cloudformation.describe_stacks(StackName=stack)["Stacks"]
    except ClientError as exc:
        raise TargetError(f"cannot read stack {stack!r}: {exc.response['Error'].get('Message', exc)}") from None
    except BotoCoreError as exc:
        raise TargetError(f"cannot reach AWS: {exc}") from None
    return {o["OutputKey"]: o["OutputValue"] for o in stacks[0].get("Outputs", [])}


def output(outputs: dict[str, str], stack: str, key: str) -> str:
    """The stack output ``key`` (``infra/names.py`` OUTPUT_*), or a TargetError that says which."""
    if key not in outputs:
        raise TargetError(f"stack {stack!r} has no {key!r} output (is it this project's stack?)")
    return outputs[key]


def target_from_outputs(outputs: dict[str, str], stack: str, region: str | None = None) -> Target:
    api = outputs.get(names.OUTPUT_API_URL, "?")
    return Target(
        kind="aws",
        table_name=output(outputs, stack, names.OUTPUT_TABLE),
        region=region,
        description=f"stack {stack} ({api})",
        audit_queue_url=outputs.get(names.OUTPUT_AUDIT_QUEUE, ""),
        audit_bucket=outputs.get(names.OUTPUT_AUDIT_BUCKET, ""),
        audit_key=outputs.get(names.OUTPUT_AUDIT_KEY, ""),
    )


def aws_target(cloudformation: Any, stack: str, region: str | None = None) -> Target:
    return target_from_outputs(stack_outputs(cloudformation, stack), stack, region)


def api_url(cloudformation: Any, stack: str) -> str:
    return output(stack_outputs(cloudformation, stack), stack, names.OUTPUT_API_URL)


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
