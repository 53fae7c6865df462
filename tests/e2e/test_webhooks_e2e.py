"""Webhooks under `make up` (the local deployment, ``python -m infra.local``, engines off): an
endpoint created with ``batchctl webhooks create``, a batch that fails validation, a receiver that
is down for the first attempt (connection refused) and then runs as a separate process, verifying
every delivery with the official SDK's ``client.webhooks.unwrap``. The second attempt comes 5 s
after the first (the schedule's first delay, docs/webhooks.md)."""

import io
import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from batchctl import cli
from infra import names

from .conftest import LocalDeployment, clean_env, free_port

pytestmark = [pytest.mark.e2e, pytest.mark.local_only("plain http to a loopback receiver: the local deployment only")]

RECEIVER = r"""
import http.server, json, os, sys
import openai
sdk, secret, out = openai.OpenAI(api_key="unused", base_url="http://127.0.0.1:9"), os.environ["SECRET"], os.environ["OUT"]
class Handle(http.server.BaseHTTPRequestHandler):
    def do_POST(self):
        body = self.rfile.read(int(self.headers["content-length"]))
        headers = {k.lower(): v for k, v in self.headers.items()}
        try:
            event = sdk.webhooks.unwrap(body, headers, secret=secret)
            row = {"verified": True, "type": event.type, "data_id": event.data.id, "event_id": event.id}
        except Exception as exc:
            row = {"verified": False, "error": repr(exc)}
        row["webhook_id"] = headers.get("webhook-id")
        with open(out, "a") as f:
            f.write(json.dumps(row) + "\n")
        self.send_response(200 if row["verified"] else 400)
        self.send_header("content-length", "0")
        self.end_headers()
    def log_message(self, *args):
        pass
server = http.server.HTTPServer(("127.0.0.1", int(os.environ["PORT"])), Handle)
print("READY", flush=True)
server.serve_forever()
"""


def batchctl(local: LocalDeployment, *argv: str) -> str:
    out, err = io.StringIO(), io.StringIO()
    code = cli.main(["--local", *argv], env=local.env, out=out, err=err)
    assert code == 0, err.getvalue()
    return out.getvalue()


def deliveries(local: LocalDeployment, tenant: str, limit: int = 20) -> list[dict]:
    return [
        json.loads(line)
        for line in batchctl(local, "webhooks", "deliveries", "--tenant", tenant, "--limit", str(limit)).splitlines()
    ]


def wait_for(what: str, check, timeout: float) -> object:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if found := check():
            return found
        time.sleep(0.5)
    pytest.fail(f"timed out after {timeout}s waiting for {what}")


def test_a_receiver_down_for_the_first_attempt_gets_the_next_one_verified_by_the_sdk(
    local: LocalDeployment, tmp_path: Path
) -> None:
    tenant = "webhooks-e2e"
    port = free_port()
    created = json.loads(
        batchctl(
            local,
            "webhooks",
            "create",
            "--tenant",
            tenant,
            "--url",
            f"http://127.0.0.1:{port}/hooks",
            "--events",
            "batch.failed",
        )
    )
    model = names.LOCAL_CHAT_MODEL
    line = {
        "custom_id": "dup",
        "method": "POST",
        "url": "/v1/chat/completions",
        "body": {"model": model, "messages": [{"role": "user", "content": "hi"}]},
    }
    with local.client(local.new_key(tenant)) as sdk:
        upload = sdk.files.create(file=("in.jsonl", (json.dumps(line) + "\n") * 2), purpose="batch")
        batch = sdk.batches.create(input_file_id=upload.id, endpoint="/v1/chat/completions", completion_window="24h")

    # The receiver is down: the first attempt is refused and logged for the operator.
    first = wait_for("the first (refused) attempt", lambda: deliveries(local, tenant), 60)
    assert [(a["attempt"], a["outcome"]) for a in first] == [(1, "retry")]
    assert first[0]["next_at"] - first[0]["at"] == 5 and first[0]["event_type"] == "batch.failed"

    received = tmp_path / "received.jsonl"
    receiver = subprocess.Popen(
        [sys.executable, "-c", RECEIVER],
        stdout=subprocess.PIPE,
        text=True,
        env=clean_env(PORT=str(port), SECRET=created["signing_secret"], OUT=str(received)),
    )
    try:
        assert receiver.stdout.readline().strip() == "READY"
        rows = wait_for("a delivery", lambda: received.exists() and received.read_text().splitlines(), 60)
    finally:
        receiver.terminate()
        receiver.wait(timeout=10)
    [row] = [json.loads(r) for r in rows]
    assert row["verified"] is True, row
    assert (row["type"], row["data_id"]) == ("batch.failed", batch.id)
    assert row["webhook_id"] == first[0]["webhook_id"]  # the same message, retried
    log = wait_for(
        "the delivered attempt", lambda: [a for a in deliveries(local, tenant) if a["outcome"] == "delivered"], 10
    )
    assert [(a["attempt"], a["status_code"]) for a in log] == [(2, 200)]
