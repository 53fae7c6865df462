"""Counts, not timings: the AWS requests the real worker loop makes per chunk (docs/benchmarks.md,
"AWS scale on paper"). The worker (``gpu_worker.loop.Worker``, as bench_worker's SQS row runs it:
moto in-process, 100-line chunks, the default checkpoints) drains a batch against an instant fake
engine (tests/fakes/engine.py); every AWS request made from the worker's start is counted with a
botocore ``before-call`` hook.

    .venv/bin/python -m tests.bench.chunk_requests [--lines 500]
"""

import argparse
import collections
import json
import tempfile
from pathlib import Path
from typing import Any

import botocore.handlers

from tests.bench import bench_worker
from tests.fakes.engine import FakeEngine


def count_requests() -> collections.Counter:
    """Count every AWS request of every botocore session created from now on (moto makes its
    own default session, so bench_lifecycle's hook on the default session would miss them)."""
    counter: collections.Counter = collections.Counter()

    def hook(model: Any, **_: Any) -> None:
        counter[f"{model.service_model.service_name}.{model.name}"] += 1

    botocore.handlers.BUILTIN_HANDLERS.append(("before-call", hook))
    return counter


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--lines", type=int, default=500)
    args = p.parse_args()
    path = Path(tempfile.mkdtemp(prefix="chunk-requests-")) / "in.jsonl"
    bench_worker.make_input(path, args.lines, 16)
    engine = FakeEngine().start()
    counter = count_requests()
    try:
        row = bench_worker.bench_sqs(engine.url, path, before_run=counter.clear)
    finally:
        engine.stop()
    chunks = -(-args.lines // 100)
    print(
        json.dumps(
            {
                "lines": args.lines,
                "chunks": chunks,
                "failed": row["failed"],
                "requests": dict(sorted(counter.items())),
                "per_chunk": round(sum(counter.values()) / chunks, 2),
            },
            indent=1,
        )
    )


if __name__ == "__main__":
    main()
