"""Another tenant's small batch beside a 1 MiB adversarial line on a scanned tenant, under the local
deployment with its real engine (docs/benchmarks.md, "Policy checks").

    .venv/bin/python -m tests.bench.bench_hostile_scan [--rounds 3] [--b-lines 3] [--max-tokens 16]

One deployment (`make up` as tests/e2e starts it: heartbeats every 5 s), one warm-up batch. Each
round times tenant B's ``--b-lines``-line batch from create to completed three ways: alone; right
after tenant A (policy ``--prompt-secrets refuse``) submitted one line of about 1 MiB of ``//``
ending in an AWS key (refused by the scan, never sent to the engine: the scan's share alone); and
right after A submitted the same line without the key (it passes the scan, and vLLM tokenizes and
refuses it as over its context: the scan and the engine's share). For each it records B's chunks'
receive counts (1: never redelivered) and A's line's outcome, and prints the load average at the
start and end: the machine is shared, so the ratios mean most when it is quiet. Nothing is asserted.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

from batchctl import cli
from infra import names
from tests.bench.local_batches import CHAT, ENDED, chunk_logs, submit_chat
from tests.e2e import conftest as e2e
from tests.unit.test_guard import SECRETS

#: About 1 MiB of JSON: the default line limit is 1 MiB.
LONG = 1_000_000


def wait(sdk, batch_id: str, poll: float = 0.05):
    while (batch := sdk.batches.retrieve(batch_id)).status not in ENDED:
        time.sleep(poll)
    return batch, time.time()


def submit_hostile(sdk, *, key: bool):
    content = "//" * (LONG // 2) + (f" {SECRETS['AWS access key id'][1]}" if key else "")
    row = {
        "custom_id": "hostile",
        "method": "POST",
        "url": CHAT,
        "body": {"model": names.LOCAL_CHAT_MODEL, "max_tokens": 8, "messages": [{"role": "user", "content": content}]},
    }
    file_id = sdk.files.create(file=("input.jsonl", io.BytesIO((json.dumps(row) + "\n").encode())), purpose="batch").id
    return sdk.batches.create(input_file_id=file_id, endpoint=CHAT, completion_window="24h")


def outcome(sdk, batch) -> str:
    for file_id in (batch.error_file_id, batch.output_file_id):
        if file_id:
            line = json.loads(sdk.files.content(file_id).content.splitlines()[0])
            return line["error"]["code"] if line.get("error") else f"HTTP {line['response']['status_code']}"
    return batch.status


def run_b(local, sdk_b, worker_log: Path, args, tag: str) -> tuple[float, list[int]]:
    b, created = submit_chat(sdk_b, lines=args.b_lines, max_tokens=args.max_tokens, tag=tag)
    done, ended = wait(sdk_b, b.id)
    if done.status != "completed":
        raise RuntimeError(f"B ended {done.status}: {done.errors}")
    return ended - created, [log["receive_count"] for log in chunk_logs(worker_log, b.id)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--b-lines", type=int, default=3)
    parser.add_argument("--max-tokens", type=int, default=16)
    args = parser.parse_args()
    load_start = os.getloadavg()
    results: dict[str, list[float]] = {"alone": [], "beside, refused by the scan": [], "beside, sent to the engine": []}
    receives: dict[str, list[int]] = {k: [] for k in results}
    outcomes: dict[str, list[str]] = {k: [] for k in results}
    with tempfile.TemporaryDirectory(prefix="bench-hostile-scan-") as tmp:
        local = e2e.start_local_deployment(Path(tmp), engines=True, speech=False)
        try:
            code = cli.main(
                ["tenants", "set", "--tenant", "hostile-a", "--prompt-secrets", "refuse"],
                env=local.env,
                out=io.StringIO(),
                err=io.StringIO(),
            )
            assert code == 0
            sdk_a, sdk_b = local.client(local.new_key("hostile-a")), local.client(local.new_key("honest-b"))
            worker_log = local.state_dir / "logs" / f"worker-{names.LOCAL_CHAT_MODEL}.log"
            warm, _ = submit_chat(sdk_b, lines=2, max_tokens=4, tag="warm")
            wait(sdk_b, warm.id)
            for round_ in range(args.rounds):
                for label in results:
                    a = None if label == "alone" else submit_hostile(sdk_a, key="refused" in label)
                    seconds, counts = run_b(local, sdk_b, worker_log, args, f"b{round_}-{len(results[label])}")
                    results[label].append(seconds)
                    receives[label].extend(counts)
                    if a is not None:
                        done_a, _ = wait(sdk_a, a.id)
                        outcomes[label].append(outcome(sdk_a, done_a))
                    print(round_, label, f"{seconds:.2f} s", counts, outcomes[label][-1:] or "", flush=True)
        finally:
            local.stop()
    alone = statistics.median(results["alone"])
    print(
        f"B: {args.b_lines} lines, max_tokens {args.max_tokens} (ignore_eos); A: one line of {LONG} characters of '//'; "
        f"{args.rounds} rounds; load average at start {load_start[0]:.1f}, at end {os.getloadavg()[0]:.1f} "
        f"({os.cpu_count()} cores)"
    )
    print("| B's batch | median create -> completed | runs | x alone | B's chunks received more than once | A's line |")
    print("| --- | ---: | --- | ---: | ---: | --- |")
    for label, values in results.items():
        median = statistics.median(values)
        runs = " / ".join(f"{v:.2f}" for v in values)
        again = sum(1 for c in receives[label] if c > 1)
        print(
            f"| {label} | {median:.2f} s | {runs} | {median / alone:.2f} | {again} | {', '.join(sorted(set(outcomes[label]))) or '-'} |"
        )


if __name__ == "__main__":
    main()
