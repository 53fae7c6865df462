"""What the benchmarks that drive the local deployment share: a chat batch submitted through the
openai SDK, and the worker's "chunk done" log lines of a batch (its timestamps: received_at,
first_sent_at, last_answer_at, committed_at)."""

from __future__ import annotations

import io
import json
import time
from pathlib import Path

from infra import names

CHAT = "/v1/chat/completions"
ENDED = ("completed", "failed", "expired", "cancelled")


def submit_chat(sdk, *, lines: int, max_tokens: int, tag: str):
    """Upload a ``lines``-line chat file (``max_tokens`` each, ``ignore_eos``) and create its batch;
    returns the batch and the wall time right after ``batches.create`` answered."""
    rows = [
        {
            "custom_id": f"{tag}-{i}",
            "method": "POST",
            "url": CHAT,
            "body": {
                "model": names.LOCAL_CHAT_MODEL,
                "max_tokens": max_tokens,
                "ignore_eos": True,
                "temperature": 0,
                "messages": [{"role": "user", "content": f"Say something about the number {i} ({tag})."}],
            },
        }
        for i in range(lines)
    ]
    data = "".join(json.dumps(r) + "\n" for r in rows).encode()
    file_id = sdk.files.create(file=("input.jsonl", io.BytesIO(data)), purpose="batch").id
    return sdk.batches.create(input_file_id=file_id, endpoint=CHAT, completion_window="24h"), time.time()


def chunk_logs(log: Path, batch_id: str, *, wait_seconds: float = 10.0) -> list[dict]:
    """The worker's "chunk done" records of ``batch_id``, waiting up to ``wait_seconds`` for the
    first (the worker logs it after it deletes the message, so just after the batch completes)."""
    deadline = time.time() + wait_seconds
    while True:
        found = []
        for line in log.read_text(errors="replace").splitlines():
            if batch_id in line and '"chunk done"' in line:
                try:
                    found.append(json.loads(line))
                except ValueError:
                    continue
        if found or time.time() >= deadline:
            return found
        time.sleep(0.1)
