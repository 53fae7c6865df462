"""Benchmark: many clients at once against the local front (not a test; `make bench-front`;
results in docs/benchmarks.md, "The local front under concurrent clients").

    .venv/bin/python -m tests.bench.bench_front [--clients 64] [--requests 20]

Starts ``python -m infra.local`` without engines (the API, ingest and workflow as ``make up`` runs
them, on free ports), then ``--clients`` threads start together (a barrier), each with its own
keep-alive ``httpx.Client`` (one connection reused for all its requests, as the SDK pools them),
and make ``--requests`` requests each: a ``files.create`` of a small JSONL, then ``GET
/v1/files/{id}``, ``GET /v1/batches`` and ``GET /v1/files/{id}/content`` in turn. Counted: answers
by status, transport errors by kind (a dropped connection is ``RemoteProtocolError``, "Server
disconnected without sending a response"), connections each client opened, latency percentiles and
requests per second. Nothing is asserted.
"""

from __future__ import annotations

import argparse
import collections
import statistics
import tempfile
import threading
import time
from pathlib import Path

import httpx2 as httpx

from infra import names
from tests.e2e.conftest import start_local_deployment

JSONL = b'{"custom_id": "a", "method": "POST", "url": "/v1/chat/completions", "body": {"model": "m"}}\n'


class Tally:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.statuses: collections.Counter[int] = collections.Counter()
        self.errors: collections.Counter[str] = collections.Counter()
        self.latencies: list[float] = []
        self.connections: list[int] = []

    def answer(self, status: int, seconds: float) -> None:
        with self.lock:
            self.statuses[status] += 1
            self.latencies.append(seconds)

    def error(self, exc: Exception) -> None:
        with self.lock:
            self.errors[type(exc).__name__] += 1


def one_client(base_url: str, requests: int, barrier: threading.Barrier, tally: Tally) -> None:
    ports: set[int] = set()  # the client's local ports: one per connection it opened
    headers = {"Authorization": f"Bearer {names.LOCAL_KEY}"}
    with httpx.Client(base_url=base_url, headers=headers, timeout=60, limits=httpx.Limits(max_connections=1)) as http:
        barrier.wait()
        file_id = None
        for i in range(requests):
            step = i % 4
            started = time.perf_counter()
            try:
                if step == 0 or file_id is None:
                    response = http.post("/files", files={"file": ("in.jsonl", JSONL)}, data={"purpose": "batch"})
                    if response.status_code == 200:
                        file_id = response.json()["id"]
                elif step == 1:
                    response = http.get(f"/files/{file_id}")
                elif step == 2:
                    response = http.get("/batches", params={"limit": 5})
                else:
                    response = http.get(f"/files/{file_id}/content")
                tally.answer(response.status_code, time.perf_counter() - started)
                sock = response.extensions["network_stream"].get_extra_info("socket")
                ports.add(sock.getsockname()[1])
            except httpx.HTTPError as exc:
                tally.error(exc)
    with tally.lock:
        tally.connections.append(len(ports))


def run(base_url: str, clients: int, requests: int) -> dict:
    tally = Tally()
    barrier = threading.Barrier(clients)
    threads = [threading.Thread(target=one_client, args=(base_url, requests, barrier, tally)) for _ in range(clients)]
    started = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - started
    lat = sorted(tally.latencies)
    pct = (lambda q: lat[min(len(lat) - 1, int(q * len(lat)))] * 1000) if lat else (lambda q: float("nan"))
    return {
        "clients": clients,
        "requests": clients * requests,
        "wall_s": round(wall, 2),
        "rps": round(len(lat) / wall, 1),
        "statuses": dict(tally.statuses),
        "errors": dict(tally.errors),
        "connections_opened": sum(tally.connections),
        "p50_ms": round(pct(0.50), 1),
        "p99_ms": round(pct(0.99), 1),
        "max_ms": round(lat[-1] * 1000, 1) if lat else None,
        "mean_ms": round(statistics.fmean(lat) * 1000, 1) if lat else None,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--clients", type=int, default=64)
    parser.add_argument("--requests", type=int, default=20, help="per client")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        local = start_local_deployment(Path(tmp), engines=False)
        try:
            print(run(local.base_url, args.clients, args.requests))
        finally:
            local.stop()


if __name__ == "__main__":
    main()
