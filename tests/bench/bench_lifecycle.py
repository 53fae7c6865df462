"""Benchmark: ingest and finalize of a large batch (not a test; run with `make bench`).

moto runs as a separate server process so that its in-memory S3 does not count against our
memory; ingest and finalize each run in a fresh child process whose peak RSS (ru_maxrss) and wall
time are measured. The chunks in between are run by the worker's accounting path with an instant
fake engine (the engine is benchmarked separately). Every AWS request our code makes is counted
with a botocore hook, per phase, and divided by the number of input lines.

    .venv/bin/python -m tests.bench.bench_lifecycle [--lines 50000] [--line-bytes 4000]
"""

import argparse
import collections
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from tests.bench.moto import moto_server

PREFIX = "bench"


def settings_for(args: argparse.Namespace):
    from functions.core.settings import ModelRoute, Settings

    return Settings(
        table_name="bench",
        bucket_name="bench",
        models={"bench-chat": ModelRoute(endpoints=("/v1/chat/completions",))},
        max_batch_file_bytes=1024**3,
        drain_poll_seconds=0,
    )


def count_requests() -> collections.Counter:
    """Count every AWS request made by this process's botocore clients, by service.operation."""
    import boto3
    import botocore.session

    counter: collections.Counter = collections.Counter()

    def hook(model: Any, **_: Any) -> None:
        counter[f"{model.service_model.service_name}.{model.name}"] += 1

    session = botocore.session.get_session()
    session.register("before-call", hook)
    boto3.setup_default_session(botocore_session=session)
    return counter


def peak_rss_mib() -> float:
    """This process's peak RSS. (VmHWM, not ru_maxrss: Linux carries ru_maxrss over from the
    parent across fork and exec, which would report the parent's peak.)"""
    for row in Path("/proc/self/status").read_text().splitlines():
        if row.startswith("VmHWM:"):
            return int(row.split()[1]) / 1024
    raise RuntimeError("no VmHWM in /proc/self/status")


def phase_child(phase: str, state_file: str) -> None:
    """Runs one phase in this (fresh) process and prints its measurements as JSON."""
    counter = count_requests()
    from functions.core import deps
    from functions.ingest.logic import ingest
    from functions.workflow.logic import finalize

    state = json.loads(Path(state_file).read_text())
    stores, settings = deps.stores(), deps.settings()
    started = time.perf_counter()
    if phase == "ingest":
        status = ingest(stores, settings, "bench", state["batch_id"], now=int(time.time()))
    else:
        status = finalize(stores, "bench", state["batch_id"], "complete", int(time.time()))["status"]
    wall = time.perf_counter() - started
    peak_mib = peak_rss_mib()
    print(json.dumps({"status": status, "wall_s": wall, "peak_rss_mib": peak_mib, "requests": dict(counter)}))


