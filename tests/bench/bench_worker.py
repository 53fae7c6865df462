"""Benchmark: the same 200-line chat file through `vllm run-batch` and through our worker, same
model and engine flags, in one run (`make bench-worker`).

    .venv/bin/python -m tests.bench.bench_worker [--lines 200] [--max-tokens 64] [--rounds 2]

Engine flags (both sides): the SmolLM2 folder from `make engine`, --enforce-eager, bf16,
serve.sh's --dtype and KV cache (bf16 and 1G, or float32 and 2G on a CPU without
native bf16: gpu_worker/engine/cpu_dtype.sh), --max-model-len 2048, --max-num-seqs 128, and serve.sh's environment.
Every request asks for exactly --max-tokens output tokens (`ignore_eos`), so both sides do the same
work. Output tokens/s is the sum of `usage.completion_tokens` over the generation window:

- run-batch: from its "Reading batch" log line (engine loaded) to its output file appearing
  (run-batch builds its own in-process engine: it cannot use a running server).
- our worker, on one warm `vllm serve` started by gpu_worker/engine/serve.sh with the same flags:
  * `sqs`: the real worker loop (`gpu_worker.loop.Worker`) on moto: 2 chunks of 100 lines, the
    ranged GETs, part writes and chunk accounting included; from start to the last chunk counted;
  * `offline`: `batchctl run-batch`'s code path (gpu_worker.offline.run_file) on the same file;
  * `raw client`: all lines posted at once with a bare aiohttp client and no result handling, the
    ceiling of any HTTP client of that server on this machine.
"""

from __future__ import annotations

import argparse
import asyncio
import io
import json
import os
import statistics
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import aiohttp

from tests.builders import cut, running_batch
from tests.integration.worker import engines

MAX_NUM_SEQS = 128
MAX_MODEL_LEN = 2048
#: serve.sh's environment, for run-batch (serve.sh sets it for the server).
ENGINE_ENV = {
    "VLLM_TARGET_DEVICE": "cpu",
    "VLLM_CPU_NUM_OF_RESERVED_CPU": "0",
    "VLLM_HOST_IP": "127.0.0.1",
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "VLLM_NO_USAGE_STATS": "1",
    "DO_NOT_TRACK": "1",
    "TOKENIZERS_PARALLELISM": "false",
}


TOPICS = ["the sea", "a city at night", "an old clock", "mountains", "a library", "rain", "a train", "gardens"]


def chat_body(i: int, max_tokens: int) -> dict:
    """Line ``i``'s request body: exactly ``max_tokens`` output tokens (``ignore_eos``)."""
    return {
        "model": engines.CHAT_MODEL,
        "max_tokens": max_tokens,
        "temperature": 0,
        "ignore_eos": True,
        "messages": [{"role": "user", "content": f"Write a short poem about {TOPICS[i % len(TOPICS)]}, number {i}."}],
    }


def make_input(path: Path, lines: int, max_tokens: int) -> None:
    with open(path, "w") as f:
        for i in range(lines):
            body = chat_body(i, max_tokens)
            f.write(
                json.dumps({"custom_id": f"req-{i}", "method": "POST", "url": "/v1/chat/completions", "body": body})
                + "\n"
            )


def answered_usage(lines: list[dict]) -> Iterator[dict]:
    """The ``usage`` of each line of an output file the engine answered 200."""
    return (l["response"]["body"]["usage"] for l in lines if l.get("response") and l["response"]["status_code"] == 200)


def output_tokens(lines: list[dict]) -> int:
    return sum(usage["completion_tokens"] for usage in answered_usage(lines))


