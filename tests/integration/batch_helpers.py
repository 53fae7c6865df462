"""Helpers for batch tests: input lines, running ingest from its queue, reading work messages."""

import json
from typing import Any

from functions.core import clients
from functions.core.messages import WorkMessage
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


def run_ingest() -> int:
    """Deliver every pending S3 event from the ingest queue to the ingest handler."""
    return drain_queue(clients.client("sqs"), ingest_queue_url(clients.client, PREFIX), ingest_handler.handler, name="ingest")


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


# --- A stand-in for the GPU worker's per-chunk path (the engine is faked; accounting is real) ---
import time as _time

from functions.core import accounting, results
from functions.core.lines import iter_lines
from functions.core.ports import Stores


def fake_engine(body: dict[str, Any], custom_id: str) -> tuple[int, dict[str, Any]]:
    """A chat answer with usage; a request whose custom_id starts with "reject" gets a 400."""
    if custom_id.startswith("reject"):
        return 400, {"error": {"message": "rejected", "type": "BadRequestError", "param": None, "code": 400}}
    return 200, {
        "id": f"chatcmpl-{custom_id}",
        "object": "chat.completion",
        "model": body["model"],
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 10, "completion_tokens": 3, "total_tokens": 13},
    }


def run_chunk(stores: Stores, message: WorkMessage, *, start: bool = True) -> accounting.ChunkOutcome | None:
    """What a worker does with one chunk: skip it if the batch stopped, run every line, write the
    parts, count the chunk (which signals the workflow after the last one)."""
    if start and accounting.start_chunk(stores, message) is None:
        return None
    lines, usage = [], accounting.Usage()
    raw = stores.objects.iter_range(message.input_key, message.byte_start, message.byte_end)
    for line in iter_lines(raw, max_line_bytes=10**9, start=message.byte_start, first_number=message.first_line):
        if line.blank:
            continue
        request = json.loads(line.text)
        status, body = fake_engine(request["body"], request["custom_id"])
        if status == 200:
            usage.add_response(body.get("usage"))
        lines.append(results.response_line(request["custom_id"], status, body, f"req-{message.chunk}"))
    parts = results.write_parts(stores.objects, message, lines)
    return accounting.record_chunk(stores, message, parts=parts, usage=usage, now=int(_time.time()))


def wait_for_execution(settings: Settings, batch_id: str, timeout: float = 90.0) -> dict[str, Any]:
    sfn = clients.client("stepfunctions")
    arn = f"{settings.state_machine_arn.replace(':stateMachine:', ':execution:')}:{batch_id}"
    deadline = _time.monotonic() + timeout
    while _time.monotonic() < deadline:
        execution = sfn.describe_execution(executionArn=arn)
        if execution["status"] != "RUNNING":
            return execution
        _time.sleep(0.05)
    raise AssertionError(f"execution {batch_id} still running after {timeout}s")


def wait_for_task_token(stores: Stores, tenant: str, batch_id: str, timeout: float = 10.0) -> str:
    deadline = _time.monotonic() + timeout
    while _time.monotonic() < deadline:
        batch = stores.batches.get(tenant, batch_id)
        if batch and batch.task_token:
            return batch.task_token
        _time.sleep(0.02)
    raise AssertionError("the workflow never registered its task token")
