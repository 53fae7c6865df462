"""Creates the deployment's AWS resources on moto from the same definitions the CDK stack uses,
and returns the settings that point at them (as the stack's outputs do for a deployment)."""

import json
from collections.abc import Callable
from typing import Any

from functions.core import schema
from functions.core.settings import Settings
from infra import names, workflow
from infra.config import AuditObjectLockConfig

ACCOUNT = "123456789012"
REGION = "us-east-1"


def create_resources(
    settings: Settings, client: Callable[[str], Any], *, prefix: str, workflow_function_arn: str | None = None
) -> Settings:
    """Idempotently create the table, bucket, ingest queue + S3 notification, one work queue (with
    DLQ) per served model, the batch event bus (unless the settings name the default bus), and the
    batch state machine. Returns ``settings`` with the queue URLs
    and the state machine ARN filled in."""
    dynamodb, s3, sqs = client("dynamodb"), client("s3"), client("sqs")
    if settings.table_name not in dynamodb.list_tables()["TableNames"]:
        dynamodb.create_table(TableName=settings.table_name, **schema.TABLE_SCHEMA)
        dynamodb.update_time_to_live(
            TableName=settings.table_name,
            TimeToLiveSpecification={"Enabled": True, "AttributeName": schema.TTL},
        )
    if settings.bucket_name not in {b["Name"] for b in s3.list_buckets().get("Buckets", [])}:
        s3.create_bucket(Bucket=settings.bucket_name)

    ingest_url = _queue_with_dlq(sqs, names.ingest_queue_name(prefix), names.INGEST_MAX_RECEIVES, visibility=60)
    ingest_arn = sqs.get_queue_attributes(QueueUrl=ingest_url, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
    s3.put_bucket_notification_configuration(
        Bucket=settings.bucket_name,
        NotificationConfiguration={
            "QueueConfigurations": [
                {
                    "QueueArn": ingest_arn,
                    "Events": ["s3:ObjectCreated:*"],
                    "Filter": {
                        "Key": {
                            "FilterRules": [
                                {"Name": "prefix", "Value": schema.BATCHES_PREFIX},
                                {"Name": "suffix", "Value": schema.INPUT_NAME},
                            ]
                        }
                    },
                }
            ]
        },
    )
    models = {
        name: route.model_copy(
            update={
                "queue_url": _queue_with_dlq(
                    sqs,
                    names.work_queue_name(prefix, name),
                    names.WORK_MAX_RECEIVES,
                    visibility=names.WORK_VISIBILITY_SECONDS,
                )
            }
        )
        for name, route in settings.models.items()
    }
    if settings.event_bus_name != "default":  # the stack's own bus (infra/constructs/events.py), by its name
        events = client("events")
        if settings.event_bus_name not in {b["Name"] for b in events.list_event_buses()["EventBuses"]}:
            events.create_event_bus(Name=settings.event_bus_name)
    state_machine_arn = settings.state_machine_arn
    if workflow_function_arn is not None:
        state_machine_arn = _state_machine(
            client("stepfunctions"), names.state_machine_name(prefix), workflow_function_arn
        )
    concrete = settings.model_copy(update={"models": models, "state_machine_arn": state_machine_arn})
    return create_audit_resources(concrete, client, prefix=prefix) if settings.governance else concrete


def audit_bucket_name(prefix: str) -> str:
    return f"{prefix}-audit"


def create_audit_resources(
    settings: Settings,
    client: Callable[[str], Any],
    *,
    prefix: str,
    lock: AuditObjectLockConfig = AuditObjectLockConfig(),
) -> Settings:
    """The audit queue (FIFO, + its FIFO DLQ) and the Object Lock bucket of the chains' copies and
    checkpoints, as infra/constructs/audit.py builds them (docs/audit.md), with the stack's
    default retention; returns ``settings`` naming them. moto keeps what S3 documents for Object
    Lock: a locked version cannot be deleted (AccessDenied), a PUT into a bucket with a default
    retention needs a Content-MD5 or checksum, If-None-Match refuses an existing key; it does not
    evaluate bucket policies (nothing IAM is evaluated locally)."""
    sqs, s3 = client("sqs"), client("s3")
    fifo = {"FifoQueue": "true", "DeduplicationScope": "messageGroup", "FifoThroughputLimit": "perMessageGroupId"}
    dlq_url = sqs.create_queue(QueueName=names.audit_dead_letter_queue_name(prefix), Attributes=fifo)["QueueUrl"]
    dlq_arn = sqs.get_queue_attributes(QueueUrl=dlq_url, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
    url = sqs.create_queue(
        QueueName=names.audit_queue_name(prefix),
        Attributes={
            **fifo,
            "VisibilityTimeout": str(names.AUDIT_VISIBILITY_SECONDS),
            "RedrivePolicy": json.dumps(
                {"deadLetterTargetArn": dlq_arn, "maxReceiveCount": str(names.AUDIT_MAX_RECEIVES)}
            ),
        },
    )["QueueUrl"]
    bucket = audit_bucket_name(prefix)
    if bucket not in {b["Name"] for b in s3.list_buckets().get("Buckets", [])}:
        s3.create_bucket(Bucket=bucket, ObjectLockEnabledForBucket=True)  # versioning comes with it
        s3.put_object_lock_configuration(
            Bucket=bucket,
            ObjectLockConfiguration={
                "ObjectLockEnabled": "Enabled",
                "Rule": {"DefaultRetention": {"Mode": lock.mode.upper(), "Days": lock.retention_days}},
            },
        )
    return settings.model_copy(update={"audit_queue_url": url, "audit_bucket_name": bucket})


def audit_dlq_url(client: Callable[[str], Any], prefix: str) -> str:
    return client("sqs").get_queue_url(QueueName=names.audit_dead_letter_queue_name(prefix))["QueueUrl"]


def create_webhook_queue(client: Callable[[str], Any], *, prefix: str, event_bus: str) -> tuple[str, str]:
    """The webhook queue (+ DLQ) and the EventBridge rule routing batch events to it from
    ``event_bus``, as infra/constructs/webhooks.py builds them (docs/webhooks.md); returns the
    URLs of the queue and of its dead-letter queue."""
    from functions.webhooks import logic  # only the local deployment needs it

    sqs, events = client("sqs"), client("events")
    name = f"{prefix}-webhooks"
    url = _queue_with_dlq(sqs, name, logic.MAX_RECEIVES, visibility=logic.QUEUE_VISIBILITY_SECONDS)
    arn = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
    rule = f"{prefix}-webhook-events"
    events.put_rule(Name=rule, EventBusName=event_bus, EventPattern=json.dumps(logic.event_pattern()))
    events.put_targets(Rule=rule, EventBusName=event_bus, Targets=[{"Id": "webhooks", "Arn": arn}])
    return url, sqs.get_queue_url(QueueName=names.dead_letter_queue_name(name))["QueueUrl"]


def ingest_queue_url(client: Callable[[str], Any], prefix: str) -> str:
    return client("sqs").get_queue_url(QueueName=names.ingest_queue_name(prefix))["QueueUrl"]


def ingest_dlq_url(client: Callable[[str], Any], prefix: str) -> str:
    """The ingest queue's dead-letter queue (its consumer ends or resumes the batch)."""
    name = names.dead_letter_queue_name(names.ingest_queue_name(prefix))
    return client("sqs").get_queue_url(QueueName=name)["QueueUrl"]


def work_dlq_url(client: Callable[[str], Any], prefix: str, model: str) -> str:
    name = names.dead_letter_queue_name(names.work_queue_name(prefix, model))
    return client("sqs").get_queue_url(QueueName=name)["QueueUrl"]


def _queue_with_dlq(sqs: Any, name: str, max_receives: int, *, visibility: int) -> str:
    dlq_url = sqs.create_queue(QueueName=names.dead_letter_queue_name(name))["QueueUrl"]
    dlq_arn = sqs.get_queue_attributes(QueueUrl=dlq_url, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
    return sqs.create_queue(
        QueueName=name,
        Attributes={
            "VisibilityTimeout": str(visibility),
            "RedrivePolicy": json.dumps({"deadLetterTargetArn": dlq_arn, "maxReceiveCount": str(max_receives)}),
        },
    )["QueueUrl"]


def _state_machine(sfn: Any, name: str, function_arn: str) -> str:
    arn = f"arn:aws:states:{REGION}:{ACCOUNT}:stateMachine:{name}"
    definition = workflow.render(function_arn)
    existing = {m["stateMachineArn"] for m in sfn.list_state_machines()["stateMachines"]}
    if arn in existing:
        sfn.update_state_machine(stateMachineArn=arn, definition=definition)
        return arn
    return sfn.create_state_machine(
        name=name, definition=definition, roleArn=f"arn:aws:iam::{ACCOUNT}:role/{name}-role"
    )["stateMachineArn"]
