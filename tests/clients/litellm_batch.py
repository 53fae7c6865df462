"""litellm's batch functions against this Batch API, set up with only the base URL and the key
(``custom_llm_provider="openai"``, ``api_base``, ``api_key``), on an embeddings batch:

    .venv-clients/bin/python tests/clients/litellm_batch.py BASE_URL KEY MODEL DIR

``create_file``, ``create_batch``, ``retrieve_batch`` until completed, ``file_content``,
``list_batches``, ``file_list``, ``cancel_batch`` on a second batch (of its own 2,000-line file),
``file_delete``. DIR holds
``embeddings.jsonl`` (the caller wrote it). Prints one JSON summary on stdout (what each call
returned) and exits 1 on any error; tests/e2e/test_clients_e2e.py asserts on the summary. Runs in
the clients' venv (.venv-clients) with ``LITELLM_LOCAL_MODEL_COST_MAP=True`` (litellm fetches its
model cost map from the network at import otherwise; docs/clients.md)."""

import hashlib
import json
import sys
import time
from importlib.metadata import version
from pathlib import Path

import litellm

TERMINAL = ("completed", "failed", "expired", "cancelled")
WAIT_SECONDS = 240
CANCEL_LINES = 2000


def main(base_url: str, key: str, model: str, directory: str) -> dict:
    where = {"custom_llm_provider": "openai", "api_base": base_url, "api_key": key}
    data = (Path(directory) / "embeddings.jsonl").read_bytes()

    with (Path(directory) / "embeddings.jsonl").open("rb") as handle:
        created = litellm.create_file(file=handle, purpose="batch", **where)
    # The batch to cancel has lines enough (CANCEL_LINES) that it cannot end between its create and
    # the cancel, which litellm sends a second or more later on a busy machine.
    to_cancel_path = Path(directory) / "to_cancel.jsonl"
    to_cancel_path.write_text(
        "".join(
            json.dumps(
                {
                    "custom_id": f"cancel-{i}",
                    "method": "POST",
                    "url": "/v1/embeddings",
                    "body": {"model": model, "input": f"line {i} of a batch cancelled at once"},
                }
            )
            + "\n"
            for i in range(CANCEL_LINES)
        )
    )
    with to_cancel_path.open("rb") as handle:
        second = litellm.create_file(file=handle, purpose="batch", **where)

    batch = litellm.create_batch(
        completion_window="24h",
        endpoint="/v1/embeddings",
        input_file_id=created.id,
        metadata={"client": "litellm"},
        **where,
    )
    to_cancel = litellm.create_batch(
        completion_window="24h", endpoint="/v1/embeddings", input_file_id=second.id, **where
    )
    cancelled = litellm.cancel_batch(batch_id=to_cancel.id, **where)

    deadline = time.monotonic() + WAIT_SECONDS
    done = litellm.retrieve_batch(batch_id=batch.id, **where)
    while done.status not in TERMINAL:
        if time.monotonic() > deadline:
            raise TimeoutError(f"batch {batch.id} still {done.status} after {WAIT_SECONDS}s")
        time.sleep(0.25)
        done = litellm.retrieve_batch(batch_id=batch.id, **where)

    output = litellm.file_content(file_id=done.output_file_id, **where).content if done.output_file_id else b""
    results = [json.loads(row) for row in output.splitlines()]
    listed = litellm.list_batches(limit=10, **where)
    files = litellm.file_list(**where)
    deleted = litellm.file_delete(file_id=second.id, **where)
    files_after = litellm.file_list(**where)

    return {
        "litellm_version": version("litellm"),
        "uploaded_sha256": hashlib.sha256(data).hexdigest(),
        "file": {"id": created.id, "bytes": created.bytes, "purpose": created.purpose, "status": created.status},
        "batch": {
            "id": batch.id,
            "created_status": batch.status,
            "endpoint": batch.endpoint,
            "metadata": batch.metadata,
        },
        "completed": {
            "status": done.status,
            "output_file_id": done.output_file_id,
            "error_file_id": done.error_file_id,
            "request_counts": done.request_counts.model_dump() if done.request_counts else None,
        },
        "results": [
            {
                "custom_id": r["custom_id"],
                "status_code": r["response"]["status_code"],
                "dimensions": [len(d["embedding"]) for d in r["response"]["body"]["data"]],
            }
            for r in results
        ],
        "cancel": {"id": cancelled.id, "status": cancelled.status, "cancelling_at": cancelled.cancelling_at},
        "batches_listed": [b.id for b in listed.data],
        "files_listed": [f.id for f in files.data],
        "delete": {"id": deleted.id, "deleted": deleted.deleted},
        "files_after_delete": [f.id for f in files_after.data],
    }


if __name__ == "__main__":
    print(json.dumps(main(*sys.argv[1:5]), default=str))
