"""Benchmark: the worker's own line rate against an engine that answers at once
(`make bench-worker-ceiling`; docs/benchmarks.md, "Worker ceiling"). CPU time, not wall time.

    .venv/bin/python -m tests.bench.bench_worker_ceiling [--lines 5000] [--rounds 3]
        [--kinds embeddings,chat] [--modes inproc,http,moto] [--profile KIND:MODE]

The real worker (``gpu_worker.loop.Worker``, as ``python -m gpu_worker`` builds it: its
``ChunkRunner``, smart order, checkpoints every 25 lines, the store threads) drains one
in-progress batch of ``--lines`` short lines (100-line chunks) in three modes:

- ``inproc``: the stores are the in-memory fakes (tests/fakes/aws.py) and the engine is an
  object in the process answering a prebuilt vLLM-shaped reply: our code alone (line parsing and
  checks, the admission, the gate, result lines, checkpoints, parts, counting, asyncio tasks);
- ``http``: the same fakes, the real engine client (``gpu_worker/engine_client.py``, aiohttp) over
  loopback HTTP to ``tests/bench/instant_engine.py``, a raw-asyncio HTTP/1.1 server in a process
  of its own: our code plus the HTTP client (JSON encode/decode included);
- ``moto``: the real store adapters (``functions/core/aws``, boto3) against a moto server in a
  process of its own (tests/bench/moto.py), the engine as in ``http``: everything the worker does.

What is measured is CPU seconds of the worker's process, by thread, from ``/proc/self/task``
(user + system; the event loop's thread, the store threads, the SQS threads), from the worker's
start to its last chunk counted; the engine stand-in's and moto's processes are read from
``/proc/<pid>/stat`` apart. Split per line: "our code" = the loop thread's CPU in ``inproc``
(plus its store thread: the fakes); "HTTP client" = the loop thread's CPU in ``http`` minus
``inproc``'s; "store calls" = the store and SQS threads in ``moto`` (boto3 signing, serializing,
parsing, its HTTP) plus what the loop thread spent more than in ``http``. Rounds interleave the
modes; the table takes each figure's median.

``--profile KIND:MODE`` runs that case once under cProfile (the event loop's thread) and prints
the top functions by own time and the own time by package (cProfile slows the code it measures:
read it for shares and hot spots, not for absolute figures).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import cProfile
import gc
import io
import json
import os
import pstats
import statistics
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from functions.core import schema

TENANT, BATCH = "bench", "batch_ceiling"
CHUNK_LINES = int(os.environ.get("BENCH_CHUNK_LINES", "100"))  # ingest's default chunk size
#: The worker's checkpoint_min_seconds ("" = its default; 0: a checkpoint every 25 lines however fast).
CHECKPOINT_MIN_SECONDS = os.environ.get("BENCH_CHECKPOINT_MIN_SECONDS", "")
#: The entrypoint's default ``ENGINE_MAX_NUM_SEQS``: the worker's in-flight cap is twice it.
MAX_NUM_SEQS = 256
MODELS = {"embeddings": "all-minilm-l6-v2", "chat": "smollm2-135m-instruct"}
ENDPOINTS = {"embeddings": "/v1/embeddings", "chat": "/v1/chat/completions"}
TOPICS = ("the sea", "a city at night", "an old clock", "mountains", "a library", "rain", "a train", "gardens")
#: Where the worker's logs go (powertools keeps one handler per service name: one stream for all runs).
QUIET = open(os.devnull, "w")  # noqa: SIM115 - for the process's life
NOUNS = ("river", "window", "garden", "engine", "letter", "forest", "bridge", "candle", "market", "station")


def make_input(kind: str, lines: int) -> bytes:
    """``lines`` distinct short lines: 8-word embeddings inputs, or chat lines asking 64 tokens."""
    out = io.StringIO()
    for i in range(lines):
        if kind == "embeddings":
            words = " ".join(NOUNS[(i // 10**k + k) % len(NOUNS)] for k in range(7))
            body: dict[str, Any] = {"model": MODELS[kind], "input": f"{words} {i}"}
        else:
            body = {
                "model": MODELS[kind],
                "max_tokens": 64,
                "temperature": 0,
                "messages": [{"role": "user", "content": f"Write a short poem about {TOPICS[i % 8]}, number {i}."}],
            }
        line = {"custom_id": f"req-{i}", "method": "POST", "url": ENDPOINTS[kind], "body": body}
        out.write(json.dumps(line) + "\n")
    return out.getvalue().encode()


# --- the engine: in this process, or the instant HTTP server in its own ---------------------
class InProcessInstant:
    """The ``Engine`` the worker's loop reads (cap, gauges, stats), answering every post at once
    with one prebuilt reply of the instant server's shape: no socket, no JSON."""

    base_url = "in-process"

    def __init__(self, kind: str, max_in_flight: int):
        from gpu_worker.engine_client import EngineStats
        from tests.bench import instant_engine

        sample = {"model": MODELS[kind], "input": "one two three four five six seven eight", "max_tokens": 64}
        answer = instant_engine.embeddings_answer if kind == "embeddings" else instant_engine.chat_answer
        self.answer = json.loads(answer(sample, "req"))
        self.max_in_flight, self.in_flight, self.waiting = max_in_flight, 0, 0
        self.stats = EngineStats()

    async def healthy(self) -> bool:
        return True

    async def wait_healthy(self, timeout: float, interval: float = 1.0) -> float:
        return 0.0

    async def post(self, path: str, body: dict[str, Any]) -> Any:
        from gpu_worker.engine_client import Reply

        self.stats.requests += 1
        await asyncio.sleep(0)  # one turn of the loop, as an answer that arrives
        return Reply(200, self.answer, f"req_{uuid.uuid4().hex}")

    async def post_form(self, path: str, fields: list[tuple[str, str]], files: list[tuple[str, str, bytes]]) -> Any:
        raise NotImplementedError


