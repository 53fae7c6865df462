"""Webhooks (docs/webhooks.md): an EventBridge rule on the deployment's batch event bus
(infra/constructs/events.py) routing the terminal batch events (``batch.completed|failed|expired|
cancelled``, source ``batch-api``) to the webhook queue, and the Lambda that consumes it
(``functions/webhooks``): it reads each event's batch back and fans a true event out as one
delivery message per subscribed endpoint (onto the same queue), and attempts the due deliveries of
an invocation at once. A failed attempt sends the next attempt's message; a spent schedule's goes
to the dead-letter queue (watched by monitoring), as does a message that could not be handled
``logic.MAX_RECEIVES`` times.

Its rights: GetItem, Query and PutItem on the table's webhook partitions (``T#*#WEBHOOKS`` by
``dynamodb:LeadingKeys``: endpoints and the attempt log) and GetItem on the batch partitions
(``T#*#BATCHES``: the fan-out's read of the batch); no index, no update or delete, no file, chunk
or key item. Send to and change visibility on its own queue (event source mapping: receive and
delete), send to its dead-letter queue. No VPC: it must reach the tenants' HTTPS endpoints.
"""

from collections.abc import Iterable

import aws_cdk as cdk
from aws_cdk import aws_events as events
from aws_cdk import aws_events_targets as targets
from aws_cdk import aws_lambda as lambda_
from aws_cdk import aws_lambda_event_sources as sources
from aws_cdk import aws_sqs as sqs
from constructs import Construct

from functions.core.settings import Settings
from functions.webhooks import logic
from functions.webhooks.store import webhooks_pk
from infra.config import DeployConfig

from .common import BATCH_PARTITIONS, dead_letter_queue, grant_items
from .lambdas import Lambdas
from .storage import Storage

TABLE_ACTIONS = ("dynamodb:GetItem", "dynamodb:Query", "dynamodb:PutItem")
#: The partitions it may write: the tenants' webhook partitions (``T#*#WEBHOOKS``).
WEBHOOK_PARTITIONS = webhooks_pk("*")
#: And the one read of a batch the fan-out makes before it signs anything (``T#*#BATCHES``).
BATCH_READ_ACTIONS = ("dynamodb:GetItem",)


class Webhooks(Construct):
    """``queue`` (+ ``dead_letters``), ``rule``, ``function``."""

    def __init__(
        self,
        scope: Construct,
        id: str,
        *,
        config: DeployConfig,
        storage: Storage,
        lambdas: Lambdas,
        settings: Settings,
        bus: events.IEventBus,
    ) -> None:
        super().__init__(scope, id)
        self.dead_letters = dead_letter_queue(self, "DeadLetters", of="the webhook queue's")
        self.queue = sqs.Queue(
            self,
            "Queue",
            visibility_timeout=cdk.Duration.seconds(logic.QUEUE_VISIBILITY_SECONDS),
            # The schedule spans about 27.6 h; a message must outlive it (and a backlog).
            retention_period=cdk.Duration.days(4),
            # Each attempt is a message of its own: this catches only messages that cannot be handled.
            dead_letter_queue=sqs.DeadLetterQueue(queue=self.dead_letters, max_receive_count=logic.MAX_RECEIVES),
            encryption=sqs.QueueEncryption.SQS_MANAGED,  # EventBridge can send to SQS-managed SSE queues
            enforce_ssl=True,
        )
        self.rule = events.Rule(
            self,
            "BatchEvents",
            event_bus=bus,
            event_pattern=events.EventPattern(**{k.replace("-", "_"): v for k, v in logic.event_pattern().items()}),
            targets=[targets.SqsQueue(self.queue)],
            description="Terminal batch events -> webhook fan-out (docs/webhooks.md)",
        )
        # HTTPS only on AWS: webhook_allow_loopback_http stays False (its default).
        self.settings = settings.model_copy(
            update={
                "webhook_queue_url": self.queue.queue_url,
                "webhook_dead_letter_queue_url": self.dead_letters.queue_url,
            }
        )
        self.function = lambdas.function(
            self,
            "Function",
            handler="functions.webhooks.handler.handler",
            environment=self.settings.to_env(),
            description="Fans batch events out to tenants' webhook endpoints and delivers them (signed, retried)",
            memory_size=256,
            timeout=cdk.Duration.seconds(logic.FUNCTION_TIMEOUT_SECONDS),
        )
        self.function.add_event_source(
            sources.SqsEventSource(
                self.queue,
                batch_size=logic.BATCH_SIZE,
                report_batch_item_failures=True,
            )
        )
        self.queue.grant_send_messages(self.function)  # fan-out, next attempts
        self.queue.grant(self.function, "sqs:ChangeMessageVisibility")  # a message received before it is due
        self.dead_letters.grant_send_messages(self.function)  # a spent schedule
        grant_items(self.function, storage, TABLE_ACTIONS, (WEBHOOK_PARTITIONS,))
        grant_items(self.function, storage, BATCH_READ_ACTIONS, (BATCH_PARTITIONS,))

    def share_settings(self, functions: Iterable[lambda_.Function]) -> None:
        """Functions made before this construct get the queues' URLs too, so every function's
        environment stays exactly the one ``Settings.to_env()``."""
        for function in functions:
            function.add_environment(Settings.env_name("webhook_queue_url"), self.queue.queue_url)
            function.add_environment(Settings.env_name("webhook_dead_letter_queue_url"), self.dead_letters.queue_url)