def run_phase(phase: str, state_file: Path, env: dict[str, str]) -> dict[str, Any]:
    out = subprocess.run(
        [sys.executable, "-m", "tests.bench.bench_lifecycle", "--child", phase, "--state", str(state_file)],
        env=env,
        capture_output=True,
        text=True,
    )
    if out.returncode:
        raise RuntimeError(f"{phase} failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def make_input(lines: int, line_bytes: int) -> bytes:
    rows = []
    for i in range(lines):
        row = {
            "custom_id": f"req-{i}",
            "method": "POST",
            "url": "/v1/chat/completions",
            "body": {"model": "bench-chat", "messages": [{"role": "user", "content": ""}], "max_tokens": 16},
        }
        pad = line_bytes - len(json.dumps(row))
        row["body"]["messages"][0]["content"] = "x" * max(0, pad)
        rows.append(json.dumps(row))
    return ("\n".join(rows) + "\n").encode()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--lines", type=int, default=50_000)
    parser.add_argument("--line-bytes", type=int, default=4_000)
    parser.add_argument("--child")
    parser.add_argument("--state")
    args = parser.parse_args()
    if args.child:
        phase_child(args.child, args.state)
        return

    with moto_server() as env:
        counter = count_requests()
        report = bench(args, env, counter)
    print(json.dumps(report, indent=2))


def bench(args: argparse.Namespace, env: dict[str, str], counter: collections.Counter) -> dict[str, Any]:
    from functions.api.batches import create_batch
    from functions.core import clients, deps, ids, results, schema
    from functions.core.chunk_lifecycle import Usage, begin_run, record_chunk
    from functions.core.lines import iter_lines
    from functions.core.messages import ChunkManifest
    from functions.core.records import FileRecord
    from infra.local.resources import create_resources

    settings = create_resources(
        settings_for(args),
        clients.client,
        prefix=PREFIX,
        workflow_function_arn="arn:aws:lambda:us-east-1:123456789012:function:bench-workflow",
    )
    env.update(settings.to_env())
    os.environ.update(env)
    deps.reset()
    stores = deps.stores()
    data = make_input(args.lines, args.line_bytes)
    now = int(time.time())
    file_id = ids.new_id(ids.FILE)
    stores.objects.put(schema.file_key("bench", file_id), data)
    stores.files.create(
        FileRecord(
            tenant="bench",
            id=file_id,
            filename="in.jsonl",
            purpose="batch",
            bytes=len(data),
            created_at=now,
            expires_at=now + 86400,
            s3_key=schema.file_key("bench", file_id),
        )
    )
    del data
    counter.clear()
    from functions.api.protocol import CreateBatchBody

    body = CreateBatchBody(input_file_id=file_id, endpoint="/v1/chat/completions", completion_window="24h")
    batch = create_batch(stores, settings, "bench", body, now=now)
    create_requests = sum(counter.values())
    state_file = Path(f"/tmp/bench-lifecycle-{os.getpid()}.json")
    state_file.write_text(json.dumps({"batch_id": batch.id}))

    ingest = run_phase("ingest", state_file, env)
    # the chunks: the worker's path with an instant engine (marker and run record read, attempt
    # opened, ranged GET, parts, count)
    counter.clear()
    manifest = ChunkManifest.model_validate_json(stores.objects.get(schema.batch_manifest_key("bench", batch.id)))
    record = stores.batches.get("bench", batch.id)
    started = time.perf_counter()
    for c in manifest.chunks:
        message = record.work_message(c)
        _, run = stores.batches.chunk_state(message.tenant, message.batch_id, message.chunk, message.shards)
        begin_run(stores, message, "bench", max_strikes=3, max_failures=10, stored=run, read=True)
        out, usage = [], Usage()
        for line in iter_lines(
            stores.objects.iter_range(record.input_key, c.byte_start, c.byte_end),
            max_line_bytes=10**9,
            start=c.byte_start,
            first_number=c.first_line,
        ):
            if line.blank:
                continue
            custom_id = json.loads(line.text)["custom_id"]
            body = {
                "id": "x",
                "object": "chat.completion",
                "choices": [
                    {"index": 0, "message": {"role": "assistant", "content": "ok " * 40}, "finish_reason": "stop"}
                ],
                "usage": {"prompt_tokens": 900, "completion_tokens": 16, "total_tokens": 916},
            }
            usage.add_response(body["usage"])
            out.append(results.response_line(custom_id, 200, body, "r"))
        parts = results.write_parts(stores.objects, message, out)
        record_chunk(stores, message, parts=parts, usage=usage, now=int(time.time()))
    chunks_wall = time.perf_counter() - started
    chunk_requests = dict(counter)

    final = run_phase("finalize", state_file, env)
    done = stores.batches.get("bench", batch.id)
    state_file.unlink()
    total_requests = (
        create_requests
        + sum(ingest["requests"].values())
        + sum(chunk_requests.values())
        + sum(final["requests"].values())
    )
    return {
        "lines": args.lines,
        "input_mib": round(args.lines * args.line_bytes / 1024**2, 1),
        "chunks": len(manifest.chunks),
        "ingest": {
            "status": ingest["status"],
            "wall_s": round(ingest["wall_s"], 2),
            "peak_rss_mib": round(ingest["peak_rss_mib"]),
        },
        "chunks_fake_engine": {"wall_s": round(chunks_wall, 2)},
        "finalize": {
            "status": final["status"],
            "wall_s": round(final["wall_s"], 2),
            "peak_rss_mib": round(final["peak_rss_mib"]),
        },
        "final_counts": {"completed": done.completed, "failed": done.failed, "total": done.total},
        "aws_requests": {
            "create": create_requests,
            "ingest": ingest["requests"],
            "chunks": chunk_requests,
            "finalize": final["requests"],
            "total": total_requests,
            "per_input_line": round(total_requests / args.lines, 3),
        },
    }


if __name__ == "__main__":
    main()
