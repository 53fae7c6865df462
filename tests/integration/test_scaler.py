"""The scaler Lambda on moto: its adapters (ECS DescribeServices/UpdateService, SQS queue
attributes, its state item in the table) and the handler, through the three situations it
exists for (docs/deploy.md, "Scaling"): zero tasks with messages waiting, a growing backlog, and an empty queue for the idle period."""

import json

import pytest

from functions.core import clients, deps, schema
from functions.scaler import handler as scaler_handler
from infra.local.lambda_context import LocalLambdaContext

T = 2
IDLE = 600


@pytest.fixture
def gpu_service(aws, monkeypatch, clock):
    """A model's ECS service at zero tasks (moto), wired into the scaler's environment."""
    ecs = clients.client("ecs")
    ecs.create_cluster(clusterName="gpu")
    ecs.register_task_definition(family="worker", containerDefinitions=[{"name": "w", "image": "x", "memory": 512}])
    ecs.create_service(cluster="gpu", serviceName="model", taskDefinition="worker", desiredCount=0)
    queue_url = aws.models[next(iter(aws.models))].queue_url
    service = {
        "model": "m",
        "cluster": "gpu",
        "service": "model",
        "queue_url": queue_url,
        "min_tasks": 0,
        "max_tasks": 3,
        "backlog_per_task": T,
        "idle_seconds": IDLE,
        "scale_in_cooldown_seconds": 300,
    }
    monkeypatch.setenv("SCALER_TABLE_NAME", aws.table_name)
    monkeypatch.setenv("SCALER_SERVICES", json.dumps([service]))
    deps.reset()
    yield queue_url
    deps.reset()


def _desired() -> int:
    return clients.client("ecs").describe_services(cluster="gpu", services=["model"])["services"][0]["desiredCount"]


def _invoke(event: dict | None = None) -> dict:
    return scaler_handler.handler(event or {"detail-type": "Scheduled Event"}, LocalLambdaContext("scaler"))


def test_scaler_starts_a_gpu_for_waiting_messages_grows_and_returns_to_zero(gpu_service, clock):
    sqs = clients.client("sqs")
    assert _invoke() == {"m": {"desired": 0, "reason": "steady"}}  # idle and at zero: nothing to do
    assert _desired() == 0

    # Zero tasks, messages waiting (the workflow-start event right after ingest enqueued them).
    sqs.send_message(QueueUrl=gpu_service, MessageBody="chunk-1")
    _invoke({"detail-type": "Step Functions Execution Status Change", "detail": {"status": "RUNNING"}})
    assert _desired() == 1

    # Tasks busy (one chunk in flight), backlog growing: floor(backlog / T) + 1, at most 3.
    sqs.receive_message(QueueUrl=gpu_service, VisibilityTimeout=900)
    sqs.send_message_batch(QueueUrl=gpu_service, Entries=[{"Id": str(i), "MessageBody": f"c{i}"} for i in range(2)])
    clock.now += 60
    _invoke()
    assert _desired() == 2  # 3 chunks (2 waiting + 1 in flight), T=2
    sqs.send_message_batch(QueueUrl=gpu_service, Entries=[{"Id": str(i), "MessageBody": f"d{i}"} for i in range(6)])
    clock.now += 60
    _invoke()
    assert _desired() == 3  # capped at max_tasks

    # The backlog empties: the tasks stay for the idle period, then the service returns to zero.
    sqs.purge_queue(QueueUrl=gpu_service)
    clock.now += 60
    _invoke()
    assert _desired() == 3
    item = clients.dynamodb_table(deps.settings().table_name).get_item(
        Key={schema.PK: schema.scaler_pk("m"), schema.SK: "STATE"}
    )["Item"]
    assert int(item["idle_since"]) == clock.now
    clock.now += IDLE - 1
    _invoke()
    assert _desired() == 3
    clock.now += 1
    assert _invoke() == {"m": {"desired": 0, "reason": "idle"}}
    assert _desired() == 0


def test_one_models_failure_does_not_stop_the_others_and_fails_the_invocation(gpu_service, monkeypatch, clock):
    good = json.loads(scaler_handler.os.environ["SCALER_SERVICES"])[0]
    missing = {**good, "model": "gone", "service": "no-such-service"}
    monkeypatch.setenv("SCALER_SERVICES", json.dumps([missing, good]))
    deps.reset()
    clients.client("sqs").send_message(QueueUrl=gpu_service, MessageBody="chunk")
    with pytest.raises(LookupError):
        _invoke()
    assert _desired() == 1  # the good model was still scaled
