"""Fixed overhead of the local deployment around the engine (docs/benchmarks.md, "Fixed overhead").

    .venv/bin/python -m tests.bench.bench_overhead [--rounds 5] [--lines 1] [--max-tokens 16]

Starts ``python -m infra.local`` with its engines (as ``make up``; on free ports, its own state
directory), then submits ``--rounds`` batches of ``--lines`` chat lines one after the other through
the openai SDK and splits each batch's time, create to completed, at the points the worker logs
for each chunk (``chunk done``: ``first_sent_at``, ``last_answer_at``, ``committed_at``; one clock,
this machine's):

- **to worker**: ``batches.create`` called -> the worker received the batch's first chunk (the
  API's create, the S3 event, ingest, the work message);
- **to engine**: received -> its first line enters the engine (the chunk's store calls);
- **engine**: first line in -> last answer out (the engine's own time for the batch);
- **commit**: last answer -> its chunk's parts written and counted (the last chunk signals);
- **after**: counted -> the client sees ``completed`` (the workflow: signal, drain, finalize;
  the client polls every ``--poll`` seconds, so this includes up to one poll period).

Numbers go to docs/benchmarks.md, "Fixed overhead". Nothing is asserted.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

from infra import names
from tests.bench.local_batches import ENDED, chunk_logs, submit_chat
from tests.e2e.conftest import start_local_deployment


def one_batch(sdk, worker_log: Path, *, lines: int, max_tokens: int, poll: float, tag: str) -> dict[str, float]:
    batch, created = submit_chat(sdk, lines=lines, max_tokens=max_tokens, tag=tag)
    while batch.status not in ENDED:
        time.sleep(poll)
        batch = sdk.batches.retrieve(batch.id)
    completed = time.time()
    if batch.status != "completed":
        raise RuntimeError(f"batch {batch.id} ended {batch.status}: {batch.errors}")
    logs = chunk_logs(worker_log, batch.id)
    received = min(l["received_at"] for l in logs)
    first = min(l["first_sent_at"] for l in logs)
    last = max(l["last_answer_at"] for l in logs)
    counted = max(l["committed_at"] for l in logs)
    return {
        "to worker": received - created,
        "to engine": first - received,
        "engine": last - first,
        "commit": counted - last,
        "after": completed - counted,
        "total": completed - created,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--lines", type=int, default=1)
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--poll", type=float, default=0.05)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-overhead-") as tmp:
        local = start_local_deployment(Path(tmp), engines=True, speech=False)
        try:
            sdk = local.client()
            worker_log = local.state_dir / "logs" / f"worker-{names.LOCAL_CHAT_MODEL}.log"
            one_batch(sdk, worker_log, lines=args.lines, max_tokens=args.max_tokens, poll=args.poll, tag="warm")
            rows = [
                one_batch(sdk, worker_log, lines=args.lines, max_tokens=args.max_tokens, poll=args.poll, tag=f"r{r}")
                for r in range(args.rounds)
            ]
        finally:
            local.stop()
    keys = ["to worker", "to engine", "engine", "commit", "after", "total"]
    print(f"{args.lines}-line batches, max_tokens {args.max_tokens} (ignore_eos), client polls every {args.poll} s")
    print("| round | " + " | ".join(keys) + " |")
    print("| ---: | " + " | ".join("---:" for _ in keys) + " |")
    for i, row in enumerate(rows, 1):
        print(f"| {i} | " + " | ".join(f"{row[k]:.2f} s" for k in keys) + " |")
    print("| **median** | " + " | ".join(f"**{statistics.median(r[k] for r in rows):.2f} s**" for k in keys) + " |")


if __name__ == "__main__":
    main()
