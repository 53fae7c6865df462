"""Ingest and the work queues: S3 input snapshot -> SQS ingest queue -> ingest Lambda -> one work
queue per served model (each with a DLQ drained by the DLQ Lambda).

The queues are named as the local deployment names them (``infra/names.py``), redrive after the
same receive counts, and their URLs reach every function and the worker through
``Settings.models`` (one ``Settings`` for the whole deployment, built here once the queues exist).
"""

from collections.abc import Mapping

import aws_cdk as cdk
from aws_cdk import aws_lambda as lambda_
from aws_cdk import aws_lambda_event_sources as sources
from aws_cdk import aws_s3 as s3
from aws_cdk import aws_s3_notifications as s3n
from aws_cdk import aws_sqs as sqs
from constructs import Construct

from functions.core import schema
from functions.core.settings import Settings
from infra import names
from infra.config import DeployConfig

from .common import (
    BATCH_PARTITIONS,
    BUDGET_PARTITIONS,
    CHUNK_PARTITIONS,
    ENQUEUED_PARTITIONS,
    TENANT_POLICIES,
    acknowledge,
    acknowledge_data_grants,
    grant_items,
    grant_release,
    resource_prefix,
    state_machine_arn,
)
from .lambdas import Lambdas
from .storage import Storage

#: Key filter of the S3 notification: the batch input snapshots (``schema.batch_input_key``).
SNAPSHOT_PREFIX = schema.BATCHES_PREFIX
SNAPSHOT_SUFFIX = schema.INPUT_NAME
#: S3 key patterns the functions are granted (built from the same key functions the code uses).
INPUT_KEYS = schema.batch_input_key("*", "*")
MANIFEST_KEYS = schema.batch_manifest_key("*", "*")
BATCH_KEYS = schema.batch_prefix("*", "*") + "*"
PART_KEYS = schema.chunk_part_key("*", "*", 0, "*", "out").rsplit("/", 1)[0] + "/*"
#: Table actions (``common.grant_items``): ingest and the ingest DLQ consumer read a batch and move
#: it with conditional updates; the chunk DLQ consumer also counts the chunk as the worker does
#: (marker and run record: GetItem, PutItem; the count's TransactWriteItems is authorized item by
#: item). No Query, Scan, DeleteItem, batch or index access.
BATCH_ITEM_ACTIONS = ("dynamodb:GetItem", "dynamodb:UpdateItem")
CHUNK_COUNT_ACTIONS = ("dynamodb:GetItem", "dynamodb:PutItem", "dynamodb:UpdateItem")
#: Ingest's rights on the enqueued-cap counters (``common.ENQUEUED_PARTITIONS``; ``T#*#ENQUEUED``
#: matches no other partition, a tenant name has no ``#``): reserve, and read on a refusal.
ENQUEUED_ACTIONS = ("dynamodb:GetItem", "dynamodb:UpdateItem")

#: The ingest Lambda validates and fans out one whole batch per invocation (up to 200 MB of input).
INGEST_TIMEOUT = cdk.Duration.minutes(10)
#: AWS's guidance for SQS event sources: visibility at least six times the function timeout, so a
#: retried or throttled invocation never sees its message reappear while it still runs.
INGEST_VISIBILITY = cdk.Duration.seconds(6 * INGEST_TIMEOUT.to_seconds())
#: The DLQ Lambda fails one chunk's lines (at most chunk_max_lines) per message.
DLQ_HANDLER_TIMEOUT = cdk.Duration.minutes(5)
DLQ_HANDLER_VISIBILITY = cdk.Duration.seconds(6 * DLQ_HANDLER_TIMEOUT.to_seconds())
#: The ingest-DLQ Lambda reads one batch and at most re-sends its work messages and starts its
#: workflow: seconds. (The ingest DLQ's visibility, DLQ_HANDLER_VISIBILITY, is far above.)
INGEST_DLQ_TIMEOUT = cdk.Duration.minutes(2)
#: Work messages wait at most one completion window (24 h); dead letters are kept for inspection.
RETENTION = cdk.Duration.days(14)


