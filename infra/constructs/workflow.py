"""The batch workflow: the state machine of ``infra/workflow.py`` (the same ASL the local deployment
runs on moto) and the workflow Lambda that performs its tasks.

One execution per batch (started by ingest) waits for the completion signal (task token), drains,
finalizes and publishes the batch's terminal EventBridge event. The state machine's ARN is built from
its fixed name (``names.state_machine_name``), so the Lambda it invokes can carry the same settings
as every other function without a circular reference.
"""

import aws_cdk as cdk
from aws_cdk import aws_iam as iam
from aws_cdk import aws_lambda as lambda_
from aws_cdk import aws_stepfunctions as sfn
from constructs import Construct

from functions.core import schema
from functions.core.settings import Settings
from infra import names, workflow
from infra.config import DeployConfig

from .common import (
    BATCH_PARTITIONS,
    CHUNK_PARTITIONS,
    acknowledge_data_grants,
    acknowledge_wildcards,
    arn_in_findings,
    grant_items,
    grant_release,
    grant_storage_charge,
    log_group,
    resource_prefix,
)
from .events import BatchEvents
from .ingest import BATCH_KEYS
from .lambdas import Lambdas
from .storage import Storage

#: Finalize streams a whole batch's parts into the output and error files (up to 50,000 lines).
WORKFLOW_TIMEOUT = cdk.Duration.minutes(15)
#: Where finalize writes the output and error files (``schema.file_key``).
FILE_KEYS = schema.file_key("*", "*")
#: The one action that resumes a waiting execution (no SendTaskFailure/Heartbeat: nobody sends those).
SIGNAL = "states:SendTaskSuccess"
#: The workflow's table rights (``common.grant_items``): read and update the batch, read its chunk
#: markers (one Query of the chunk partition) and run records; and put the output and error File
#: records (in the tenant's partition ``T#<tenant>``, inside finalize's transaction). No delete,
#: Scan, batch or index access; never an API key, the scaler's state or an idempotency record.
WORKFLOW_BATCH_ACTIONS = ("dynamodb:GetItem", "dynamodb:UpdateItem", "dynamodb:Query")
WORKFLOW_FILE_ACTIONS = ("dynamodb:PutItem",)
FILE_PARTITIONS = schema.tenant_pk("*")
#: IAM's ``*`` also matches ``#``: ``T#*`` alone would open every ``T#<tenant>#...`` partition
#: (batches, enqueued counters, budget, creation counters, webhooks) to PutItem. A tenant name has
#: no ``#``, so excluding ``T#*#*`` leaves exactly the tenants' own partitions.
NOT_FILE_PARTITIONS = schema.tenant_pk("*#*")


class Workflow(Construct):
    """``state_machine``, ``function`` (the workflow Lambda), ``event_bus`` (where batch events go:
    ``batch_events``' bus), and the grants other parts need: ``grant_start``, ``grant_signal``,
    ``grant_publish``."""

    def __init__(
        self,
        scope: Construct,
        id: str,
        *,
        config: DeployConfig,
        storage: Storage,
        lambdas: Lambdas,
        settings: Settings,
        batch_events: BatchEvents,
    ) -> None:
        super().__init__(scope, id)
        self.settings = settings
        self._batch_events = batch_events
        self.event_bus = batch_events.bus

        self.function = lambdas.function(
            self,
            "Function",
            handler="functions.workflow.handler.handler",
            environment=settings.to_env(),
            description="Batch workflow tasks: register the wait token, drain, finalize, fail",
            memory_size=1024,
            timeout=WORKFLOW_TIMEOUT,
        )
        grant_items(self.function, storage, WORKFLOW_BATCH_ACTIONS, (BATCH_PARTITIONS, CHUNK_PARTITIONS))
        # A batch's counting shards, read together (``BatchStore.count_shards``): chunk partitions only.
        grant_items(self.function, storage, ("dynamodb:BatchGetItem",), (CHUNK_PARTITIONS,))
        grant_items(
            self.function,
            storage,
            WORKFLOW_FILE_ACTIONS,
            (FILE_PARTITIONS,),  # output and error File records
            excluding=(NOT_FILE_PARTITIONS,),
        )
        grant_release(self.function, storage)  # finalize/fail release the batch's enqueued-cap reservation
        if settings.governance:  # the output files are counted on the stored-bytes ledger (docs/governance.md)
            grant_storage_charge(self.function, storage)
        storage.bucket.grant_read(self.function, BATCH_KEYS)  # input (never-ran lines), manifest, parts
        storage.bucket.grant_put(self.function, FILE_KEYS)  # output and error files (multipart)
        self.grant_publish(self.function)
        # register resumes the execution at once when the batch finished before its token existed.
        # The ARN comes from the name: a reference to the state machine would be circular.
        iam.Grant.add_to_principal(grantee=self.function, actions=[SIGNAL], resource_arns=[settings.state_machine_arn])
        acknowledge_data_grants(
            self.function.role,
            storage,
            {
                BATCH_KEYS: "Finalize reads a batch's manifest, chunk parts and (for requests that never ran) its "
                "input snapshot: only under batches/.",
                FILE_KEYS: "Finalize writes the output and error files of any tenant's batch (files/<tenant>/<file "
                "id>, ids minted at finalize).",
            },
            table=None,
        )

        self.state_machine = sfn.StateMachine(
            self,
            "StateMachine",
            state_machine_name=names.state_machine_name(resource_prefix(self)),
            comment="One execution per batch: wait for completion, cancel or expiry; drain; finalize.",
            definition_body=sfn.DefinitionBody.from_string(workflow.definition_json()),
            definition_substitutions={workflow.FUNCTION_PLACEHOLDER: self.function.function_arn},
            logs=sfn.LogOptions(
                destination=log_group(self, "StateMachineLogs", config),
                level=sfn.LogLevel.ALL,
                include_execution_data=True,
            ),
            tracing_enabled=True,
        )
        self.function.grant_invoke(self.state_machine)
        acknowledge_wildcards(
            self.state_machine.role,
            {
                f"Resource::{arn_in_findings(self.function)}:*": "grant_invoke covers the workflow Lambda's versions and "
                "aliases (<arn>:*); the state machine invokes only this one function.",
                "Resource::*": "Step Functions' log delivery (logs:CreateLogDelivery, GetLogDelivery, ...) and X-Ray "
                "(PutTraceSegments, GetSamplingRules...) have no resource-level permissions.",
            },
        )

    # --- what other parts may do with the workflow ----------------------------------------------
    def grant_start(self, grantee: iam.IGrantable) -> iam.Grant:
        """Start an execution (ingest: one per batch, named after it)."""
        return self.state_machine.grant_start_execution(grantee)

    def grant_signal(self, grantee: iam.IGrantable) -> iam.Grant:
        """Resume a waiting execution with its task token (cancel, the last chunk's worker or DLQ handler)."""
        return self.state_machine.grant(grantee, SIGNAL)

    def grant_publish(self, function: lambda_.IFunction) -> iam.Grant:
        """Put batch lifecycle events (source ``batch-api``) on the deployment's event bus (whose
        policy then admits the function's role)."""
        return self._batch_events.grant_publish(function)

    @property
    def functions(self) -> dict[str, lambda_.Function]:
        return {"workflow": self.function}
