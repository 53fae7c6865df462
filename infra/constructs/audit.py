"""Audit (docs/audit.md): with governance on, the audit queue, the audit appender, the Object Lock
bucket of the chains' anchors and the key that signs them; with governance off, nothing.

- ``queue`` (FIFO, high throughput: deduplication and throughput per message group; a group is a
  tenant) and its FIFO dead-letter queue (alarmed): every writer sends intents there and may only
  ``sqs:SendMessage`` (``grant_send``).
- ``function``, the appender (functions/audit_append): the only principal that may write the
  table's ``AUDIT#*`` items: GetItem, PutItem and Query there by ``dynamodb:LeadingKeys``, and the
  table's resource policy denies every other principal any write of them (and everyone, the
  appender too, UpdateItem, DeleteItem and BatchWriteItem: the chains are append-only). It reads a
  chunk's count marker (GetItem on ``T#*#B#*``) and its parts (receipts without digests), charges
  the chunk's tenant budget from that marker with the receipt (UpdateItem on ``T#*#BUDGET``, which
  the table's policy denies every other principal any write of), puts and reads ``chain/*`` and
  ``checkpoints/*`` of the bucket, and is the only one granted ``kms:Sign``.
- ``bucket``: Object Lock (the config's mode and retention on every version), versioned,
  access-logged, retained on stack deletion; its policy denies any PUT without If-None-Match (a
  key is written once), any delete, a version's retention change and bypassing governance
  retention, to every principal (the default retention of new versions stays the config's to
  change).
- ``key``: an asymmetric KMS key (ECC_NIST_P256, SIGN_VERIFY), retained; verifiers need
  ``kms:GetPublicKey`` (the account's IAM grants it: the default key policy delegates to IAM).
"""

from collections.abc import Iterable

import aws_cdk as cdk
from aws_cdk import aws_iam as iam
from aws_cdk import aws_kms as kms
from aws_cdk import aws_lambda as lambda_
from aws_cdk import aws_lambda_event_sources as sources
from aws_cdk import aws_s3 as s3
from aws_cdk import aws_sqs as sqs
from constructs import Construct

from functions.core import anchor
from functions.core.settings import Settings
from infra import names
from infra.config import DeployConfig

from .common import (
    AUDIT_PARTITIONS,
    BUDGET_PARTITIONS,
    CHUNK_PARTITIONS,
    acknowledge,
    acknowledge_data_grants,
    acknowledge_wildcards,
    arn_in_findings,
    grant_charge,
    grant_items,
)
from .ingest import PART_KEYS

#: The appender's table actions on ``AUDIT#*`` (``functions.core.aws.audit.AuditRepo``): GetItem (a
#: dedupe marker, a record), Query (the head, a whole chain) and PutItem (the record and its marker,
#: in one TransactWriteItems, authorized item by item). On ``T#*#B#*``: a receipt's count marker.
APPEND_ACTIONS = ("dynamodb:GetItem", "dynamodb:PutItem", "dynamodb:Query")
#: What the table's resource policy denies on ``AUDIT#*`` items: writes but the appender's puts, to
#: every principal (``OTHERS_DENIED``), and these to everyone (``ALL_DENIED``).
OTHERS_DENIED = ("dynamodb:PutItem",)
ALL_DENIED = ("dynamodb:UpdateItem", "dynamodb:DeleteItem", "dynamodb:BatchWriteItem")
#: The writes of a budget item denied to every principal but the appender.
BUDGET_DENIED = ("dynamodb:PutItem", "dynamodb:UpdateItem", "dynamodb:DeleteItem", "dynamodb:BatchWriteItem")
#: The bucket policy's denials to every principal (docs/audit.md, "What an attacker can still do").
BUCKET_DENIED = ("s3:DeleteObject", "s3:DeleteObjectVersion", "s3:PutObjectRetention", "s3:BypassGovernanceRetention")
#: Intents per invocation: SQS's FIFO maximum; one checkpoint per tenant per invocation.
BATCH_SIZE = 10


