"""A large embeddings batch (OpenAI's maximum, 50,000 short lines) under the local deployment, as
`make up` runs it, against `vllm run-batch` on the same file with the same engine flags
(docs/benchmarks.md, "A 50,000-line embeddings batch").

    .venv/bin/python -m tests.bench.bench_embeddings_large [--lines 50000] [--skip-run-batch]

- pipeline: the SDK's ``files.create`` and ``batches.create``, then ``batches.retrieve`` every 2 s
  until the batch ends; timed from the create's answer to the first poll that sees ``completed``;
  the deployment's own process (moto, the front, the local Lambdas, the pollers) sampled for its
  RSS; the output read back, every custom_id checked once.
- run-batch: `vllm run-batch` with serve.sh's embeddings flags and the local deployment's
  ``--max-num-seqs``, timed from its "Reading batch from" log line to its output file (its engine's
  startup excluded, as bench_worker does).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import tempfile
import threading
import time
from pathlib import Path

from infra import names
from infra.local.processes import LOCAL_MAX_NUM_SEQS
from tests.bench import bench_worker
from tests.e2e import conftest as e2e
from tests.integration.worker import engines

MODEL = names.LOCAL_EMBED_MODEL
ENDPOINT = "/v1/embeddings"


def embeddings_body(i: int) -> dict:
    """Line ``i``'s request body: one short sentence."""
    return {"model": MODEL, "input": f"Sentence {i}: a short line about the number {i % 997}."}


def make_input(path: Path, lines: int) -> None:
    with path.open("w") as out:
        for i in range(lines):
            body = embeddings_body(i)
            out.write(json.dumps({"custom_id": f"e-{i}", "method": "POST", "url": ENDPOINT, "body": body}) + "\n")


def bench_pipeline(input_path: Path, workdir: Path, lines: int) -> dict:
    local = e2e.start_local_deployment(workdir / "local", engines=True, speech=False)
    peak = [0.0]
    stop = threading.Event()

    def sample() -> None:
        while not stop.wait(1.0):
            peak[0] = max(peak[0], bench_worker.rss_mib(local.process.pid))

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        sdk = local.client()
        file_id = sdk.files.create(file=("input.jsonl", input_path.read_bytes()), purpose="batch").id
        batch = sdk.batches.create(input_file_id=file_id, endpoint=ENDPOINT, completion_window="24h")
        created = time.monotonic()
        while batch.status not in ("completed", "failed", "expired", "cancelled"):
            time.sleep(2)
            batch = sdk.batches.retrieve(batch.id)
        seconds = time.monotonic() - created
        ids = [json.loads(row)["custom_id"] for row in sdk.files.content(batch.output_file_id).content.splitlines()]
        assert batch.status == "completed" and sorted(ids) == sorted(f"e-{i}" for i in range(lines)), batch
        return {
            "system": "pipeline",
            "seconds": seconds,
            "lines_s": lines / seconds,
            "peak_rss_mib": peak[0],
            # The batch's own timestamps (whole seconds): how long it ran, and how long its finalize.
            "in_progress_s": batch.finalizing_at - batch.in_progress_at,
            "finalizing_s": batch.completed_at - batch.finalizing_at,
        }
    finally:
        stop.set()
        local.stop()


def bench_run_batch(input_path: Path, workdir: Path, lines: int) -> dict:
    output = workdir / "run-batch.jsonl"
    dtype = subprocess.run([str(engines.CPU_DTYPE)], check=True, capture_output=True, text=True).stdout.strip()
    command = [
        str(engines.ENGINE_VENV / "bin" / "vllm"),
        "run-batch",
        "-i",
        str(input_path),
        "-o",
        str(output),
        "--model",
        str(engines.MODELS_DIR / MODEL),
        "--served-model-name",
        MODEL,
        "--runner",
        "pooling",
        "--enforce-eager",
        "--gpu-memory-utilization",
        "0.5",
        "--kv-cache-memory-bytes",
        "64M",
        "--max-model-len",
        "256",
        "--max-num-seqs",
        str(LOCAL_MAX_NUM_SEQS),
        "--scheduling-policy",  # serve.sh's, so both sides run the same scheduler
        "priority",
        *(["--dtype", dtype] if dtype else []),
    ]
    run = bench_worker.timed_run_batch(command, output)
    assert len(output.read_text().splitlines()) == lines
    return {
        "system": "vllm run-batch",
        "seconds": run["seconds"],
        "lines_s": lines / run["seconds"],
        "peak_rss_mib": run["peak_rss_mib"],
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--lines", type=int, default=50_000)
    p.add_argument("--skip-run-batch", action="store_true")
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        input_path = workdir / "input.jsonl"
        make_input(input_path, args.lines)
        rows = [bench_pipeline(input_path, workdir, args.lines)]
        if not args.skip_run_batch:
            rows.append(bench_run_batch(input_path, workdir, args.lines))
    for row in rows:
        print(json.dumps(row))
    if len(rows) == 2:
        print(f"pipeline ÷ run-batch (lines/s): {rows[0]['lines_s'] / rows[1]['lines_s']:.2f}")


if __name__ == "__main__":
    main()