def cached_tokens(lines: list[dict]) -> int:
    """Prompt tokens the engine took from its prefix cache, summed over the answered lines
    (``usage.prompt_tokens_details.cached_tokens``, reported with --enable-prompt-tokens-details)."""
    return sum((usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0 for usage in answered_usage(lines))


# --- vllm run-batch --------------------------------------------------------------------------
def run_batch_command(input_path: Path, output_path: Path) -> list[str]:
    return [
        str(engines.ENGINE_VENV / "bin" / "vllm"),
        "run-batch",
        "-i",
        str(input_path),
        "-o",
        str(output_path),
        "--model",
        str(engines.MODELS_DIR / engines.CHAT_MODEL),
        "--served-model-name",
        engines.CHAT_MODEL,
        "--runner",
        "generate",
        "--enforce-eager",
        "--enable-prefix-caching",
        "--gpu-memory-utilization",
        "0.5",
        "--max-model-len",
        str(MAX_MODEL_LEN),
        "--max-num-seqs",
        str(MAX_NUM_SEQS),
        "--scheduling-policy",  # serve.sh's, so both sides run the same scheduler
        "priority",
        "--enable-prompt-tokens-details",  # the GPU entrypoint's: cached_tokens in usage
        *engines.chat_engine_args(),
    ]


#: How often ``timed_run_batch`` looks for run-batch's output file (it appears whole at the end):
#: its time is known to within this. At 0.01 s the look cost run-batch ~4.5 CPU-s of a 115-s run
#: on the engine's 2 cores (bench-pipeline's CPU table), against ~1.6 s for the pipeline's proxy.
RUN_BATCH_POLL_SECONDS = 0.05


def timed_run_batch(command: list[str], output_path: Path) -> dict:
    """Run a ``vllm run-batch`` command (``ENGINE_ENV`` added) to its end: its engine's startup
    (start to its "Reading batch from" line) and its run (that line to ``output_path``'s
    appearance), and the peak RSS of its main process sampled as it runs."""
    started = time.monotonic()
    reading_at: list[float] = []
    log_lines: list[str] = []
    peak = 0.0
    process = subprocess.Popen(
        command,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        env={**os.environ, **ENGINE_ENV},
        text=True,
        errors="replace",
    )

    def pump() -> None:
        assert process.stdout is not None
        for text in process.stdout:
            log_lines.append(text)
            if not reading_at and "Reading batch from" in text:
                reading_at.append(time.monotonic())

    reader = threading.Thread(target=pump, daemon=True)
    reader.start()
    done_at, polls = None, 0
    while process.poll() is None:
        # The output file's arrival to RUN_BATCH_POLL_SECONDS, the RSS every 10th look: this loop runs
        # beside run-batch's engine on its cores, so it wakes as seldom as the timing allows.
        if polls % 10 == 0:
            peak = max(peak, rss_mib(process.pid))
        polls += 1
        if done_at is None and output_path.exists():
            done_at = time.monotonic()
        time.sleep(RUN_BATCH_POLL_SECONDS)
    reader.join(5)
    if done_at is None and output_path.exists():
        done_at = time.monotonic()
    if process.returncode != 0 or not reading_at or done_at is None:
        raise RuntimeError(f"vllm run-batch failed ({process.returncode}):\n" + "".join(log_lines[-40:]))
    return {
        "seconds": done_at - reading_at[0],
        "startup_seconds": reading_at[0] - started,
        "window": (reading_at[0], done_at),
        "peak_rss_mib": peak,
    }


def rss_mib(pid: int) -> float:
    """``pid``'s resident memory now (0 once it is gone)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def bench_run_batch(input_path: Path, workdir: Path) -> dict:
    output_path = workdir / f"run-batch-{time.monotonic_ns()}.jsonl"
    run = timed_run_batch(run_batch_command(input_path, output_path), output_path)
    results = [json.loads(l) for l in output_path.read_text().splitlines()]
    tokens = output_tokens(results)
    return {
        "system": "vllm run-batch",
        "seconds": run["seconds"],
        "output_tokens": tokens,
        "cached_tokens": cached_tokens(results),
        "tok_s": tokens / run["seconds"],
        "failed": sum(1 for r in results if not r.get("response") or r["response"]["status_code"] != 200),
        "startup_seconds": run["startup_seconds"],
        "window": run["window"],
    }


# --- our worker, on a warm vllm serve -----------------------------------------------------------
def bench_offline(url: str, input_path: Path) -> dict:
    from gpu_worker.config import WorkerConfig
    from gpu_worker.engine_client import EngineClient
    from gpu_worker.offline import run_file

    async def go():
        config = WorkerConfig(engine_url=url, engine_max_num_seqs=MAX_NUM_SEQS)
        async with EngineClient.from_config(config) as engine:
            out = io.BytesIO()
            with open(input_path, "rb") as source:
                summary = await run_file(engine, source, out)
            return summary

    summary = asyncio.run(go())
    return {
        "system": "our worker, offline (batchctl run-batch path)",
        "seconds": summary.seconds,
        "output_tokens": summary.usage.output_tokens,
        "tok_s": summary.output_tokens_per_second,
        "failed": summary.failed,
    }


def bench_raw(url: str, input_path: Path) -> dict:
    bodies = [json.loads(l)["body"] for l in input_path.read_text().splitlines()]

    async def go():
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:

            async def one(body):
                async with session.post(f"{url}/v1/chat/completions", json=body) as resp:
                    return (await resp.json())["usage"]["completion_tokens"]

            start = time.monotonic()
            tokens = await asyncio.gather(*(one(b) for b in bodies))
            return sum(tokens), time.monotonic() - start

    tokens, seconds = asyncio.run(go())
    return {
        "system": "raw aiohttp client, all at once (ceiling)",
        "seconds": seconds,
        "output_tokens": tokens,
        "tok_s": tokens / seconds,
        "failed": 0,
    }


def bench_sqs(url: str, input_path: Path, before_run: Callable[[], None] = lambda: None) -> dict:
    """The real worker loop on moto: an in_progress batch of 100-line chunks, its work messages
    queued. ``before_run`` is called just before the worker starts (after the setup's AWS calls)."""
    from moto import mock_aws

    from functions.core import clients, deps, schema
    from functions.core.aws import stores_from_settings
    from functions.core.aws.sqs import SqsQueue
    from functions.core.messages import WorkMessage
    from functions.core.settings import ModelRoute, Settings
    from gpu_worker.engine_client import EngineClient
    from gpu_worker.loop import Worker
    from gpu_worker.metrics import WorkerMetrics, make_logger
    from infra.local.resources import create_resources
    from tests.integration.worker.harness import worker_config

    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        os.environ.setdefault(name, "bench")
    os.environ.setdefault("AWS_DEFAULT_REGION", "us-east-1")
    data = input_path.read_bytes()
    with mock_aws():
        deps.reset()
        settings = create_resources(
            Settings(
                table_name="bench",
                bucket_name="bench",
                models={engines.CHAT_MODEL: ModelRoute(endpoints=("/v1/chat/completions",))},
            ),
            clients.client,
            prefix="bench",
        )
        stores = stores_from_settings(settings)
        key = schema.batch_input_key("bench", "batch_bench")
        stores.objects.put(key, data)
        lines = data.splitlines(keepends=True)
        chunks = cut(lines, 100)
        batch = running_batch(
            tenant="bench",
            id="batch_bench",
            input_file_id="file-bench",
            created_at=int(time.time()),
            total=len(lines),
            chunk_count=len(chunks),
            model=engines.CHAT_MODEL,
        )
        stores.batches.create(batch)
        queue_url = settings.models[engines.CHAT_MODEL].queue_url
        for chunk in chunks:
            message = batch.work_message(chunk)
            clients.client("sqs").send_message(QueueUrl=queue_url, MessageBody=message.model_dump_json())
        config = worker_config(
            settings, url, model=engines.CHAT_MODEL, max_in_flight=0, engine_max_num_seqs=MAX_NUM_SEQS
        )

        async def go():
            logger = make_logger("bench-worker")
            logger.setLevel("WARNING")
            metrics = WorkerMetrics(namespace="Bench", service="bench", logger=logger, model=engines.CHAT_MODEL)
            async with EngineClient.from_config(config) as engine:
                worker = Worker(
                    config,
                    stores=stores,
                    queue=SqsQueue(clients.client("sqs"), queue_url),
                    engine=engine,
                    metrics=metrics,
                    logger=logger,
                    max_line_bytes=settings.max_line_bytes,
                    chunk_max_lines=settings.chunk_max_lines,
                )
                before_run()
                start = time.monotonic()
                task = asyncio.create_task(worker.run())
                while metrics.totals.chunks_done < len(chunks):
                    await asyncio.sleep(0.01)
                seconds = time.monotonic() - start
                worker.stop()
                await task
                return seconds, metrics.totals

        seconds, _totals = asyncio.run(go())
        batch = stores.batches.get("bench", "batch_bench")
        deps.reset()
    return {
        "system": "our worker, SQS loop on moto (2 chunks)",
        "seconds": seconds,
        "output_tokens": batch.output_tokens,
        "tok_s": batch.output_tokens / seconds,
        "failed": batch.failed,
    }


def warm_up(url: str) -> None:
    async def go():
        async with aiohttp.ClientSession() as session:
            body = {"model": engines.CHAT_MODEL, "max_tokens": 16, "messages": [{"role": "user", "content": "Hello"}]}
            await asyncio.gather(*(session.post(f"{url}/v1/chat/completions", json=body) for _ in range(8)))

    asyncio.run(go())


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--lines", type=int, default=200)
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--rounds", type=int, default=2)
    args = p.parse_args()
    if reason := engines.missing():
        raise SystemExit(reason)
    workdir = Path(tempfile.mkdtemp(prefix="bench-worker-"))
    input_path = workdir / "in.jsonl"
    make_input(input_path, args.lines, args.max_tokens)
    server = engines.start(engines.CHAT_MODEL, workdir, "--max-num-seqs", str(MAX_NUM_SEQS))
    rows: list[dict] = []
    try:
        engines.wait_ready([server])
        warm_up(server.url)
        for r in range(args.rounds):
            for bench in (
                lambda: bench_run_batch(input_path, workdir),
                lambda: bench_sqs(server.url, input_path),
                lambda: bench_offline(server.url, input_path),
                lambda: bench_raw(server.url, input_path),
            ):
                row = {"round": r + 1, **bench()}
                rows.append(row)
                print(json.dumps(row), flush=True)
    finally:
        server.stop()
    systems = list(dict.fromkeys(row["system"] for row in rows))
    best = {s: max(row["tok_s"] for row in rows if row["system"] == s) for s in systems}
    median = {s: statistics.median(row["tok_s"] for row in rows if row["system"] == s) for s in systems}
    base = median["vllm run-batch"]
    print(
        f"\n{args.lines} chat lines x {args.max_tokens} output tokens (ignore_eos), {args.rounds} rounds, "
        f"max-num-seqs {MAX_NUM_SEQS}, SmolLM2-135M bf16 on this CPU\n"
    )
    print("| system | output tok/s (median) | best | ratio to run-batch (median) | seconds (median) |")
    print("| --- | ---: | ---: | ---: | ---: |")
    for s in systems:
        secs = statistics.median(row["seconds"] for row in rows if row["system"] == s)
        print(f"| {s} | {median[s]:.0f} | {best[s]:.0f} | {median[s] / base:.2f} | {secs:.1f} |")
    startup = [row["startup_seconds"] for row in rows if "startup_seconds" in row]
    print(f"\nrun-batch engine startup (excluded above): {statistics.median(startup):.1f} s per run")
    failed = sum(row["failed"] for row in rows)
    print(f"failed lines across all runs: {failed}")


if __name__ == "__main__":
    main()
