"""``make demo`` (with ``make up`` running): a small chat batch through the official openai SDK.

Submits a few chat requests to the local deployment, shows progress while the batch runs, and
prints a few results. Only the SDK talks to the system; the base URL comes from the running
deployment's state file (``BATCHAPI_BASE_URL`` overrides it).
"""

import json
import os
import sys
import time

from openai import OpenAI

from infra import names

from . import state

QUESTIONS = [
    "What is the capital of France?",
    "Name three primary colors.",
    "What is 12 times 12?",
    "Write a haiku about the sea.",
    "What does a GPU do?",
    "Translate 'good morning' into Spanish.",
    "Give one tip for writing clear code.",
    "Why is the sky blue? One sentence.",
]


def main() -> int:
    base_url = os.environ.get("BATCHAPI_BASE_URL")
    if not base_url:
        local = state.LocalState.read(state.state_path(os.environ))
        if local is None:
            print("No local deployment is running: start `make up` first.", file=sys.stderr)
            return 1
        base_url = local.api_base_url
    client = OpenAI(base_url=base_url, api_key=os.environ.get("BATCHAPI_API_KEY", names.LOCAL_KEY))

    lines = [
        json.dumps(
            {
                "custom_id": f"question-{i}",
                "method": "POST",
                "url": "/v1/chat/completions",
                "body": {
                    "model": names.LOCAL_CHAT_MODEL,
                    "max_tokens": 48,
                    "messages": [{"role": "user", "content": q}],
                },
            }
        )
        for i, q in enumerate(QUESTIONS)
    ]
    batch_file = client.files.create(file=("demo.jsonl", ("\n".join(lines) + "\n").encode()), purpose="batch")
    batch = client.batches.create(input_file_id=batch_file.id, endpoint="/v1/chat/completions", completion_window="24h")
    print(f"batch {batch.id}: {len(lines)} requests to {names.LOCAL_CHAT_MODEL}")
    while batch.status not in ("completed", "failed", "expired", "cancelled"):
        time.sleep(1)
        batch = client.batches.retrieve(batch.id)
        counts = batch.request_counts
        done = (counts.completed + counts.failed) if counts else 0
        total = counts.total if counts and counts.total else len(lines)
        bar = "#" * int(30 * done / total)
        print(f"\r  {batch.status:<12} [{bar:<30}] {done}/{total}", end="", flush=True)
    print()
    if batch.status != "completed" or batch.output_file_id is None:
        print(f"batch ended {batch.status}: {batch.errors}")
        return 1
    if batch.usage is not None:
        print(f"usage: {batch.usage.input_tokens} input + {batch.usage.output_tokens} output tokens")
    for row in client.files.content(batch.output_file_id).text.splitlines()[:3]:
        result = json.loads(row)
        answer = result["response"]["body"]["choices"][0]["message"]["content"].strip().replace("\n", " ")
        question = QUESTIONS[int(result["custom_id"].split("-")[1])]
        print(f"- {question}\n  -> {answer[:160]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
