"""Audit (docs/audit.md): the optional WORM bucket of tenants' audit chains.

With ``DeployConfig.audit_object_lock`` set, one S3 bucket with Object Lock on (versioned, as
Object Lock requires) and a default retention (governance or compliance mode, N days) on every
object version written there, and the exporter (``add_exporter``): a Lambda on the table's stream,
filtered to the INSERTs of audit records, that writes each record once to
``chain/<tenant>/<seq>.json`` (functions/audit_export). It may only PutObject under ``chain/``
there (no delete, no overwrite: If-None-Match and the lock) and reads nothing of the table but
the stream. ``batchctl audit export --tenant T --s3 <bucket>`` still writes a whole chain as one
object, with the operator's credentials; ``batchctl audit verify --worm <bucket>`` compares.
Without the flag: nothing. The chain itself lives in the table (``schema.audit_pk``).
"""

import aws_cdk as cdk
from aws_cdk import aws_iam as iam
from aws_cdk import aws_lambda as lambda_
from aws_cdk import aws_s3 as s3
from constructs import Construct

from functions.core import audit, schema
from functions.core.settings import Settings
from infra.config import DeployConfig

from .common import acknowledge_wildcards, arn_in_findings, consume_table_stream

#: The stack output naming the bucket (absent without the flag).
OUTPUT_AUDIT_BUCKET = "AuditBucketName"


def stream_filter() -> dict:
    """INSERTs of audit records (partition ``AUDIT#<tenant>``, sort key ``SEQ#...``): the dedupe
    markers beside them and every other item's changes never invoke the exporter."""
    return {
        "eventName": lambda_.FilterRule.is_equal("INSERT"),
        "dynamodb": {"Keys": {
            schema.PK: {"S": lambda_.FilterRule.begins_with(schema.audit_pk(""))},
            schema.SK: {"S": lambda_.FilterRule.begins_with(schema.AUDIT_SEQ_PREFIX)},
        }},
    }


class AuditExport(Construct):
    def __init__(self, scope: Construct, id: str, *, config: DeployConfig, access_logs: s3.IBucket) -> None:
        super().__init__(scope, id)
        self.bucket: s3.Bucket | None = None
        self.exporter: lambda_.Function | None = None
        lock = config.audit_object_lock
        if lock is None:
            return
        days = cdk.Duration.days(lock.retention_days)
        retention = (
            s3.ObjectLockRetention.compliance(days) if lock.mode == "compliance" else s3.ObjectLockRetention.governance(days)
        )
        self.bucket = s3.Bucket(
            self,
            "Bucket",
            object_lock_enabled=True,
            object_lock_default_retention=retention,
            versioned=True,
            encryption=s3.BucketEncryption.S3_MANAGED,
            block_public_access=s3.BlockPublicAccess.BLOCK_ALL,
            enforce_ssl=True,
            server_access_logs_bucket=access_logs,
            server_access_logs_prefix="audit/",
            # Locked versions outlive any stack deletion: the bucket is always retained.
            removal_policy=cdk.RemovalPolicy.RETAIN,
        )
        cdk.CfnOutput(scope, OUTPUT_AUDIT_BUCKET, value=self.bucket.bucket_name,
                      description="batchctl audit export --s3 <this bucket>")

    def add_exporter(self, *, storage, lambdas, settings: Settings) -> lambda_.Function | None:
        """The stream-driven WORM copy (no bucket: none). ``storage``/``lambdas``: the Storage and
        Lambdas constructs."""
        if self.bucket is None:
            return None
        function = lambdas.function(
            self,
            "Exporter",
            handler="functions.audit_export.handler.handler",
            environment=settings.model_copy(update={"audit_bucket_name": self.bucket.bucket_name}).to_env(),
            description="Copies each new audit record to the Object Lock bucket (table stream)",
            memory_size=256,
            timeout=cdk.Duration.seconds(60),
        )
        # Write (and read back, to tell a duplicate from a conflict) records under chain/ only.
        records = self.bucket.arn_for_objects(f"{audit.WORM_PREFIX}*")
        function.add_to_role_policy(iam.PolicyStatement(actions=["s3:PutObject", "s3:GetObject"], resources=[records]))
        acknowledge_wildcards(function.role, {
            f"Resource::{arn_in_findings(self.bucket)}/{audit.WORM_PREFIX}*": "One object per audit record of any "
            "tenant (chain/<tenant>/<seq>.json); put (once: If-None-Match and Object Lock) and get only.",
        })
        self.dead_letters = consume_table_stream(self, function, storage.table, of="the audit exporter's stream mapping",
                                                 pattern=stream_filter(), batching_seconds=1, retry_attempts=10)
        self.exporter = function
        return function
