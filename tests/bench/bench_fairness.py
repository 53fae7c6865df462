"""Fair share across tenants (docs/governance.md, "Fair share") under the local deployment with its engine.

    .venv/bin/python -m tests.bench.bench_fairness [--a-lines 700] [--b-lines 10] [--max-tokens 32] [--b-after 3]

Tenant A submits a large batch; ``--b-after`` seconds later tenant B submits a small one. B's time
from create to completed (and to its first line in the engine, from the worker's ``chunk done``
log) is measured three ways: B alone; B behind A with the local SQS fair-queue emulation on
(infra/local/fair_queues.py, as AWS fair queues with ``MessageGroupId`` = tenant); and B behind A
with it off (``BATCHAPI_LOCAL_FAIR_QUEUES=0``: moto's arrival order). A is cancelled once B is done.
Each setting gets a fresh deployment and one warm-up batch. Numbers go to docs/benchmarks.md, "Fair
share". Nothing is asserted.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from infra import names
from tests.bench.local_batches import ENDED, chunk_logs, submit_chat
from tests.e2e import conftest as e2e


def wait(sdk, batch_id: str, poll: float = 0.1):
    while (batch := sdk.batches.retrieve(batch_id)).status not in ENDED:
        time.sleep(poll)
    return batch, time.time()


def first_sent(worker_log: Path, batch_id: str) -> float | None:
    sent = [log["first_sent_at"] for log in chunk_logs(worker_log, batch_id) if log.get("first_sent_at") is not None]
    return min(sent) if sent else None


def scenario(local, *, with_a: bool, args) -> dict[str, float]:
    sdk_a, sdk_b = local.client(local.new_key("tenant-a")), local.client(local.new_key("tenant-b"))
    worker_log = local.state_dir / "logs" / f"worker-{names.LOCAL_CHAT_MODEL}.log"
    a = None
    if with_a:
        a, _ = submit_chat(sdk_a, lines=args.a_lines, max_tokens=args.max_tokens, tag="a")
        time.sleep(args.b_after)
    b, created = submit_chat(sdk_b, lines=args.b_lines, max_tokens=args.max_tokens, tag="b")
    done, ended = wait(sdk_b, b.id)
    row = {"b_total": ended - created, "b_first_line": (first_sent(worker_log, b.id) or float("nan")) - created}
    if a is not None:
        a_now = sdk_a.batches.retrieve(a.id)
        row["a_done_when_b_done"] = (
            a_now.request_counts.completed + a_now.request_counts.failed if a_now.request_counts else 0
        )
        sdk_a.batches.cancel(a.id)
        wait(sdk_a, a.id)
    if done.status != "completed":
        raise RuntimeError(f"B ended {done.status}: {done.errors}")
    return row


def deployment(directory: Path, *, fair: bool):
    original = e2e.clean_env
    e2e.clean_env = lambda **extra: original(**extra, BATCHAPI_LOCAL_FAIR_QUEUES="1" if fair else "0")
    try:
        return e2e.start_local_deployment(directory, engines=True, speech=False)
    finally:
        e2e.clean_env = original


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--a-lines", type=int, default=700)
    parser.add_argument("--b-lines", type=int, default=10)
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--b-after", type=float, default=3.0)
    args = parser.parse_args()
    rows: list[tuple[str, dict[str, float]]] = []
    for fair, runs in ((True, (False, True)), (False, (True,))):
        with tempfile.TemporaryDirectory(prefix="bench-fairness-") as tmp:
            local = deployment(Path(tmp), fair=fair)
            try:
                submit_warm, _ = submit_chat(local.client(), lines=2, max_tokens=4, tag="warm")
                wait(local.client(), submit_warm.id)
                for with_a in runs:
                    label = ("B behind A, fair queues " + ("on" if fair else "off")) if with_a else "B alone"
                    rows.append((label, scenario(local, with_a=with_a, args=args)))
                    print(label, rows[-1][1], flush=True)
            finally:
                local.stop()
    print(
        f"A: {args.a_lines} lines, B: {args.b_lines} lines {args.b_after} s later, max_tokens {args.max_tokens} (ignore_eos)"
    )
    print("| run | B create -> first line in engine | B create -> completed | A lines done when B completed |")
    print("| --- | ---: | ---: | ---: |")
    for label, row in rows:
        a_done = row.get("a_done_when_b_done")
        print(
            f"| {label} | {row['b_first_line']:.2f} s | {row['b_total']:.2f} s | {'-' if a_done is None else int(a_done)} |"
        )


if __name__ == "__main__":
    main()
