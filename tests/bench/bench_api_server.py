"""Benchmark: what vLLM's OpenAI server costs per line beside the engine (`make bench-api-server`;
docs/benchmarks.md, "What an H100 needs beside it"). CPU time, not wall time.

    .venv/bin/python -m tests.bench.bench_api_server [--lines 2000] [--chat-lines 300]
        [--kinds embeddings,chat] [--rounds 2]

For each kind, the real engine (gpu_worker/engine/serve.sh, the local deployment's
``--max-num-seqs``) is started twice: with uvicorn's access log (vLLM's default: one log line a
request; ``--no-disable-uvicorn-access-log``) and without it (what the GPU task's entrypoint and
serve.sh run). The worker's own engine client (``gpu_worker/engine_client.py``, at the worker's
in-flight cap) sends the lines: short embeddings lines (bench_embeddings_large's), or
bench_worker's chat lines at bench_pipeline's uniform length (64 output tokens, ``ignore_eos``).
CPU seconds of vLLM's API server process (HTTP, tokenizing, the OpenAI answer) and of its engine
core are read from ``/proc`` (``cpu_sampler``) over the window from the first request to the last
answer, after a warm-up; the table takes each figure's median over ``--rounds``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import tempfile
import time
from pathlib import Path

from gpu_worker.config import IN_FLIGHT_PER_SEQ
from gpu_worker.engine_client import EngineClient
from infra.local.processes import LOCAL_MAX_NUM_SEQS
from tests.bench import bench_embeddings_large, bench_pipeline, bench_worker
from tests.bench.cpu_sampler import API_SERVER, ENGINE, CpuSampler
from tests.integration.worker import engines

ACCESS_LOG = {True: "--no-disable-uvicorn-access-log", False: "--disable-uvicorn-access-log"}
#: The worker's in-flight cap at the local ``--max-num-seqs`` (``WorkerConfig.in_flight_cap``).
IN_FLIGHT = IN_FLIGHT_PER_SEQ * LOCAL_MAX_NUM_SEQS


def embeddings_request(i: int) -> tuple[str, dict]:
    return bench_embeddings_large.ENDPOINT, bench_embeddings_large.embeddings_body(i)


def chat_request(i: int) -> tuple[str, dict]:
    return "/v1/chat/completions", bench_worker.chat_body(i, bench_pipeline.UNIFORM_TOKENS)


KINDS = {"embeddings": (engines.EMBED_MODEL, embeddings_request), "chat": (engines.CHAT_MODEL, chat_request)}


async def send(url: str, make, first: int, count: int) -> int:
    """``count`` lines through the engine client; the number answered 200."""
    async with EngineClient(url, max_in_flight=IN_FLIGHT) as client:
        replies = await asyncio.gather(*(client.post(*make(first + i)) for i in range(count)))
    return sum(1 for r in replies if r.status == 200)


def measure(kind: str, access_log: bool, lines: int, workdir: Path) -> dict:
    model, make = KINDS[kind]
    args = ["--max-num-seqs", str(LOCAL_MAX_NUM_SEQS), ACCESS_LOG[access_log]]
    if kind == "chat":
        args += engines.chat_engine_args()
    server = engines.start(model, workdir, *args)
    try:
        engines.wait_ready([server])
        asyncio.run(send(server.url, make, 10**6, 20))  # warm-up: first requests compile and allocate
        with CpuSampler(every=0.2) as sampler:
            time.sleep(0.5)
            start = time.monotonic()
            ok = asyncio.run(send(server.url, make, 0, lines))
            end = time.monotonic()
            time.sleep(0.5)
        assert ok == lines, f"{lines - ok} of {lines} lines failed"
        cpu = sampler.between(start, end)
        return {
            "kind": kind,
            "access_log": access_log,
            "lines": lines,
            "seconds": round(end - start, 2),
            "lines_s": round(lines / (end - start), 1),
            "api_server_ms": round(1000 * cpu.get(API_SERVER, 0.0) / lines, 3),
            "engine_ms": round(1000 * cpu.get(ENGINE, 0.0) / lines, 3),
        }
    finally:
        server.stop()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--lines", type=int, default=2000, help="embeddings lines a round")
    p.add_argument("--chat-lines", type=int, default=300, help="chat lines a round")
    p.add_argument("--kinds", default="embeddings,chat")
    p.add_argument("--rounds", type=int, default=2)
    args = p.parse_args()
    if reason := engines.missing():
        raise SystemExit(f"no engine: {reason}")
    rows: dict[tuple[str, bool], list[dict]] = {}
    with tempfile.TemporaryDirectory(prefix="bench-api-server-") as tmp:
        for _ in range(args.rounds):
            for kind in args.kinds.split(","):
                lines = args.chat_lines if kind == "chat" else args.lines
                for access_log in (True, False):
                    row = measure(kind, access_log, lines, Path(tmp))
                    print(json.dumps(row), flush=True)
                    rows.setdefault((kind, access_log), []).append(row)
    print(f"\nvLLM's API server and engine core, CPU ms a line (median of {args.rounds} rounds), this machine:\n")
    print("| kind | access log | lines | lines/s | API server ms/line | engine core ms/line |")
    print("| --- | --- | ---: | ---: | ---: | ---: |")
    for (kind, access_log), runs in rows.items():
        med = {k: statistics.median(r[k] for r in runs) for k in ("lines_s", "api_server_ms", "engine_ms")}
        print(
            f"| {kind} | {'on (vLLM default)' if access_log else 'off'} | {runs[0]['lines']:,} | "
            f"{med['lines_s']:.0f} | {med['api_server_ms']:.2f} | {med['engine_ms']:.2f} |"
        )


if __name__ == "__main__":
    main()