class Audit(Construct):
    """``queue``, ``dead_letters``, ``function``, ``bucket``, ``key`` (all None with governance off)
    and ``settings``: the deployment's settings with the audit queue's URL."""

    def __init__(
        self,
        scope: Construct,
        id: str,
        *,
        config: DeployConfig,
        storage,
        lambdas,
        settings: Settings,
    ) -> None:
        super().__init__(scope, id)
        self.queue: sqs.Queue | None = None
        self.dead_letters: sqs.Queue | None = None
        self.function: lambda_.Function | None = None
        self.bucket: s3.Bucket | None = None
        self.key: kms.Key | None = None
        self.settings = settings
        if not settings.governance:
            return
        lock = config.audit_object_lock
        assert lock is not None  # DeployConfig refuses governance without it
        self.bucket = self._bucket(lock, storage.access_logs)
        self.key = kms.Key(
            self,
            "SigningKey",
            key_spec=kms.KeySpec.ECC_NIST_P256,
            key_usage=kms.KeyUsage.SIGN_VERIFY,
            description="Signs the audit chains' checkpoints (docs/audit.md)",
            # Without it no checkpoint verifies against KMS: kept with the locked bucket.
            removal_policy=cdk.RemovalPolicy.RETAIN,
        )
        self.dead_letters = sqs.Queue(
            self,
            "DeadLetters",
            fifo=True,
            encryption=sqs.QueueEncryption.SQS_MANAGED,
            enforce_ssl=True,
            retention_period=cdk.Duration.days(14),
        )
        acknowledge(
            self.dead_letters, "AwsSolutions-SQS3", "This queue is itself a dead-letter queue: the audit queue's."
        )
        self.queue = sqs.Queue(
            self,
            "Queue",
            fifo=True,
            content_based_deduplication=False,
            deduplication_scope=sqs.DeduplicationScope.MESSAGE_GROUP,
            fifo_throughput_limit=sqs.FifoThroughputLimit.PER_MESSAGE_GROUP_ID,
            visibility_timeout=cdk.Duration.seconds(names.AUDIT_VISIBILITY_SECONDS),
            retention_period=cdk.Duration.days(14),
            dead_letter_queue=sqs.DeadLetterQueue(queue=self.dead_letters, max_receive_count=names.AUDIT_MAX_RECEIVES),
            encryption=sqs.QueueEncryption.SQS_MANAGED,
            enforce_ssl=True,
        )
        self.settings = settings.model_copy(update={"audit_queue_url": self.queue.queue_url})
        self.function = lambdas.function(
            self,
            "Appender",
            handler="functions.audit_append.handler.handler",
            environment=self.settings.model_copy(
                update={
                    "audit_bucket_name": self.bucket.bucket_name,
                    "audit_signing_key_id": self.key.key_arn,
                }
            ).to_env(),
            description="Appends audit intents to the tenants' chains, copies them to the Object Lock bucket, "
            "signs checkpoints",
            memory_size=256,
            timeout=cdk.Duration.seconds(names.AUDIT_APPEND_TIMEOUT_SECONDS),
        )
        self.function.add_event_source(
            sources.SqsEventSource(self.queue, batch_size=BATCH_SIZE, report_batch_item_failures=True)
        )
        self._grant(storage)
        cdk.CfnOutput(
            scope,
            names.OUTPUT_AUDIT_QUEUE,
            value=self.queue.queue_url,
            description="Where batchctl sends the operator's audit intents",
        )
        cdk.CfnOutput(
            scope,
            names.OUTPUT_AUDIT_BUCKET,
            value=self.bucket.bucket_name,
            description="The audit chains' WORM copies and signed checkpoints (batchctl audit verify)",
        )
        cdk.CfnOutput(
            scope,
            names.OUTPUT_AUDIT_KEY,
            value=self.key.key_arn,
            description="The key that signs the audit checkpoints (batchctl audit public-key)",
        )

    def _bucket(self, lock, access_logs: s3.IBucket) -> s3.Bucket:
        days = cdk.Duration.days(lock.retention_days)
        retention = (
            s3.ObjectLockRetention.compliance(days)
            if lock.mode == "compliance"
            else s3.ObjectLockRetention.governance(days)
        )
        bucket = s3.Bucket(
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
        objects = bucket.arn_for_objects("*")
        # A key is written once: a PUT without If-None-Match would add a version (S3, "Enforce
        # conditional writes on Amazon S3 buckets": the s3:if-none-match condition key).
        bucket.add_to_resource_policy(
            iam.PolicyStatement(
                sid="WriteOnce",
                effect=iam.Effect.DENY,
                principals=[iam.AnyPrincipal()],
                actions=["s3:PutObject"],
                resources=[objects],
                conditions={"Null": {"s3:if-none-match": "true"}},
            )
        )
        bucket.add_to_resource_policy(
            iam.PolicyStatement(
                sid="NeverRemoved",
                effect=iam.Effect.DENY,
                principals=[iam.AnyPrincipal()],
                actions=list(BUCKET_DENIED),
                resources=[bucket.bucket_arn, objects],
            )
        )
        return bucket

    def _grant(self, storage) -> None:
        assert self.function is not None and self.bucket is not None and self.key is not None
        role = self.function.role
        assert role is not None
        grant_items(self.function, storage, APPEND_ACTIONS, (AUDIT_PARTITIONS,))
        grant_items(self.function, storage, ("dynamodb:GetItem", "dynamodb:BatchGetItem"), (CHUNK_PARTITIONS,))
        grant_charge(self.function, storage)  # the counted chunk's budget, with its receipt
        storage.bucket.grant_read(self.function, PART_KEYS)  # a receipt without digests hashes the parts
        # Put (once) and read back its two prefixes; ListBucket so a missing key answers 404, not 403.
        prefixes = [self.bucket.arn_for_objects(f"{p}*") for p in (anchor.CHAIN_PREFIX, anchor.CHECKPOINT_PREFIX)]
        self.function.add_to_role_policy(
            iam.PolicyStatement(actions=["s3:PutObject", "s3:GetObject"], resources=prefixes)
        )
        self.function.add_to_role_policy(
            iam.PolicyStatement(actions=["s3:ListBucket"], resources=[self.bucket.bucket_arn])
        )
        self.key.grant(self.function, "kms:Sign")
        locked = arn_in_findings(self.bucket)
        acknowledge_data_grants(
            role,
            storage,
            {
                PART_KEYS: "Hashes a counted chunk's result parts for a receipt whose sender named no digests: any "
                "tenant's batch has chunks.",
            },
            table=None,
        )
        acknowledge_wildcards(
            role,
            {
                f"Resource::{locked}/{anchor.CHAIN_PREFIX}*": "One object per audit record of any tenant "
                "(chain/<tenant>/<seq>.json); put once (If-None-Match, the bucket policy) and read back.",
                f"Resource::{locked}/{anchor.CHECKPOINT_PREFIX}*": "One signed checkpoint per tenant and seq "
                "(checkpoints/<tenant>/<seq>.json); put once and read back.",
            },
        )
        # Nobody else writes an AUDIT# item, whatever their identity policy grants (the operator's
        # admin role included); nobody, the appender included, changes or deletes one. "*": the
        # table's own ARN in its policy would be a circular reference (CDK's documented pattern).
        audit_items = {"ForAnyValue:StringLike": {"dynamodb:LeadingKeys": [AUDIT_PARTITIONS]}}
        storage.table.add_to_resource_policy(
            iam.PolicyStatement(
                sid="AuditAppenderOnly",
                effect=iam.Effect.DENY,
                principals=[iam.AnyPrincipal()],
                actions=list(OTHERS_DENIED),
                resources=["*"],
                conditions={**audit_items, "ArnNotEquals": {"aws:PrincipalArn": role.role_arn}},
            )
        )
        storage.table.add_to_resource_policy(
            iam.PolicyStatement(
                sid="AuditAppendOnly",
                effect=iam.Effect.DENY,
                principals=[iam.AnyPrincipal()],
                actions=list(ALL_DENIED),
                resources=["*"],
                conditions=audit_items,
            )
        )
        # Nobody else writes a budget item either: what a tenant spent is charged by this role only,
        # from count markers, once per chunk (a receipt's transaction).
        storage.table.add_to_resource_policy(
            iam.PolicyStatement(
                sid="BudgetsAppenderOnly",
                effect=iam.Effect.DENY,
                principals=[iam.AnyPrincipal()],
                actions=list(BUDGET_DENIED),
                resources=["*"],
                conditions={
                    "ForAnyValue:StringLike": {"dynamodb:LeadingKeys": [BUDGET_PARTITIONS]},
                    "ArnNotEquals": {"aws:PrincipalArn": role.role_arn},
                },
            )
        )

    def grant_send(self, grantee: iam.IGrantable) -> None:
        """A writer of audit intents: ``sqs:SendMessage`` on the audit queue, nothing else of it
        (with governance off: nothing)."""
        if self.queue is not None:
            self.queue.grant(grantee, "sqs:SendMessage")

    def share_settings(self, functions: Iterable[lambda_.Function]) -> None:
        """Functions made before this construct get the audit queue's URL too, so every function's
        environment stays exactly the one ``Settings.to_env()``."""
        if self.queue is None:
            return
        for function in functions:
            function.add_environment(Settings.env_name("audit_queue_url"), self.queue.queue_url)
