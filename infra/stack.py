"""The stack: composes one construct per concern and names its outputs. Defines nothing itself.

Later constructs slot in the same way: ``Ingest`` (S3 -> SQS -> ingest Lambda, per-model work
queues), ``Workflow`` (the state machine of infra/workflow.py), ``Worker`` (per-model GPU service);
each takes ``config``, ``storage`` and ``lambdas`` and hands its resources to ``monitoring``.
"""

from typing import Any

import aws_cdk as cdk
from constructs import Construct

from infra import names
from infra.config import DeployConfig
from infra.constructs.api import Api
from infra.constructs.lambdas import Lambdas
from infra.constructs.monitoring import Monitoring
from infra.constructs.reaper import Reaper
from infra.constructs.storage import Storage


class BatchApiStack(cdk.Stack):
    def __init__(self, scope: Construct, id: str, *, config: DeployConfig, **kwargs: Any) -> None:
        super().__init__(scope, id, description="OpenAI-compatible Files and Batch API (vLLM workers)", **kwargs)
        self.config = config

        self.storage = Storage(self, "Storage", config=config)
        self.lambdas = Lambdas(self, "Lambdas", config=config)
        self.api = Api(self, "Api", config=config, storage=self.storage, lambdas=self.lambdas)
        self.reaper = Reaper(self, "Reaper", config=config, storage=self.storage, lambdas=self.lambdas)

        self.monitoring = Monitoring(self, "Monitoring", config=config)
        self.monitoring.watch_rest_api(self.api.rest_api)
        self.monitoring.watch_functions({**self.api.functions, "reaper": self.reaper.function})
        self.monitoring.watch_dead_letter_queue("reaper", self.reaper.dead_letters)

        cdk.CfnOutput(self, names.OUTPUT_API_URL, value=self.api.url, description="base_url for the openai SDK")
        cdk.CfnOutput(self, names.OUTPUT_TABLE, value=self.storage.table.table_name)
        cdk.CfnOutput(self, names.OUTPUT_BUCKET, value=self.storage.bucket.bucket_name)
