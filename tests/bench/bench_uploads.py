"""Benchmark: a 512 MiB upload through the SDK's ``client.uploads.upload_file_chunked`` (not a test;
run with `make bench-uploads`; results in docs/benchmarks.md).

moto runs as a separate server process (its in-memory S3 does not count against our memory); the
local front and the real API handler run in this process, as in the integration tests; the
assembler runs in a fresh child process (the Lambda the assembly queue feeds), whose wall time and
peak RSS are measured. Every byte each API request moves through the Lambda is counted: the API
event's body in, the response body out, and every S3 byte sent and received meanwhile (botocore
hooks on the wire). The md5 is sent with ``complete`` and checked by the assembler.

    .venv/bin/python -m tests.bench.bench_uploads [--mib 512] [--part-mib 4]
"""

import argparse
import hashlib
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from tests.bench.bench_lifecycle import peak_rss_mib
from tests.bench.moto import moto_server
from tests.wire_bytes import WireBytes

MIB = 1024 * 1024
PREFIX = "bench"


def hook_s3(meter: WireBytes) -> None:
    import boto3
    import botocore.session

    session = botocore.session.get_session()
    session.register("request-created.s3", meter.sent)
    session.register("after-call.s3", meter.received)
    boto3.setup_default_session(botocore_session=session)


def assembler_child() -> None:
    """Runs the assembler Lambda's handler on the assembly queue in this fresh process."""
    from functions.assembler import handler as assembler_handler
    from functions.core import clients, deps
    from infra.local.pollers import drain_queue

    meter = WireBytes()
    hook_s3(meter)
    started = time.perf_counter()
    handled = drain_queue(
        clients.client("sqs"), deps.settings().assembly_queue_url, assembler_handler.handler, name="assembler"
    )
    wall = time.perf_counter() - started
    print(json.dumps({"handled": handled, "wall_s": wall, "peak_rss_mib": peak_rss_mib(), **meter.outside}))


def write_file(path: Path, size: int) -> str:
    digest = hashlib.md5(usedforsecurity=False)
    with path.open("wb") as f:
        left = size
        while left:
            block = os.urandom(min(left, 8 * MIB))
            digest.update(block)
            f.write(block)
            left -= len(block)
    return digest.hexdigest()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--mib", type=int, default=512)
    parser.add_argument("--part-mib", type=int, default=4)
    parser.add_argument("--child", action="store_true")
    args = parser.parse_args()
    if args.child:
        assembler_child()
        return

    with moto_server() as env:
        report = bench(args, env)
    print(json.dumps(report, indent=2))


def bench(args: argparse.Namespace, env: dict[str, str]) -> dict[str, Any]:
    from openai import OpenAI

    meter = WireBytes()
    hook_s3(meter)
    from functions.api import handler as api_handler
    from functions.authorizer import handler as authorizer_handler
    from functions.core import auth, clients, deps, limits
    from functions.core.settings import Settings
    from infra.local.front import LocalApi, make_server
    from infra.local.resources import create_resources

    settings = create_resources(Settings(table_name="bench", bucket_name="bench"), clients.client, prefix=PREFIX)
    queue = clients.client("sqs").create_queue(
        QueueName=f"{PREFIX}-assembly", Attributes={"VisibilityTimeout": str(limits.ASSEMBLER_TIMEOUT_SECONDS)}
    )["QueueUrl"]
    settings = settings.model_copy(update={"assembly_queue_url": queue})
    env.update(settings.to_env())
    os.environ.update(env)
    deps.reset()
    key = auth.create_key(deps.stores().keys, "bench", now=int(time.time()))
    server = make_server(LocalApi(meter.wrap(api_handler.handler), authorizer_handler.handler), "127.0.0.1", 0)
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True).start()
    client = OpenAI(base_url=f"http://127.0.0.1:{server.server_address[1]}/v1", api_key=key, max_retries=0)

    size = args.mib * MIB
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "big.bin"
        md5 = write_file(path, size)
        started = time.perf_counter()
        upload = client.uploads.upload_file_chunked(
            file=path,
            mime_type="application/octet-stream",
            purpose="user_data",
            part_size=args.part_mib * MIB,
            md5=md5,
        )
        sdk_wall = time.perf_counter() - started
    server.shutdown()
    assert upload.status == "completed" and upload.file is not None and upload.file.status == "uploaded", upload
    api_peak = peak_rss_mib()

    out = subprocess.run(
        [sys.executable, "-m", "tests.bench.bench_uploads", "--child"], env=env, capture_output=True, text=True
    )
    if out.returncode:
        raise RuntimeError(f"assembler failed:\n{out.stderr[-3000:]}")
    assembler = json.loads(out.stdout.strip().splitlines()[-1])
    record = deps.stores().files.get("bench", upload.file.id, now=int(time.time()))
    assert record is not None and record.status == "processed", record  # the assembler checked the md5
    assert deps.stores().objects.size(record.s3_key) == size

    parts = [r for r in meter.requests if r.name.endswith("/parts")]
    complete = [r for r in meter.requests if r.name.endswith("/complete")][-1]
    return {
        "file_mib": args.mib,
        "part_mib": args.part_mib,
        "api_requests": len(meter.requests),
        "parts": len(parts),
        "sdk_upload_file_chunked_s": round(sdk_wall, 1),
        "sdk_throughput_mib_s": round(args.mib / sdk_wall, 1),
        "max_bytes_one_request": max(r.total for r in meter.requests),
        "max_part_request_s": round(max(r.seconds for r in parts), 3),
        "complete_bytes": complete.total,
        "complete_s": round(complete.seconds, 3),
        "api_process_peak_rss_mib": round(api_peak),
        "assembler_s": round(assembler["wall_s"], 1),
        "assembler_throughput_mib_s": round(args.mib / assembler["wall_s"], 1),
        "assembler_peak_rss_mib": round(assembler["peak_rss_mib"]),
        "assembler_s3_in_mib": round(assembler["s3_in"] / MIB, 1),
        "assembler_s3_out_mib": round(assembler["s3_out"] / MIB, 1),
        "file_status": record.status,
    }


if __name__ == "__main__":
    main()
