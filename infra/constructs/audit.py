"""Audit (docs/audit.md): the optional WORM bucket the operator exports tenants' audit chains to.

With ``DeployConfig.audit_object_lock`` set, one S3 bucket with Object Lock on (versioned, as
Object Lock requires) and a default retention (governance or compliance mode, N days) on every
object version written there; ``batchctl audit export --tenant T --s3 <bucket>`` writes a chain
as one object named by the seqs it holds. No role of the stack writes to it: exports run with the
operator's credentials. Without the flag: nothing. The chain itself lives in the table
(``schema.audit_pk``); the API Lambda's table grant already covers its partitions.
"""

import aws_cdk as cdk
from aws_cdk import aws_s3 as s3
from constructs import Construct

from infra.config import DeployConfig

#: The stack output naming the bucket (absent without the flag).
OUTPUT_AUDIT_BUCKET = "AuditBucketName"


class AuditExport(Construct):
    def __init__(self, scope: Construct, id: str, *, config: DeployConfig, access_logs: s3.IBucket) -> None:
        super().__init__(scope, id)
        self.bucket: s3.Bucket | None = None
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
