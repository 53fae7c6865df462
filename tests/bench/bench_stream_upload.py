"""Benchmark: a 200 MiB batch file through ``client.files.create`` and back through
``files.content``, by the streaming front (not a test; `make bench-stream-upload`; results in
docs/benchmarks.md).

Three processes, as on the stack's way (the SDK, the streaming front's service, S3): the SDK
here, the service in a child process running the server the Fargate task runs
(``functions.stream_front.server.make_server``), and moto as a separate server (S3, DynamoDB, SQS;
its in-memory S3 holds the file, so its memory grows with it: that is the stand-in's, not ours).
Each one's peak RSS is read from ``/proc/<pid>/status`` (VmHWM).

    .venv/bin/python -m tests.bench.bench_stream_upload [--mib 200] [--purpose batch]
"""

import argparse
import hashlib
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from tests.bench.bench_lifecycle import peak_rss_mib
from tests.bench.moto import moto_server

MIB = 1024 * 1024
PREFIX = "bench"


def vm_hwm_mib(pid: int) -> float:
    for row in Path(f"/proc/{pid}/status").read_text().splitlines():
        if row.startswith("VmHWM:"):
            return int(row.split()[1]) / 1024
    raise RuntimeError(f"no VmHWM for {pid}")


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of ``pid`` so far (``/proc/<pid>/stat`` fields 14 and 15)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def service_child(port: int) -> None:
    """The streaming front's server on ``port``, as the Fargate task runs it (its relay target is
    never used here: every request of the benchmark is a streamed route)."""
    from functions.core import deps
    from functions.stream_front.routes import StreamFront
    from functions.stream_front.server import make_server

    server = make_server(StreamFront(deps.stores, deps.settings(), deps.now), "http://127.0.0.1:9", "127.0.0.1", port)
    print("ready", flush=True)
    server.serve_forever()


def write_batch_file(path: Path, size: int) -> str:
    """A JSONL batch file of ``size`` bytes (embeddings lines with distinct inputs); its sha256."""
    digest = hashlib.sha256()
    with path.open("wb") as f:
        written, i = 0, 0
        while written < size:
            line = (
                json.dumps(
                    {
                        "custom_id": f"r-{i}",
                        "method": "POST",
                        "url": "/v1/embeddings",
                        "body": {"model": "m", "input": os.urandom(600).hex()},
                    }
                ).encode()
                + b"\n"
            )
            line = line[: size - written] if written + len(line) > size else line
            f.write(line)
            digest.update(line)
            written, i = written + len(line), i + 1
    return digest.hexdigest()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--mib", type=int, default=200)
    parser.add_argument("--purpose", default="batch")
    parser.add_argument("--child-port", type=int)
    args = parser.parse_args()
    if args.child_port:
        service_child(args.child_port)
        return
    pids: list[int] = []
    with moto_server(pids) as env:
        report = bench(args, env, pids[0])
    print(json.dumps(report, indent=2))


def bench(args: argparse.Namespace, env: dict[str, str], moto_pid: int) -> dict[str, Any]:
    from openai import OpenAI

    from functions.core import auth, clients, deps
    from functions.core.settings import Settings
    from infra.local.resources import create_resources
    from tests.helpers import free_port

    settings = create_resources(Settings(table_name="bench", bucket_name="bench"), clients.client, prefix=PREFIX)
    env.update(settings.to_env())
    os.environ.update(env)
    deps.reset()
    key = auth.create_key(deps.stores().keys, "bench", now=int(time.time()))
    port = free_port()
    service = subprocess.Popen(
        [sys.executable, "-m", "tests.bench.bench_stream_upload", "--child-port", str(port)],
        env=env,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert service.stdout is not None and service.stdout.readline().strip() == "ready"
        service_idle = vm_hwm_mib(service.pid)
        client = OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key=key, max_retries=0, timeout=600)
        size = args.mib * MIB
        with tempfile.TemporaryDirectory() as tmp:
            path, back = Path(tmp) / "batch.jsonl", Path(tmp) / "back.jsonl"
            sha = write_batch_file(path, size)
            client_before = peak_rss_mib()
            cpu_before = cpu_seconds(service.pid)
            started = time.perf_counter()
            with path.open("rb") as f:
                created = client.files.create(file=f, purpose=args.purpose)  # type: ignore[arg-type]
            upload_s = time.perf_counter() - started
            upload_cpu = cpu_seconds(service.pid) - cpu_before
            client_after_upload = peak_rss_mib()
            service_after_upload = vm_hwm_mib(service.pid)
            assert created.bytes == size, created
            started = time.perf_counter()
            digest = hashlib.sha256()
            with client.files.with_streaming_response.content(created.id) as response, back.open("wb") as out:
                assert not response.http_response.history  # bytes, not a redirect
                for chunk in response.iter_bytes(1024 * 1024):
                    digest.update(chunk)
                    out.write(chunk)
            download_s = time.perf_counter() - started
            download_cpu = cpu_seconds(service.pid) - cpu_before - upload_cpu
            assert digest.hexdigest() == sha, "the content is not the file uploaded"
        return {
            "file_mib": args.mib,
            "purpose": args.purpose,
            "files_create_s": round(upload_s, 1),
            "files_create_mib_s": round(args.mib / upload_s, 1),
            "content_s": round(download_s, 1),
            "content_mib_s": round(args.mib / download_s, 1),
            "service_cpu_s_upload": round(upload_cpu, 2),
            "service_cpu_s_download": round(download_cpu, 2),
            "service_peak_rss_mib_idle": round(service_idle),
            "service_peak_rss_mib_after_upload": round(service_after_upload),
            "service_peak_rss_mib_after_download": round(vm_hwm_mib(service.pid)),
            "sdk_process_peak_rss_mib_before": round(client_before),
            "sdk_process_peak_rss_mib_after_upload": round(client_after_upload),
            "sdk_process_peak_rss_mib_after_download": round(peak_rss_mib()),
            "moto_peak_rss_mib": round(vm_hwm_mib(moto_pid)),
        }
    finally:
        service.terminate()
        service.wait()


if __name__ == "__main__":
    main()