@contextlib.contextmanager
def instant_server() -> Iterator[tuple[str, int]]:
    process = subprocess.Popen(
        [sys.executable, "-m", "tests.bench.instant_engine", "--port", "0"], stdout=subprocess.PIPE, text=True
    )
    try:
        assert process.stdout is not None
        line = process.stdout.readline()
        if not line.startswith("PORT "):
            raise RuntimeError(f"instant engine did not start: {line!r}")
        yield f"http://127.0.0.1:{int(line.split()[1])}", process.pid
    finally:
        process.terminate()
        process.wait(10)


# --- CPU accounting -------------------------------------------------------------------------
def process_cpu(pid: int) -> float:
    """User + system CPU seconds of a process (all its threads)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def thread_cpu() -> Counter[str]:
    """CPU seconds of this process's live threads, by role (the event loop's, the store threads,
    the SQS threads, other), from ``/proc/self/task/<tid>/stat`` (clock ticks)."""
    roles = {t.native_id: _role(t.name) for t in threading.enumerate()}
    tick = os.sysconf("SC_CLK_TCK")
    out: Counter[str] = Counter()
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        out[roles.get(int(tid), "other")] += (int(fields[11]) + int(fields[12])) / tick
    return out


class GcTime:
    """Seconds spent in the garbage collector (any thread), and collections by generation."""

    def __init__(self) -> None:
        self.seconds, self.collections, self._started = 0.0, Counter[int](), 0.0
        self.by_generation: Counter[int] = Counter()

    def __call__(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._started = time.thread_time()
        else:
            spent = time.thread_time() - self._started
            self.seconds += spent
            self.collections[info["generation"]] += 1
            self.by_generation[info["generation"]] += spent

    def __enter__(self) -> GcTime:
        gc.callbacks.append(self)
        return self

    def __exit__(self, *_: object) -> None:
        gc.callbacks.remove(self)


def _role(name: str) -> str:
    if name == "MainThread":
        return "loop"
    if name.startswith("worker-stores"):
        return "stores"
    if name.startswith("worker-sqs"):
        return "sqs"
    return "other"


# --- the stores: fakes, or the AWS adapters on a moto server ----------------------------------
@dataclass
class Setup:
    stores: Any
    queue: Any
    settings: Any
    moto_pid: int | None = None


def fake_setup(kind: str) -> Setup:
    from functions.core.settings import ModelRoute, Settings
    from tests.fakes.aws import fake_stores

    url = "https://sqs.bench/queue"
    settings = Settings(
        table_name="bench",
        bucket_name="bench",
        chunk_max_lines=CHUNK_LINES,
        models={MODELS[kind]: ModelRoute(endpoints=(ENDPOINTS[kind],), queue_url=url)},
    )
    stores = fake_stores()
    return Setup(stores, stores.queues.queue(url), settings)


def moto_setup(kind: str, moto_pid: int) -> Setup:
    from functions.core import clients, deps
    from functions.core.aws import stores_from_settings
    from functions.core.aws.sqs import SqsQueue
    from functions.core.settings import ModelRoute, Settings
    from infra.local.resources import create_resources

    deps.reset()
    settings = create_resources(
        Settings(
            table_name="bench",
            bucket_name="bench",
            chunk_max_lines=CHUNK_LINES,
            models={MODELS[kind]: ModelRoute(endpoints=(ENDPOINTS[kind],))},
        ),
        clients.client,
        prefix=f"ceiling-{uuid.uuid4().hex[:8]}",
    )
    stores = stores_from_settings(settings, concurrent=True)
    url = settings.models[MODELS[kind]].queue_url
    return Setup(stores, SqsQueue(clients.client("sqs"), url), settings, moto_pid)


def enqueue(setup: Setup, kind: str, data: bytes) -> int:
    """The batch's input, its record (in progress) and one work message per 100-line chunk."""
    from tests.builders import cut, running_batch

    key = schema.batch_input_key(TENANT, BATCH)
    setup.stores.objects.put(key, data)
    lines = data.splitlines(keepends=True)
    chunks = cut(lines, CHUNK_LINES)
    batch = running_batch(
        tenant=TENANT,
        id=BATCH,
        input_file_id="file-bench",
        created_at=int(time.time()),
        total=len(lines),
        chunk_count=len(chunks),
        model=MODELS[kind],
        endpoint=ENDPOINTS[kind],
    )
    setup.stores.batches.create(batch)
    bodies = [batch.work_message(chunk).model_dump_json() for chunk in chunks]
    setup.queue.send(bodies)
    return len(chunks)


