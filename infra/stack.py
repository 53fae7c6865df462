"""The stack: composes one construct per concern, wires them, and names its outputs. Defines no
resource itself.

Order matters only for what a construct hands the next: ``Ingest`` creates the queues and with
them the one ``Settings`` every function and the GPU worker read (``Settings.to_env()``);
``Workflow`` grants who may start and signal it; ``StreamFront`` (unless the config turns it off)
puts a distribution in front of the ``Api``, whose URL becomes the stack's; ``Workers`` runs one GPU
service per model; ``Monitoring`` watches them all.
"""

from typing import Any

import aws_cdk as cdk
from aws_cdk import aws_iam as iam
from constructs import Construct

from infra import names
from infra.config import DeployConfig
from infra.constructs.api import Api
from infra.constructs.audit import Audit
from infra.constructs.events import BatchEvents
from infra.constructs.ingest import Ingest
from infra.constructs.lambdas import Lambdas
from infra.constructs.monitoring import Monitoring
from infra.constructs.reaper import Reaper
from infra.constructs.storage import Storage
from infra.constructs.stream_front import StreamFront
from infra.constructs.sweeper import Sweeper
from infra.constructs.uploads import Uploads
from infra.constructs.webhooks import Webhooks
from infra.constructs.worker import Workers
from infra.constructs.workflow import Workflow


