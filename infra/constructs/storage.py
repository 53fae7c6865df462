"""Storage: the one bucket (file bytes, upload parts, later batch inputs and outputs) and the one
DynamoDB table (every record), built from ``functions.core.schema`` like the local deployment."""

import math
from typing import Any

import aws_cdk as cdk
from aws_cdk import aws_dynamodb as dynamodb
from aws_cdk import aws_s3 as s3
from constructs import Construct

from functions.core import limits, schema
from functions.core.settings import Settings
from infra.config import DeployConfig

from .common import acknowledge, removal_policy

_ATTRIBUTE_TYPES = {
    "S": dynamodb.AttributeType.STRING,
    "N": dynamodb.AttributeType.NUMBER,
    "B": dynamodb.AttributeType.BINARY,
}
_PROJECTIONS = {
    "ALL": dynamodb.ProjectionType.ALL,
    "KEYS_ONLY": dynamodb.ProjectionType.KEYS_ONLY,
    "INCLUDE": dynamodb.ProjectionType.INCLUDE,
}
_BILLING = {"PAY_PER_REQUEST": dynamodb.BillingMode.PAY_PER_REQUEST, "PROVISIONED": dynamodb.BillingMode.PROVISIONED}
_STREAM_VIEWS = {v.value: v for v in dynamodb.StreamViewType}

#: Top-level S3 prefix of Uploads parts (schema builds keys as ``uploads/<tenant>/<upload>/<part>``).
UPLOADS_PREFIX = schema.upload_prefix("t", "u").split("/", 1)[0] + "/"
#: Uploads accept parts for UPLOAD_EXPIRY_SECONDS; their leftover parts go a day after that.
UPLOAD_PARTS_EXPIRY_DAYS = math.ceil(limits.UPLOAD_EXPIRY_SECONDS / 86_400) + 1
#: Incomplete S3 multipart uploads (assembling a File from parts) are aborted after this.
ABORT_MULTIPART_DAYS = 1
#: Batch data (``schema.BATCHES_PREFIX``): the lifecycle rule's prefix.
BATCHES_PREFIX = schema.BATCHES_PREFIX
#: Slack on top of the longest a batch stays open: a day of sweeper outage before batch data of a
#: batch still open could go (the sweeper ends every batch by its expiry plus minutes).
OPEN_SLACK_DAYS = 1


def longest_open_seconds(settings: Settings) -> int:
    """The longest a batch stays open after its creation: its completion window (the longest the
    deployment accepts), the expiry grace, the drain grace and one sweep period (docs/lifecycle.md,
    "Liveness": the sweeper ends every open batch by then)."""
    window = max(limits.window_seconds(w) for w in settings.completion_windows)
    return window + settings.expiry_grace_seconds + settings.drain_grace_seconds + settings.sweep_seconds


def batch_data_expiry_days(config: DeployConfig) -> int:
    """Days after its creation the lifecycle removes an object under ``batches/``.

    Every object of a batch is written between the batch's creation and its end, and a batch ends
    at most ``longest_open_seconds`` after its creation; so an object removed this many days after
    it was written is removed at least ``batch_data_retention_days`` after the batch ended (never
    while it is open), and at most that plus the longest open time plus ``OPEN_SLACK_DAYS`` (plus
    S3's rounding to the next midnight UTC and its asynchronous removal)."""
    settings = config.settings(table_name="-", bucket_name="-")
    return config.batch_data_retention_days + math.ceil(longest_open_seconds(settings) / 86_400) + OPEN_SLACK_DAYS


