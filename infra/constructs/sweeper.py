"""The sweeper: a Lambda on an EventBridge schedule (every ``Settings.sweep_seconds``) that ends or
restarts every open batch the normal path left behind (``functions/sweeper``; docs/lifecycle.md,
"Liveness: every batch ends").

It finds the open batches with one Query of the table's sparse ``open_batches`` index (never a
scan) and acts through ingest's and the workflow's own logic, so its rights are theirs: the batch
table; reading a batch's input, manifest and parts and writing its output and error files (the
workflow's finalize); sending work messages (ingest's fan-out); starting the workflow and
publishing batch events. A scheduled rule is free; the function runs ``sweep_seconds`` apart.
"""

import aws_cdk as cdk
from aws_cdk import aws_events as events
from aws_cdk import aws_events_targets as targets
from constructs import Construct

from functions.core.settings import Settings
from infra.config import DeployConfig

from .common import acknowledge_data_grants, dead_letter_queue
from .ingest import BATCH_KEYS, Ingest
from .lambdas import Lambdas
from .storage import Storage
from .workflow import FILE_KEYS, Workflow

#: One sweep reads every open batch and may finalize a few (each like the workflow's finalize,
#: which assembles files of up to 200 MB of input): the workflow function's own bound.
SWEEPER_TIMEOUT = cdk.Duration.minutes(10)
#: Attempts EventBridge makes to invoke the function for one tick before the event goes to the
#: dead-letter queue (a missed tick is harmless: the next one sweeps the same batches).
SCHEDULE_RETRIES = 2


class Sweeper(Construct):
    """``function`` (the sweeper), ``rule`` (its schedule) and ``dead_letters`` (ticks EventBridge
    could not deliver)."""

    def __init__(
        self,
        scope: Construct,
        id: str,
        *,
        config: DeployConfig,
        storage: Storage,
        lambdas: Lambdas,
        settings: Settings,
        ingest: Ingest,
        workflow: Workflow,
    ) -> None:
        super().__init__(scope, id)
        self.function = lambdas.function(
            self,
            "Function",
            handler="functions.sweeper.handler.handler",
            environment=settings.to_env(),
            description="Ends or restarts overdue open batches (stuck validating, never enqueued, past expiry + grace)",
            memory_size=1024,
            timeout=SWEEPER_TIMEOUT,
        )
        # No reserved concurrency (a new account's limit of 10 leaves none to reserve): two sweeps
        # overlapping is safe, every action is a conditional write or an idempotent finalize.

        storage.table.grant_read_write_data(self.function)
        storage.bucket.grant_read(self.function, BATCH_KEYS)  # input (never-ran lines), manifest, parts
        storage.bucket.grant_put(self.function, FILE_KEYS)  # an expired batch's output and error files
        for queue in ingest.work_queues.values():
            queue.grant_send_messages(self.function)  # a fan-out done again
        workflow.grant_start(self.function)
        workflow.grant_publish(self.function)
        acknowledge_data_grants(
            self.function.role,
            storage,
            {
                BATCH_KEYS: "Finalizing an overdue batch reads its manifest, chunk parts and (for never-ran requests) "
                "its input, for any tenant's batch; only under batches/.",
                FILE_KEYS: "Finalizing an overdue batch writes its output and error files (files/<tenant>/<file id>), "
                "for any tenant.",
            },
            table="the sweeper queries the open-batch index and reads and moves batches by key.",
        )

        self.dead_letters = dead_letter_queue(
            self, "DeadLetters", of="schedule ticks EventBridge could not deliver to the sweeper"
        )
        self.rule = events.Rule(
            self,
            "Schedule",
            description="Runs the batch sweeper",
            schedule=events.Schedule.rate(cdk.Duration.seconds(settings.sweep_seconds)),
            targets=[
                targets.LambdaFunction(
                    self.function,
                    retry_attempts=SCHEDULE_RETRIES,
                    dead_letter_queue=self.dead_letters,
                    max_event_age=cdk.Duration.seconds(settings.sweep_seconds),
                )
            ],
        )