# --- one run --------------------------------------------------------------------------------
def run_worker(
    kind: str, mode: str, lines: int, engine_url: str, engine_pid: int, setup: Setup, profile: cProfile.Profile | None
) -> dict[str, Any]:
    from aws_lambda_powertools import Logger

    from gpu_worker.__main__ import freeze_startup_heap, new_event_loop
    from gpu_worker.config import WorkerConfig
    from gpu_worker.engine_client import EngineClient
    from gpu_worker.loop import Worker
    from gpu_worker.metrics import WorkerMetrics

    chunks = enqueue(setup, kind, make_input(kind, lines))
    config = WorkerConfig(
        model=MODELS[kind],
        queue_url=setup.queue.url,
        engine_url=engine_url,
        engine_max_num_seqs=MAX_NUM_SEQS,
        poll_wait_seconds=1,
        metrics_interval_seconds=3600,
        **({"checkpoint_min_seconds": float(CHECKPOINT_MIN_SECONDS)} if CHECKPOINT_MIN_SECONDS else {}),
    )

    async def go() -> dict[str, Any]:
        logger = Logger(service="bench-ceiling", level="INFO", stream=QUIET)
        metrics = WorkerMetrics(namespace="Bench", service="bench", logger=logger, model=MODELS[kind])
        client = EngineClient.from_config(config) if mode != "inproc" else None
        async with client if client is not None else contextlib.nullcontext() as engine:
            engine = engine or InProcessInstant(kind, config.in_flight_cap())
            worker = Worker(
                config,
                stores=setup.stores,
                queue=setup.queue,
                engine=engine,
                metrics=metrics,
                logger=logger,
                max_line_bytes=setup.settings.max_line_bytes,
                chunk_max_lines=setup.settings.chunk_max_lines,
            )
            freeze_startup_heap()  # as python -m gpu_worker does before it runs the worker
            before = thread_cpu(), process_cpu(engine_pid), process_cpu(setup.moto_pid) if setup.moto_pid else 0.0
            started = time.monotonic()
            if profile is not None:
                profile.enable()
            with GcTime() as collector:
                task = asyncio.create_task(worker.run())
                while metrics.totals.chunks_done < chunks and not task.done():
                    await asyncio.sleep(0.05)
            if profile is not None:
                profile.disable()
            wall = time.monotonic() - started
            after = thread_cpu(), process_cpu(engine_pid), process_cpu(setup.moto_pid) if setup.moto_pid else 0.0
            worker.stop()
            with contextlib.redirect_stdout(QUIET):  # the final EMF record
                await task
        cpu = {role: after[0][role] - before[0][role] for role in ("loop", "stores", "sqs", "other")}
        done = metrics.totals.lines_completed + metrics.totals.lines_failed
        return {
            "kind": kind,
            "mode": mode,
            "lines": done,
            "failed": metrics.totals.lines_failed,
            "chunks": metrics.totals.chunks_done,
            "wall_s": round(wall, 2),
            "cpu_s": {k: round(v, 3) for k, v in cpu.items()},
            "worker_cpu_s": round(sum(cpu.values()), 3),
            "engine_cpu_s": round(after[1] - before[1], 3) if mode != "inproc" else None,
            "moto_cpu_s": round(after[2] - before[2], 3) if setup.moto_pid else None,
            "gc_s": round(collector.seconds, 3),
            "gc_collections": dict(collector.collections),
            "gc_s_by_generation": {g: round(v, 3) for g, v in sorted(collector.by_generation.items())},
        }

    with asyncio.Runner(loop_factory=new_event_loop) as runner:  # python -m gpu_worker's loop
        return runner.run(go())