class Storage(Construct):
    """``bucket``: SSE-S3, no public access, TLS only, unversioned, access-logged, with lifecycle
    rules for multipart leftovers, Uploads parts and batch data (``batch_data_expiry_days``). ``table``: ``schema.TABLE_SCHEMA`` on demand,
    with PITR, TTL and the stream the reaper reads."""

    def __init__(self, scope: Construct, id: str, *, config: DeployConfig) -> None:
        super().__init__(scope, id)
        policy = removal_policy(config)
        destroy = policy == cdk.RemovalPolicy.DESTROY

        self.access_logs = s3.Bucket(
            self,
            "AccessLogs",
            encryption=s3.BucketEncryption.S3_MANAGED,  # the only encryption server access logs support
            block_public_access=s3.BlockPublicAccess.BLOCK_ALL,
            object_ownership=s3.ObjectOwnership.BUCKET_OWNER_ENFORCED,
            enforce_ssl=True,
            lifecycle_rules=[s3.LifecycleRule(id="expire-access-logs", expiration=cdk.Duration.days(365))],
            removal_policy=policy,
            auto_delete_objects=destroy,
        )
        acknowledge(
            self.access_logs,
            "AwsSolutions-S1",
            "This is the server access log target of the data bucket; logging it would log its own log deliveries.",
        )

        self.bucket = s3.Bucket(
            self,
            "Bucket",
            encryption=s3.BucketEncryption.S3_MANAGED,
            block_public_access=s3.BlockPublicAccess.BLOCK_ALL,
            object_ownership=s3.ObjectOwnership.BUCKET_OWNER_ENFORCED,
            enforce_ssl=True,
            versioned=False,  # the API deletes bytes when a file is deleted or expires
            server_access_logs_bucket=self.access_logs,
            server_access_logs_prefix="data/",
            lifecycle_rules=[
                s3.LifecycleRule(
                    id="abort-incomplete-multipart",
                    abort_incomplete_multipart_upload_after=cdk.Duration.days(ABORT_MULTIPART_DAYS),
                ),
                s3.LifecycleRule(
                    id="expire-upload-parts",
                    prefix=UPLOADS_PREFIX,
                    expiration=cdk.Duration.days(UPLOAD_PARTS_EXPIRY_DAYS),
                ),
                # Retention of batch data: see batch_data_expiry_days. Not files/ (their own expiry).
                s3.LifecycleRule(
                    id="expire-batch-data",
                    prefix=BATCHES_PREFIX,
                    expiration=cdk.Duration.days(batch_data_expiry_days(config)),
                ),
            ],
            removal_policy=policy,
            auto_delete_objects=destroy,
        )

        self.table = dynamodb.Table(self, "Table", **table_props(schema.TABLE_SCHEMA), removal_policy=policy)
        for gsi in schema.TABLE_SCHEMA.get("GlobalSecondaryIndexes", []):
            self.table.add_global_secondary_index(**index_props(gsi, schema.TABLE_SCHEMA))

        if destroy:
            # auto_delete_objects adds CDK's own custom-resource provider function.
            stack = cdk.Stack.of(self)
            for rule, reason in (
                (
                    "AwsSolutions-IAM4[Policy::arn:<AWS::Partition>:iam::aws:policy/service-role/AWSLambdaBasicExecutionRole]",
                    "CDK's auto-delete-objects provider (removal_policy=destroy, dev stacks only) uses the basic execution role.",
                ),
                (
                    "AwsSolutions-L1",
                    "CDK's auto-delete-objects provider pins its own runtime; it only runs on stack delete.",
                ),
            ):
                acknowledge(stack, rule, reason)


def _attribute(schema_def: dict[str, Any], name: str) -> dynamodb.Attribute:
    types = {a["AttributeName"]: a["AttributeType"] for a in schema_def["AttributeDefinitions"]}
    return dynamodb.Attribute(name=name, type=_ATTRIBUTE_TYPES[types[name]])


def _keys(schema_def: dict[str, Any], key_schema: list[dict[str, str]]) -> dict[str, dynamodb.Attribute]:
    out = {}
    for key in key_schema:
        role = "partition_key" if key["KeyType"] == "HASH" else "sort_key"
        out[role] = _attribute(schema_def, key["AttributeName"])
    return out


def table_props(schema_def: dict[str, Any]) -> dict[str, Any]:
    """``dynamodb.Table`` properties from a boto3 ``create_table`` definition, plus what a
    deployment always wants: PITR and the TTL attribute."""
    stream = schema_def.get("StreamSpecification") or {}
    return {
        **_keys(schema_def, schema_def["KeySchema"]),
        "billing_mode": _BILLING[schema_def.get("BillingMode", "PAY_PER_REQUEST")],
        "stream": _STREAM_VIEWS[stream["StreamViewType"]] if stream.get("StreamEnabled") else None,
        "time_to_live_attribute": schema.TTL,
        "point_in_time_recovery_specification": dynamodb.PointInTimeRecoverySpecification(
            point_in_time_recovery_enabled=True
        ),
    }


def index_props(gsi: dict[str, Any], schema_def: dict[str, Any]) -> dict[str, Any]:
    projection = gsi.get("Projection", {"ProjectionType": "ALL"})
    props: dict[str, Any] = {
        "index_name": gsi["IndexName"],
        **_keys(schema_def, gsi["KeySchema"]),
        "projection_type": _PROJECTIONS[projection["ProjectionType"]],
    }
    if projection.get("NonKeyAttributes"):
        props["non_key_attributes"] = projection["NonKeyAttributes"]
    return props