class BatchApiStack(cdk.Stack):
    def __init__(self, scope: Construct, id: str, *, config: DeployConfig, **kwargs: Any) -> None:
        super().__init__(scope, id, description="OpenAI-compatible Files and Batch API (vLLM workers)", **kwargs)
        self.config = config

        self.storage = Storage(self, "Storage", config=config)
        self.lambdas = Lambdas(self, "Lambdas", config=config)
        # The bus of the batch lifecycle events: only the publishers granted below may put events
        # on it (docs/webhooks.md, "Who may publish").
        self.events = BatchEvents(self, "Events")
        self.ingest = Ingest(self, "Ingest", config=config, storage=self.storage, lambdas=self.lambdas)
        # The upload assembler's queue goes into the one Settings (docs/uploads.md).
        self.uploads = Uploads(
            self, "Uploads", config=config, storage=self.storage, lambdas=self.lambdas, settings=self.ingest.settings
        )
        self.uploads.share_settings(self.ingest.functions.values())
        # Webhooks (docs/webhooks.md): terminal batch events fanned out to tenants' endpoints; its
        # queue goes into the one Settings too.
        self.webhooks = Webhooks(
            self,
            "Webhooks",
            config=config,
            storage=self.storage,
            lambdas=self.lambdas,
            settings=self.uploads.settings,
            bus=self.events.bus,
        )
        self.settings = self.webhooks.settings
        self.webhooks.share_settings([*self.ingest.functions.values(), self.uploads.function])
        # The audit chains (docs/audit.md, governance on): the audit queue's URL goes into the one
        # Settings; only its appender writes the chains, every writer may only send to the queue.
        self.audit = Audit(
            self, "Audit", config=config, storage=self.storage, lambdas=self.lambdas, settings=self.webhooks.settings
        )
        self.settings = self.audit.settings
        self.audit.share_settings([*self.ingest.functions.values(), self.uploads.function, self.webhooks.function])
        common: dict[str, Any] = {
            "config": config,
            "storage": self.storage,
            "lambdas": self.lambdas,
            "settings": self.settings,
        }
        self.workflow = Workflow(self, "Workflow", **common, batch_events=self.events)
        self.api = Api(self, "Api", **common)
        self.uploads.grant_dispatch(self.api.api_function)
        # The large bodies' path (infra/constructs/stream_front.py): a distribution in front of the
        # API, its file and part routes streamed by a Fargate service; none with stream_front false.
        self.stream_front = (
            StreamFront(
                self,
                "StreamFront",
                config=config,
                storage=self.storage,
                settings=self.settings,
                rest_api=self.api.rest_api,
            )
            if config.stream_front is not None
            else None
        )
        self.reaper = Reaper(self, "Reaper", **common)
        self.workers = Workers(
            self,
            "Workers",
            config=config,
            settings=self.settings,
            storage=self.storage,
            work_queues=self.ingest.work_queues,
            workflow=self.workflow,
            lambdas=self.lambdas,
        )

        # Who may drive the workflow: ingest starts one execution per batch (and publishes the
        # events of batches that never start); cancel, the DLQ handler and the worker that counts
        # the last chunk resume it.
        self.workflow.grant_start(self.ingest.function)
        self.workflow.grant_publish(self.ingest.function)
        self.workflow.grant_signal(self.api.api_function)
        self.workflow.grant_signal(self.ingest.dlq_function)
        # Who sends audit intents: the API (its actions), the chunk counters (receipts).
        writers: list[iam.IGrantable] = [
            self.api.api_function,
            self.ingest.dlq_function,
            *(w.task_definition.task_role for w in self.workers.workers.values()),
            *([self.stream_front.task_role] if self.stream_front is not None else []),
        ]
        for writer in writers:
            self.audit.grant_send(writer)
        # The ingest DLQ's consumer retries a fan-out once: it starts the workflow and publishes
        # the events of batches it ends (docs/lifecycle.md, "Liveness: every batch ends").
        self.workflow.grant_start(self.ingest.ingest_dlq_function)
        self.workflow.grant_publish(self.ingest.ingest_dlq_function)
        # The sweeper ends or restarts every open batch the normal path left behind.
        self.sweeper = Sweeper(self, "Sweeper", **common, ingest=self.ingest, workflow=self.workflow)
        # Every publisher is granted: the bus policy admits them and denies everyone else.
        self.events.seal()

        self.monitoring = Monitoring(self, "Monitoring", config=config)
        self.monitoring.watch_rest_api(self.api.rest_api)
        self.monitoring.watch_batch_events(self.events.bus)
        self.monitoring.watch_workflow(self.workflow.state_machine)
        self.monitoring.watch_functions(
            {
                **self.api.functions,
                **self.ingest.functions,
                **self.workflow.functions,
                "reaper": self.reaper.function,
                "sweeper": self.sweeper.function,
                "assembler": self.uploads.function,
                "scaler": self.workers.scaler.function,
                "webhooks": self.webhooks.function,
                **({"audit-append": self.audit.function} if self.audit.function is not None else {}),
            }
        )
        self.monitoring.watch_queue("ingest", self.ingest.ingest_queue)
        self.monitoring.watch_dead_letter_queue("ingest", self.ingest.ingest_dead_letters)
        self.monitoring.watch_dead_letter_queue("reaper", self.reaper.dead_letters)
        self.monitoring.watch_dead_letter_queue("sweeper", self.sweeper.dead_letters)
        self.monitoring.watch_dead_letter_queue("assembler", self.uploads.dead_letters)
        self.monitoring.watch_dead_letter_queue("webhooks", self.webhooks.dead_letters)
        self.monitoring.watch_webhook_drops()
        self.monitoring.watch_dead_letter_queue("scaler", self.workers.scaler.dead_letters)
        if self.audit.dead_letters is not None:  # intents the appender gave up on (docs/audit.md)
            self.monitoring.watch_dead_letter_queue("audit-append", self.audit.dead_letters)
        for model in config.models:
            worker_config = model.worker_config()
            self.monitoring.watch_model(
                model.name,
                self.workers.workers[model.name],
                namespace=worker_config.metrics_namespace,
                service=worker_config.service,
            )
            self.monitoring.watch_work_dead_letters(model.name, self.ingest.work_dead_letters[model.name])

        url = self.stream_front.url if self.stream_front is not None else self.api.url
        cdk.CfnOutput(self, names.OUTPUT_API_URL, value=url, description="base_url for the openai SDK")
        cdk.CfnOutput(self, names.OUTPUT_TABLE, value=self.storage.table.table_name)
        cdk.CfnOutput(self, names.OUTPUT_BUCKET, value=self.storage.bucket.bucket_name)

    @property
    def availability_zones(self) -> list[str]:
        """The first two zones of the region, as deploy-time values: CDK would otherwise look the
        zones up at synth time when the config pins an account and region (synth makes no AWS calls)."""
        return [cdk.Fn.select(i, cdk.Fn.get_azs()) for i in range(2)]