def one_run(kind: str, mode: str, lines: int, url: str, pid: int, profile: cProfile.Profile | None = None) -> dict:
    if mode != "moto":
        return run_worker(kind, mode, lines, url, pid, fake_setup(kind), profile)
    from tests.bench.moto import moto_server

    pids: list[int] = []
    with moto_server(pids):
        return run_worker(kind, mode, lines, url, pid, moto_setup(kind, pids[0]), profile)


# --- the report -----------------------------------------------------------------------------
def per_line_us(row: dict, *roles: str) -> float:
    return sum(row["cpu_s"][r] for r in roles) / row["lines"] * 1e6


def summary(rows: list[dict], kind: str) -> dict[str, float]:
    def median(mode: str, *roles: str) -> float:
        return statistics.median(per_line_us(r, *roles) for r in rows if r["kind"] == kind and r["mode"] == mode)

    everything = ("loop", "stores", "sqs", "other")
    has = {mode for r in rows if r["kind"] == kind for mode in [r["mode"]]}
    out: dict[str, float] = {"our code": median("inproc", *everything)} if "inproc" in has else {}
    if "http" in has:
        if "inproc" in has:
            out["HTTP client"] = median("http", *everything) - out["our code"]
        out["total, fakes"] = median("http", *everything)
        out["engine stand-in"] = statistics.median(
            r["engine_cpu_s"] / r["lines"] * 1e6 for r in rows if r["kind"] == kind and r["mode"] == "http"
        )
    if any(r["kind"] == kind and r["mode"] == "moto" for r in rows):
        moto_rows = [r for r in rows if r["kind"] == kind and r["mode"] == "moto"]
        if "total, fakes" in out:
            out["store calls"] = median("moto", *everything) - out["total, fakes"]
        out["of which store + SQS threads"] = median("moto", "stores", "sqs")
        out["total, moto"] = median("moto", *everything)
        out["moto server"] = statistics.median(r["moto_cpu_s"] / r["lines"] * 1e6 for r in moto_rows)
    return out


def print_table(rows: list[dict], kinds: list[str]) -> None:
    print("\nCPU µs per line of the worker's process (median over rounds); lines/s per worker CPU-second\n")
    sums = {kind: summary(rows, kind) for kind in kinds}
    names = list(dict.fromkeys(name for s in sums.values() for name in s))
    print("| per line | " + " | ".join(kinds) + " |")
    print("| --- | " + " | ".join("---:" for _ in kinds) + " |")
    for name in names:
        print(f"| {name} | " + " | ".join(f"{sums[k].get(name, float('nan')):.0f} µs" for k in kinds) + " |")
    for total in ("our code", "total, fakes", "total, moto"):  # those measured for every kind
        if all(total in sums[k] for k in kinds):
            rate = " | ".join(f"{1e6 / sums[k][total]:,.0f}" for k in kinds)
            print(f"| lines/s per core ({total}) | {rate} |")


# --- cProfile -------------------------------------------------------------------------------
PACKAGES = (
    ("gpu_worker/engine_client.py", "engine_client"),
    ("gpu_worker/", "gpu_worker"),
    ("functions/core/aws/", "store adapters"),
    ("functions/", "functions/core"),
    ("tests/", "bench and fakes"),
    ("aiohttp", "aiohttp"),
    ("yarl", "aiohttp"),
    ("multidict", "aiohttp"),
    ("botocore", "boto3"),
    ("boto3", "boto3"),
    ("urllib3", "boto3"),
    ("pydantic", "pydantic"),
    ("asyncio", "asyncio"),
    ("json", "json"),
    ("logging", "logging"),
    ("aws_lambda_powertools", "logging"),
)