class Ingest(Construct):
    """``ingest_queue`` (+ ``ingest_dead_letters``), ``function`` (ingest), ``work_queues`` and
    ``work_dead_letters`` by model name, ``dlq_function``, ``ingest_dlq_function`` (the ingest
    DLQ's consumer), and ``settings``: the one ``Settings``
    every function and the worker read."""

    def __init__(self, scope: Construct, id: str, *, config: DeployConfig, storage: Storage, lambdas: Lambdas) -> None:
        super().__init__(scope, id)
        prefix = resource_prefix(self)

        # --- queues ------------------------------------------------------------------------------
        self.ingest_dead_letters = self._dead_letter_queue("IngestDeadLetters", names.ingest_queue_name(prefix))
        self.ingest_queue = sqs.Queue(
            self,
            "IngestQueue",
            queue_name=names.ingest_queue_name(prefix),
            visibility_timeout=INGEST_VISIBILITY,
            dead_letter_queue=sqs.DeadLetterQueue(
                queue=self.ingest_dead_letters, max_receive_count=names.INGEST_MAX_RECEIVES
            ),
            encryption=sqs.QueueEncryption.SQS_MANAGED,
            enforce_ssl=True,
        )
        self.work_queues: dict[str, sqs.Queue] = {}
        self.work_dead_letters: dict[str, sqs.Queue] = {}
        for index, model in enumerate(config.models):
            name = names.work_queue_name(prefix, model.name)
            dlq = self._dead_letter_queue(f"WorkDeadLetters{index}", name)
            self.work_dead_letters[model.name] = dlq
            self.work_queues[model.name] = sqs.Queue(
                self,
                f"WorkQueue{index}",
                queue_name=name,
                visibility_timeout=cdk.Duration.seconds(names.WORK_VISIBILITY_SECONDS),
                retention_period=RETENTION,
                dead_letter_queue=sqs.DeadLetterQueue(queue=dlq, max_receive_count=names.WORK_MAX_RECEIVES),
                encryption=sqs.QueueEncryption.SQS_MANAGED,
                enforce_ssl=True,
            )

        # The one Settings of the deployment: queue URLs are the queues' tokens; the state
        # machine's ARN is built from its fixed name (the workflow Lambda it invokes reads these
        # settings too, so a reference to the state machine itself would be circular).
        self.settings: Settings = config.settings(
            table_name=storage.table.table_name,
            bucket_name=storage.bucket.bucket_name,
            queue_urls={name: q.queue_url for name, q in self.work_queues.items()},
            state_machine_arn=state_machine_arn(self),
            # The bus infra/constructs/events.py creates under this name (docs/webhooks.md).
            event_bus_name=names.event_bus_name(prefix),
        )
        env = self.settings.to_env()

        # --- S3 snapshot -> ingest queue -> ingest Lambda ----------------------------------------
        storage.bucket.add_event_notification(
            s3.EventType.OBJECT_CREATED,
            s3n.SqsDestination(self.ingest_queue),
            s3.NotificationKeyFilter(prefix=SNAPSHOT_PREFIX, suffix=SNAPSHOT_SUFFIX),
        )
        self.function = lambdas.function(
            self,
            "Function",
            handler="functions.ingest.handler.handler",
            environment=env,
            description="Validates a batch's input, cuts it into chunks, enqueues them, starts the workflow",
            memory_size=1024,
            timeout=INGEST_TIMEOUT,
        )
        self.function.add_event_source(
            # One batch per invocation: each gets the whole timeout; a failed one alone is retried.
            sources.SqsEventSource(self.ingest_queue, batch_size=1, report_batch_item_failures=True)
        )
        # The batch item only (read, conditional updates): never a file, upload or key item.
        grant_items(self.function, storage, BATCH_ITEM_ACTIONS, (BATCH_PARTITIONS,))
        # A big batch's counting shards (docs/lifecycle.md, "Counting shards"): each written once,
        # only if absent, before the first work message.
        grant_items(self.function, storage, ("dynamodb:PutItem",), (CHUNK_PARTITIONS,))
        # The tenant's policy (its model allowlist, line bounds, guard): read only, its one partition.
        if self.settings.governance:  # off: no policy is read (Settings.governance)
            grant_items(self.function, storage, ("dynamodb:GetItem",), (TENANT_POLICIES,))
            # The enqueued-cap counters (docs/governance.md): a conditional ADD inside the move to
            # in_progress (a TransactWriteItems, authorized item by item), and a read on a refusal.
            grant_items(self.function, storage, ENQUEUED_ACTIONS, (ENQUEUED_PARTITIONS,))
            # The output-token budget item of the period (``budget_action="stop"``): read only.
            grant_items(self.function, storage, ("dynamodb:GetItem",), (BUDGET_PARTITIONS,))
        storage.bucket.grant_read(self.function, BATCH_KEYS)  # the input, and the manifest on a retry
        storage.bucket.grant_put(self.function, MANIFEST_KEYS)
        for queue in self.work_queues.values():
            queue.grant_send_messages(self.function)
        acknowledge_data_grants(
            self.function.role,
            storage,
            {
                BATCH_KEYS: "Reads the batch input snapshot (streamed) and, when an event is redelivered, the chunk "
                "manifest it wrote: only under batches/, never a tenant's files.",
                MANIFEST_KEYS: "Writes each batch's chunk manifest (deterministic key).",
            },
            table=None,
        )

        # --- dead-lettered chunks -> DLQ Lambda ---------------------------------------------------
        self.dlq_function = lambdas.function(
            self,
            "DeadLetterFunction",
            handler="functions.chunk_dlq.handler.handler",
            environment=env,
            description="Fails the lines of a dead-lettered chunk and counts it, so its batch still finishes",
            memory_size=512,
            timeout=DLQ_HANDLER_TIMEOUT,
        )
        for dlq in self.work_dead_letters.values():
            self.dlq_function.add_event_source(
                sources.SqsEventSource(dlq, batch_size=1, report_batch_item_failures=True)
            )
        # What the worker has: the batch item and the chunk's marker and run record (the count is a
        # TransactWriteItems, authorized item by item).
        grant_items(self.dlq_function, storage, CHUNK_COUNT_ACTIONS, (BATCH_PARTITIONS, CHUNK_PARTITIONS))
        storage.bucket.grant_read(self.dlq_function, INPUT_KEYS)
        storage.bucket.grant_put(self.dlq_function, PART_KEYS)
        storage.bucket.grant_read(self.dlq_function, PART_KEYS)  # the chunk's checkpointed lines are kept
        acknowledge_data_grants(
            self.dlq_function.role,
            storage,
            {
                INPUT_KEYS: "Reads the dead-lettered chunk's lines (a ranged GET of the input snapshot) for their "
                "custom_ids; any tenant's batch can dead-letter a chunk.",
                PART_KEYS: "Writes the chunk's error part (a key per attempt under the batch's parts/).",
            },
            table=None,
        )

        # --- dead-lettered ingest events -> ingest DLQ Lambda ---------------------------------------
        # An ingest event that failed INGEST_MAX_RECEIVES times would otherwise leave its batch
        # validating forever: this function fails it (ingest_failed), cancels it, or retries its
        # fan-out and workflow start (docs/lifecycle.md, "Liveness: every batch ends").
        self.ingest_dlq_function = lambdas.function(
            self,
            "IngestDeadLetterFunction",
            handler="functions.ingest_dlq.handler.handler",
            environment=env,
            description="Ends or resumes the batch of a dead-lettered ingest event, so it never stays validating",
            memory_size=512,
            timeout=INGEST_DLQ_TIMEOUT,
        )
        self.ingest_dlq_function.add_event_source(
            sources.SqsEventSource(self.ingest_dead_letters, batch_size=1, report_batch_item_failures=True)
        )
        grant_items(self.ingest_dlq_function, storage, BATCH_ITEM_ACTIONS, (BATCH_PARTITIONS,))
        # Failing or cancelling a batch releases its enqueued-cap reservation in that write's
        # transaction (one held by a batch another ingest moved on, in a race: BatchRepo._releasing).
        grant_release(self.ingest_dlq_function, storage)
        storage.bucket.grant_read(self.ingest_dlq_function, MANIFEST_KEYS)  # a retried fan-out reads the manifest
        for queue in self.work_queues.values():
            queue.grant_send_messages(self.ingest_dlq_function)
        acknowledge_data_grants(
            self.ingest_dlq_function.role,
            storage,
            {
                MANIFEST_KEYS: "A retried fan-out reads the chunk manifest ingest wrote for any tenant's batch (read only).",
            },
            table=None,
        )

        # CDK's own handler that writes the bucket's notification configuration (a custom resource:
        # CloudFormation cannot set it on the bucket without a bucket <-> queue policy cycle).
        handler = cdk.Stack.of(self).node.try_find_child("BucketNotificationsHandler050a0587b7544547bf325f094a3db834")
        if handler is not None:
            acknowledge(
                handler,
                "AwsSolutions-IAM4[Policy::arn:<AWS::Partition>:iam::aws:policy/service-role/AWSLambdaBasicExecutionRole]",
                "CDK's BucketNotificationsHandler (sets the S3 -> SQS notification at deploy time) uses the basic "
                "execution role for its own logs; it runs only on stack create/update.",
            )
            acknowledge(
                handler,
                "AwsSolutions-IAM5[Resource::*]",
                "CDK's BucketNotificationsHandler: s3:PutBucketNotification has to name buckets that CDK resolves at "
                "deploy time; the handler runs only on stack create/update, with no other rights.",
            )

    def _dead_letter_queue(self, id: str, source_name: str) -> sqs.Queue:
        queue = sqs.Queue(
            self,
            id,
            queue_name=names.dead_letter_queue_name(source_name),
            retention_period=RETENTION,
            visibility_timeout=DLQ_HANDLER_VISIBILITY,
            encryption=sqs.QueueEncryption.SQS_MANAGED,
            enforce_ssl=True,
        )
        acknowledge(queue, "AwsSolutions-SQS3", f"This queue is itself the dead-letter queue of {source_name}.")
        return queue

    @property
    def functions(self) -> Mapping[str, lambda_.Function]:
        return {"ingest": self.function, "dlq": self.dlq_function, "ingest_dlq": self.ingest_dlq_function}
