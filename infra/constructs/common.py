"""Small helpers every construct uses: removal policy, log groups, dead-letter queues, cdk-nag
acknowledgments, table grants."""

from typing import Any, cast

import aws_cdk as cdk
from aws_cdk import aws_ec2 as ec2
from aws_cdk import aws_iam as iam
from aws_cdk import aws_lambda as lambda_
from aws_cdk import aws_lambda_event_sources as sources
from aws_cdk import aws_logs as logs
from aws_cdk import aws_sqs as sqs
from constructs import Construct, IConstruct

from functions.core import schema
from infra import names
from infra.config import DeployConfig


def removal_policy(config: DeployConfig) -> cdk.RemovalPolicy:
    return cdk.RemovalPolicy.DESTROY if config.removal_policy == "destroy" else cdk.RemovalPolicy.RETAIN


def log_group(scope: Construct, id: str, config: DeployConfig) -> logs.LogGroup:
    """A log group with the deployment's retention and removal policy."""
    group = logs.LogGroup(scope, id, removal_policy=removal_policy(config))
    # RetentionDays is a string enum in Python; CloudFormation wants the number of days, which the
    # config has already validated against the values CloudWatch accepts.
    cast(logs.CfnLogGroup, group.node.default_child).retention_in_days = config.log_retention_days
    return group


def vpc_without_nat(
    scope: Construct, config: DeployConfig, *, cidr: str, subnets: list[ec2.SubnetConfiguration], **zones: Any
) -> ec2.Vpc:
    """A VPC (``Vpc``) that idles at zero: no NAT gateway, S3 and DynamoDB through gateway
    endpoints (free), every flow logged (``FlowLogs``); ``zones`` is ``max_azs`` or
    ``availability_zones``."""
    return ec2.Vpc(
        scope,
        "Vpc",
        ip_addresses=ec2.IpAddresses.cidr(cidr),
        **zones,
        nat_gateways=0,
        subnet_configuration=subnets,
        gateway_endpoints={
            "S3": ec2.GatewayVpcEndpointOptions(service=ec2.GatewayVpcEndpointAwsService.S3),
            "DynamoDB": ec2.GatewayVpcEndpointOptions(service=ec2.GatewayVpcEndpointAwsService.DYNAMODB),
        },
        flow_logs={
            "FlowLogs": ec2.FlowLogOptions(
                destination=ec2.FlowLogDestination.to_cloud_watch_logs(log_group(scope, "FlowLogs", config)),
                traffic_type=ec2.FlowLogTrafficType.ALL,
            )
        },
        restrict_default_security_group=False,  # would add a custom-resource Lambda; nothing uses it
    )


def consume_table_stream(
    scope: Construct,
    function: Any,
    table: Any,
    *,
    of: str,
    pattern: dict,
    batching_seconds: int,
    retry_attempts: int,
    also: tuple[dict, ...] = (),
) -> sqs.Queue:
    """``function`` reads the table's stream, invoked only for the records ``pattern`` (an event
    filter) or one of ``also`` passes; batches of up to 100, bisected on error, retried, then sent
    to a new dead-letter queue (returned; ``of`` says whose). The reaper and the audit exporter."""
    dead_letters = dead_letter_queue(scope, "DeadLetters", of=f"the on-failure destination of {of}")
    function.add_event_source(
        sources.DynamoEventSource(
            table,
            starting_position=lambda_.StartingPosition.TRIM_HORIZON,
            batch_size=100,
            max_batching_window=cdk.Duration.seconds(batching_seconds),
            bisect_batch_on_error=True,
            retry_attempts=retry_attempts,
            on_failure=sources.SqsDlq(dead_letters),
            filters=[lambda_.FilterCriteria.filter(p) for p in (pattern, *also)],
        )
    )
    return dead_letters


def dead_letter_queue(scope: Construct, id: str, *, of: str) -> sqs.Queue:
    """A dead-letter queue (SSE, TLS only, 14 days: SQS's longest retention) for ``of``, which is
    what cdk-nag's SQS3 ("has no DLQ of its own") is acknowledged with."""
    queue = sqs.Queue(
        scope, id, encryption=sqs.QueueEncryption.SQS_MANAGED, enforce_ssl=True, retention_period=cdk.Duration.days(14)
    )
    acknowledge(queue, "AwsSolutions-SQS3", f"This queue is itself a dead-letter queue: {of}.")
    return queue


def acknowledge(scope: IConstruct | None, rule: str, reason: str) -> None:
    """Acknowledge (suppress) one cdk-nag finding on ``scope`` and its children, with the reason.
    ``scope`` may be what CDK types as optional (a function's ``role``, a construct's
    ``default_child``): it must be there.

    cdk-nag 3 has no prefix matching: an IAM5 finding is acknowledged with its full id, e.g.
    ``AwsSolutions-IAM5[Resource::*]``."""
    if scope is None:
        raise ValueError(f"nothing to acknowledge {rule} on")
    cdk.Validations.of(scope).acknowledge(cdk.Acknowledgment(id=rule, reason=reason))


