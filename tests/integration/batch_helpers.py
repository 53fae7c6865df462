"""Helpers for batch tests: input lines, running ingest from its queue, reading work messages."""

import json
import time
from typing import Any

from functions.core import audit, clients
from functions.core.messages import WorkMessage
from functions.core.ports import Stores
from functions.core.records import ChunkRecord
from functions.core.settings import Settings
from functions.ingest import handler as ingest_handler
from infra.local.pollers import drain_queue
from infra.local.resources import ingest_queue_url
from tests.conftest import PREFIX

CHAT = "/v1/chat/completions"


def line(i: int, model: str = "test-chat", url: str = CHAT, **extra: Any) -> str:
    body = {"model": model, "messages": [{"role": "user", "content": f"hi {i}"}]}
    return json.dumps({"custom_id": f"req-{i}", "method": "POST", "url": url, "body": body, **extra})


def submit(client, content: bytes, endpoint: str = CHAT, window: str = "24h", **kwargs: Any):
    f = client.files.create(file=("in.jsonl", content), purpose="batch")
    return client.batches.create(input_file_id=f.id, endpoint=endpoint, completion_window=window, **kwargs)


def count_and_charge(stores: Stores, appender: Any, marker: ChunkRecord) -> bool:
    """Count a chunk as a worker does and append its receipt (the appender charges the tenant's
    budget from the marker with it); whether the count was new."""
    counted = stores.batches.count_chunk(marker)
    message = WorkMessage(
        batch_id=marker.batch_id,
        tenant=marker.tenant,
        chunk=marker.chunk,
        input_key="k",
        byte_start=0,
        byte_end=1,
        first_line=1,
        line_count=marker.completed + marker.failed,
        endpoint=CHAT,
        model="test-chat",
        expires_at=marker.expires_at,
    )
    audit.append_receipt(stores, message, marker, at=marker.recorded_at)
    appender.drain()
    return counted


def run_ingest() -> int:
    """Deliver every pending S3 event from the ingest queue to the ingest handler."""
    return drain_queue(
        clients.client("sqs"), ingest_queue_url(clients.client, PREFIX), ingest_handler.handler, name="ingest"
    )


def take_work(settings: Settings, model: str = "test-chat") -> list[WorkMessage]:
    """Receive (and delete) every work message of a model's queue, in chunk order."""
    sqs = clients.client("sqs")
    url = settings.models[model].queue_url
    out = []
    while messages := sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10).get("Messages", []):
        for m in messages:
            out.append(WorkMessage.model_validate_json(m["Body"]))
            sqs.delete_message(QueueUrl=url, ReceiptHandle=m["ReceiptHandle"])
    return sorted(out, key=lambda m: m.chunk)


def executions(settings: Settings) -> list[dict[str, Any]]:
    return clients.client("stepfunctions").list_executions(stateMachineArn=settings.state_machine_arn)["executions"]


def wait_for_execution(settings: Settings, batch_id: str, timeout: float = 90.0) -> dict[str, Any]:
    sfn = clients.client("stepfunctions")
    arn = f"{settings.state_machine_arn.replace(':stateMachine:', ':execution:')}:{batch_id}"
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        execution = sfn.describe_execution(executionArn=arn)
        if execution["status"] != "RUNNING":
            return execution
        time.sleep(0.05)
    raise AssertionError(f"execution {batch_id} still running after {timeout}s")


def wait_for_task_token(stores: Stores, tenant: str, batch_id: str, timeout: float = 10.0) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        batch = stores.batches.get(tenant, batch_id)
        if batch and batch.task_token:
            return batch.task_token
        time.sleep(0.02)
    raise AssertionError("the workflow never registered its task token")