def package_of(filename: str, name: str) -> str:
    for needle, package in PACKAGES:
        if needle in filename:
            return package
    if filename == "~":  # a builtin: name it
        return "builtin " + name.split(" of ")[0].strip("<>{}").replace("method ", "")
    return "other: " + os.path.basename(filename)


def print_profile(profile: cProfile.Profile, lines: int, top: int = 30) -> None:
    stats = pstats.Stats(profile)
    own: Counter[str] = Counter()
    rows = []
    for (filename, line, name), (_, calls, tottime, cumtime, _) in stats.stats.items():  # type: ignore[attr-defined]
        own[package_of(filename, name)] += tottime
        rows.append((tottime, calls, cumtime, f"{os.path.relpath(filename) if filename != '~' else ''}:{line} {name}"))
    total = sum(own.values())
    print(f"\ncProfile, event loop thread: {total:.2f} s own time ({total / lines * 1e6:.0f} µs a line)\n")
    print("| package | own time | share |\n| --- | ---: | ---: |")
    for package, seconds in own.most_common(25):
        print(f"| {package} | {seconds / lines * 1e6:.1f} µs/line | {seconds / total:.1%} |")
    print("\n| own µs/line | calls/line | cum µs/line | function |\n| ---: | ---: | ---: | --- |")
    for tottime, calls, cumtime, where in sorted(rows, reverse=True)[:top]:
        print(f"| {tottime / lines * 1e6:.1f} | {calls / lines:.2f} | {cumtime / lines * 1e6:.1f} | {where} |")


def child_run(kind: str, mode: str, lines: int, url: str, pid: int) -> dict:
    """One run in a fresh process (so no run inherits another's heap: the garbage collector's cost
    grows with it), its row read from the child's last output line."""
    command = [sys.executable, "-m", "tests.bench.bench_worker_ceiling", "--lines", str(lines)]
    command += ["--one", f"{kind}:{mode}", "--engine-url", url, "--engine-pid", str(pid)]
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"run {kind}:{mode} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--lines", type=int, default=5000)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--kinds", default="embeddings,chat")
    p.add_argument("--modes", default="inproc,http,moto")
    p.add_argument("--chunk-lines", type=int, default=CHUNK_LINES, help="lines a chunk (ingest cuts 100)")
    p.add_argument("--checkpoint-min-seconds", default=CHECKPOINT_MIN_SECONDS, help="the worker's (default: its own)")
    p.add_argument("--profile", help="KIND:MODE, e.g. embeddings:http: one run under cProfile instead")
    p.add_argument("--one", help=argparse.SUPPRESS)  # KIND:MODE, a child's one run
    p.add_argument("--engine-url", help=argparse.SUPPRESS)
    p.add_argument("--engine-pid", type=int, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.one:
        kind, mode = args.one.split(":")
        print(json.dumps(one_run(kind, mode, args.lines, args.engine_url, args.engine_pid)), flush=True)
        return
    os.environ["BENCH_CHUNK_LINES"] = str(args.chunk_lines)  # the children's chunk size
    os.environ["BENCH_CHECKPOINT_MIN_SECONDS"] = str(args.checkpoint_min_seconds)
    kinds, modes = args.kinds.split(","), args.modes.split(",")
    rows: list[dict] = []
    with instant_server() as (url, pid):
        if args.profile:
            kind, mode = args.profile.split(":")
            profile = cProfile.Profile(time.thread_time)  # CPU of the loop's thread, not wall time
            row = one_run(kind, mode, args.lines, url, pid, profile)
            print(json.dumps(row), flush=True)
            print_profile(profile, row["lines"])
            return
        for _ in range(args.rounds):
            for kind in kinds:
                for mode in modes:
                    row = child_run(kind, mode, args.lines, url, pid)
                    rows.append(row)
                    print(json.dumps(row), flush=True)
    print(
        f"\n{args.lines} lines a run ({args.chunk_lines}-line chunks), {args.rounds} rounds; worker defaults "
        f"(smart order, in-flight cap {2 * MAX_NUM_SEQS}); failed lines: {sum(r['failed'] for r in rows)}"
    )
    print_table(rows, kinds)


if __name__ == "__main__":
    main()