def arn_in_findings(resource: Construct) -> str:
    """How cdk-nag writes ``resource``'s ARN in an IAM5 finding id: ``<LogicalId.Arn>``."""
    cfn = resource.node.default_child if not isinstance(resource, cdk.CfnElement) else resource
    stack = cdk.Stack.of(resource)
    return f"<{stack.resolve(stack.get_logical_id(cast(cdk.CfnElement, cfn)))}.Arn>"


def acknowledge_wildcards(scope: IConstruct | None, findings: dict[str, str]) -> None:
    """Acknowledge IAM5 wildcard findings on ``scope``: ``{"Action::s3:GetObject*": reason, ...}``."""
    for finding, reason in findings.items():
        acknowledge(scope, f"AwsSolutions-IAM5[{finding}]", reason)


def resource_prefix(scope: Construct) -> str:
    """The prefix of the stack's named resources (queues, state machine): the stack's name, as the
    local deployment uses ``names.LOCAL_PREFIX``."""
    return cdk.Stack.of(scope).stack_name


def state_machine_arn(scope: Construct) -> str:
    """The batch state machine's ARN, built from its fixed name (``names.state_machine_name``), so
    functions can read it without a reference to the state machine (which invokes one of them)."""
    return cdk.Stack.of(scope).format_arn(
        service="states",
        resource="stateMachine",
        resource_name=names.state_machine_name(resource_prefix(scope)),
        arn_format=cdk.ArnFormat.COLON_RESOURCE_NAME,
    )


def acknowledge_data_grants(
    scope: IConstruct | None, storage: Any, objects: dict[str, str], *, table: str | None
) -> None:
    """IAM5 acknowledgments for ``bucket.grant_read``/``grant_put`` on key patterns (``objects``:
    pattern -> why this role needs those keys) and ``table.grant_read_write_data`` (``table``: why
    this role reads and writes the table; None for a role granted items by ``grant_items``, which
    has no wildcard). ``storage`` is the Storage construct."""
    bucket = arn_in_findings(storage.bucket)
    acknowledge_wildcards(
        scope,
        {
            **{f"Resource::{bucket}/{pattern}": reason for pattern, reason in objects.items()},
            "Action::s3:GetObject*": "grant_read's action group (GetObject, HeadObject, ranged reads), on the key "
            "patterns granted only.",
            "Action::s3:GetBucket*": "grant_read's bucket metadata actions, on this bucket only.",
            "Action::s3:List*": "grant_read's list actions, on this bucket only (a missing key answers 404, not 403).",
            "Action::s3:Abort*": "grant_put's action group: aborting a failed multipart write, on the key patterns "
            "granted only.",
            **(
                {
                    f"Resource::{arn_in_findings(storage.table)}/index/*": "grant_read_write_data includes the table's "
                    f"index (GSI); {table}"
                }
                if table is not None
                else {}
            ),
        },
    )


#: IAM ``StringLike`` patterns of partition keys (``dynamodb:LeadingKeys``), built by the same
#: ``schema`` functions as the keys: every tenant's batch partition (``T#*#BATCHES``) and every
#: batch's chunk partition (``T#*#B#*``). A tenant name has no ``#`` (``records.TENANT_PATTERN``),
#: so neither matches a tenant's own partition ``T#<tenant>`` (files, uploads), its webhook
#: partition ``T#<tenant>#WEBHOOKS``, nor ``KEY#``, ``SCALER#`` or ``IDEMPOTENCY#`` items.
BATCH_PARTITIONS = schema.batches_pk("*")
CHUNK_PARTITIONS = schema.chunks_pk("*", "*")
#: The one partition of the tenant policies (``schema.TENANTS_PK``, no wildcard): ingest reads the
#: batch's tenant's policy (its model allowlist) with one GetItem.
TENANT_POLICIES = schema.TENANTS_PK
#: Every tenant's enqueued-cap counters (``T#*#ENQUEUED``, docs/governance.md): ingest reserves on
#: them, and every terminal batch write releases the batch's reservation in its own transaction.
ENQUEUED_PARTITIONS = schema.enqueued_pk("*")
#: Every tenant's output-token budget items (``T#*#BUDGET``): a counted chunk ADDs to them.
BUDGET_PARTITIONS = schema.budget_pk("*")
#: Every tenant's audit chain (``AUDIT#*``, docs/audit.md): only the audit appender writes there
#: (infra/constructs/audit.py).
AUDIT_PARTITIONS = schema.audit_pk("*")
#: Every tenant's stored-bytes ledger (``T#*#STORAGE``, docs/governance.md): its counter and markers.
STORED_PARTITIONS = schema.stored_pk("*")
#: API key items (``KEY#<sha256>``): the only items the authorizer reads.
KEY_ITEMS = schema.key_pk("*")
#: The API's writes (``grant_api_writes``): a tenant's own partition (files, uploads, parts; a
#: tenant name has no ``#``, so ``T#*`` minus ``T#*#*`` is exactly those), and these partitions:
#: batches, creation and request counters, the stored-bytes ledger and powertools'
#: idempotency records (its audit records go to the audit queue). Never ``KEY#``, a tenant's key listing, ``KEYID#`` or
#: ``TENANTS`` (keys and policies are the operator's, ``batchctl``), budgets, enqueued counters,
#: chunk partitions or webhook records.
API_OWN_PARTITIONS = schema.tenant_pk("*")
NOT_OWN_PARTITIONS = schema.tenant_pk("*#*")
API_WRITE_PARTITIONS = (
    schema.batches_pk("*"),
    schema.creations_pk("*"),
    schema.requests_pk("*"),
    STORED_PARTITIONS,
    "IDEMPOTENCY#*",
)
API_WRITE_ACTIONS = ("dynamodb:PutItem", "dynamodb:UpdateItem", "dynamodb:DeleteItem")


def grant_release(role: iam.IGrantable, storage: Any) -> iam.PolicyStatement:
    """A role that makes a batch terminal (``BatchRepo.update``/``finish``) releases its
    enqueued-cap reservation in the same transaction: UpdateItem (an ADD) on ``T#*#ENQUEUED``.
    Granted whether or not governance is on: the release depends on what the batch holds, which
    may predate a switch of the deployment's config."""
    return grant_items(role, storage, ("dynamodb:UpdateItem",), (ENQUEUED_PARTITIONS,))


def grant_charge(role: iam.IGrantable, storage: Any) -> iam.PolicyStatement:
    """The audit appender charges a counted chunk's budget with its receipt
    (``AuditStore.put``): UpdateItem (an ADD) on ``T#*#BUDGET``. No other role writes budget
    items (the table's policy denies it, ``infra/constructs/audit.py``)."""
    return grant_items(role, storage, ("dynamodb:UpdateItem",), (BUDGET_PARTITIONS,))


def grant_watch(role: iam.IGrantable, storage: Any) -> iam.PolicyStatement:
    """The GPU worker reads a tenant's budget item (GetItem on ``T#*#BUDGET``) to stop the lines
    of a batch whose ``stop`` budget is used up (``gpu_worker/budget.py``). Unconditional for the
    same reason as ``grant_release``: a message may carry a ``budget_stop`` from before the switch."""
    return grant_items(role, storage, ("dynamodb:GetItem",), (BUDGET_PARTITIONS,))


def grant_storage_release(role: iam.IGrantable, storage: Any) -> iam.PolicyStatement:
    """A role that removes files or uploads (the reaper, on the stream) releases what they held
    on the tenant's stored-bytes ledger: DeleteItem (the marker) and UpdateItem (the counter's ADD)
    on ``T#*#STORAGE``, in one transaction. Granted whether or not governance is on: what a record
    holds may predate a switch of the deployment's config."""
    return grant_items(role, storage, ("dynamodb:DeleteItem", "dynamodb:UpdateItem"), (STORED_PARTITIONS,))


def grant_storage_charge(role: iam.IGrantable, storage: Any) -> iam.PolicyStatement:
    """A role that creates a batch's output files (the workflow's finalize) counts them on the
    tenant's stored-bytes ledger in the same transaction: PutItem (their markers) and UpdateItem
    (the counter's ADD) on ``T#*#STORAGE``."""
    return grant_items(role, storage, ("dynamodb:PutItem", "dynamodb:UpdateItem"), (STORED_PARTITIONS,))


def grant_api_writes(role: iam.IGrantable, storage: Any) -> list[iam.PolicyStatement]:
    """The API's table writes (``API_WRITE_PARTITIONS``, its own partitions); its reads are
    ``grant_read_data``'s, its audit records are sends to the audit queue."""
    return [
        grant_items(role, storage, API_WRITE_ACTIONS, (API_OWN_PARTITIONS,), excluding=(NOT_OWN_PARTITIONS,)),
        grant_items(role, storage, API_WRITE_ACTIONS, API_WRITE_PARTITIONS),
    ]


def grant_items(
    role: iam.IGrantable,
    storage: Any,
    actions: tuple[str, ...],
    leading_keys: tuple[str, ...],
    *,
    excluding: tuple[str, ...] = (),
) -> iam.PolicyStatement:
    """Allow ``actions`` on the table's items whose partition key matches one of ``leading_keys``
    (IAM ``StringLike`` patterns) and none of ``excluding`` (``StringNotLike``), and nothing else.
    ``ForAllValues`` with only item actions: every key a request names must match (an empty set
    could only come from a Scan, which is not granted). The table's ARN only: no index.
    ``storage`` is the Storage construct."""
    conditions: dict[str, Any] = {"ForAllValues:StringLike": {"dynamodb:LeadingKeys": list(leading_keys)}}
    if excluding:
        conditions["ForAllValues:StringNotLike"] = {"dynamodb:LeadingKeys": list(excluding)}
    statement = iam.PolicyStatement(actions=list(actions), resources=[storage.table.table_arn], conditions=conditions)
    role.grant_principal.add_to_principal_policy(statement)
    return statement
