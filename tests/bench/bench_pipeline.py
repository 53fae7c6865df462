"""Benchmark: the same file end to end through the local deployment (openai SDK: files.create ->
batches.create -> poll until completed) and through `vllm run-batch`, same engine flags, one run,
interleaved rounds, three datasets (`make bench-pipeline`; docs/benchmarks.md "End to
end vs vllm run-batch").

    .venv/bin/python -m tests.bench.bench_pipeline [--lines 200] [--rounds 2] [--datasets uniform,shared-prefix,uneven]

- pipeline: the local deployment as `make up` builds it (tests/bench/pipeline_local.py: moto, the
  API front, ingest, the workflow, one chat engine and its worker), on free ports. Timed from the
  `batches.create` call to the arrival of the batch's `batch.completed` webhook at a receiver in
  this process (``--completion webhook``, the default: no polling load on the engine's cores), or
  to the first `batches.retrieve` that shows `completed`, polled every POLL_SECONDS
  (``--completion poll``). The worker reaches its
  engine through a timestamping proxy in this process (tests/bench/engine_proxy.py), which splits
  that time into (a) create -> first request at the engine, (b) engine busy (first request -> last
  answer), (c) last answer -> `completed` seen by the client.
- run-batch: `vllm run-batch` as bench_worker drives it (its engine startup excluded: from its
  "Reading batch" log line to its output file appearing).

Same engine flags on both sides: serve.sh's (--enforce-eager, bf16, --enable-prefix-caching,
--kv-cache-memory-bytes 1G, --max-model-len 2048) and --max-num-seqs bench_worker.MAX_NUM_SEQS
(the local deployment's default, passed as ENGINE_MAX_NUM_SEQS). Output tok/s = the sum of
`usage.completion_tokens` of the output file / the window; cached prompt tokens = the sum of
`usage.prompt_tokens_details.cached_tokens` (what each engine took from its prefix cache; both
run with --enable-prompt-tokens-details, as the GPU task's entrypoint starts vLLM). Datasets are
generated from SEED: uniform (every line 64 output tokens), shared-prefix (4 long system prompts,
lines shuffled, 64 tokens each), uneven (90 % of lines 8-16 tokens, 10 % 256 tokens, random
order); all `ignore_eos`, `temperature: 0`, so both systems do the same work. Worker settings come from the environment
(e.g. WORKER_ORDER=file).

Beside each row, the CPU seconds every process on the machine used during the engine's window
(tests/bench/cpu_sampler.py, from /proc): the engine itself, and what shares its 2 cores with it
(the pipeline: vLLM's API server, our worker, the local AWS, this bench's proxy; run-batch: its
in-process front end).
"""

from __future__ import annotations

import argparse
import http.server
import io
import json
import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from openai import OpenAI

from batchctl import cli
from infra import names
from infra.local import state as local_state
from tests.bench import bench_worker
from tests.bench.cpu_sampler import ENGINE, CpuSampler
from tests.bench.engine_proxy import EngineProxy
from tests.helpers import free_port
from tests.integration.worker import engines

SEED = 14
POLL_SECONDS = 0.2
DATASETS = ("uniform", "shared-prefix", "uneven")
UNIFORM_TOKENS = 64
SHARED_PROMPTS = 4
SHARED_PROMPT_WORDS = 320  # 356 tokens per line with its system prompt (SmolLM2 chat template)
UNEVEN_SHORT = (8, 16)
UNEVEN_LONG = 256
UNEVEN_LONG_SHARE = 0.10
READY_TIMEOUT = 300.0
BATCH_TIMEOUT = 1800.0
TERMINAL = {"completed", "failed", "expired", "cancelled"}

_WORDS = [
    "model",
    "batch",
    "river",
    "stone",
    "light",
    "engine",
    "garden",
    "window",
    "signal",
    "harbor",
    "paper",
    "letter",
    "winter",
    "summer",
    "market",
    "station",
    "bridge",
    "mirror",
    "forest",
    "valley",
    "number",
    "answer",
    "request",
    "result",
    "table",
    "column",
    "circle",
    "orange",
    "silver",
    "copper",
    "marble",
    "velvet",
    "thunder",
    "candle",
    "lantern",
    "compass",
    "anchor",
    "meadow",
    "canyon",
    "island",
    "desert",
    "glacier",
    "harvest",
    "journey",
    "method",
    "pattern",
    "system",
    "network",
    "memory",
    "history",
    "science",
    "theory",
]


def _line(i: int, messages: list[dict], max_tokens: int) -> str:
    body = {
        "model": engines.CHAT_MODEL,
        "max_tokens": max_tokens,
        "temperature": 0,
        "ignore_eos": True,
        "messages": messages,
    }
    return json.dumps({"custom_id": f"req-{i}", "method": "POST", "url": "/v1/chat/completions", "body": body}) + "\n"


def make_dataset(name: str, path: Path, lines: int, seed: int = SEED) -> None:
    """Write the ``name`` dataset of ``lines`` chat lines to ``path``, the same bytes for a seed."""
    rng = random.Random(f"{seed}-{name}")
    if name == "uniform":
        bench_worker.make_input(path, lines, UNIFORM_TOKENS)
        return
    if name == "shared-prefix":
        prompts = [
            f"You are assistant number {p}. Follow these house notes closely: "
            + " ".join(rng.choice(_WORDS) for _ in range(SHARED_PROMPT_WORDS))
            + "."
            for p in range(SHARED_PROMPTS)
        ]
        rows = [
            [
                {"role": "system", "content": prompts[i % SHARED_PROMPTS]},
                {"role": "user", "content": f"Question {i}: what does the word {rng.choice(_WORDS)} mean here?"},
            ]
            for i in range(lines)
        ]
        rng.shuffle(rows)
        path.write_text("".join(_line(i, m, UNIFORM_TOKENS) for i, m in enumerate(rows)))
        return
    if name == "uneven":
        long = set(rng.sample(range(lines), max(1, round(lines * UNEVEN_LONG_SHARE))))
        path.write_text(
            "".join(
                _line(
                    i,
                    [{"role": "user", "content": f"Tell a story about {rng.choice(_WORDS)}, number {i}."}],
                    UNEVEN_LONG if i in long else rng.randint(*UNEVEN_SHORT),
                )
                for i in range(lines)
            )
        )
        return
    raise ValueError(f"unknown dataset {name!r}; one of {', '.join(DATASETS)}")


# --- the local deployment -------------------------------------------------------------------------
class WebhookReceiver:
    """The batch's terminal event as a subscribed client gets it (docs/webhooks.md): an HTTP
    receiver in this process, subscribed with ``batchctl webhooks create`` for the local tenant;
    each delivery is verified with the official SDK (``client.webhooks.unwrap``) and its arrival
    time kept by batch id. So the bench learns of ``completed`` with no polling load on the 2 cores
    the engine uses (a 0.2 s poll cost the local deployment about 6 % of a core)."""

    def __init__(self) -> None:
        self.arrived: dict[str, tuple[str, float]] = {}
        self._cond = threading.Condition()
        self.secret = ""
        receiver = self

        class Handle(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # http.server's name
                body = self.rfile.read(int(self.headers["content-length"]))
                at = time.monotonic()
                headers = {k.lower(): v for k, v in self.headers.items()}
                event = OpenAI(api_key="unused", base_url="http://127.0.0.1:9").webhooks.unwrap(
                    body, headers, secret=receiver.secret
                )
                with receiver._cond:
                    receiver.arrived.setdefault(event.data.id, (event.type, at))
                    receiver._cond.notify_all()
                self.send_response(200)
                self.send_header("content-length", "0")
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        self._server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handle)
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}/hooks"

    def wait(self, batch_id: str, timeout: float) -> tuple[str, float] | None:
        with self._cond:
            self._cond.wait_for(lambda: batch_id in self.arrived, timeout)
            return self.arrived.get(batch_id)

    def close(self) -> None:
        self._server.shutdown()


@dataclass
class Pipeline:
    process: subprocess.Popen
    base_url: str
    log_path: Path
    proxy: EngineProxy
    webhooks: WebhookReceiver | None = None

    def client(self) -> OpenAI:
        return OpenAI(base_url=self.base_url, api_key=names.LOCAL_KEY, max_retries=2, timeout=120)

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()  # SIGTERM: it stops its engine and worker
            try:
                self.process.wait(90)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


def subscribe(pipeline: Pipeline, workdir: Path) -> None:
    """A webhook endpoint for the local tenant's terminal batch events, at a receiver here."""
    receiver = WebhookReceiver()
    out, err = io.StringIO(), io.StringIO()
    code = cli.main(
        ["--local", "webhooks", "create", "--tenant", names.LOCAL_TENANT, "--url", receiver.url],
        env={local_state.STATE_DIR_ENV: str(workdir / "state")},
        out=out,
        err=err,
    )
    if code != 0:
        raise RuntimeError(f"batchctl webhooks create failed: {err.getvalue()}")
    receiver.secret = json.loads(out.getvalue())["signing_secret"]
    pipeline.webhooks = receiver


def start_pipeline(workdir: Path, proxy: EngineProxy, engine_port: int) -> Pipeline:
    log_path = workdir / "pipeline-local.log"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "BATCHAPI_", "MOTO_"))}
    env.update(
        PORT="0",
        MOTO_PORT="0",
        PYTHONUNBUFFERED="1",
        ENGINE_MAX_NUM_SEQS=str(bench_worker.MAX_NUM_SEQS),
        **{local_state.STATE_DIR_ENV: str(workdir / "state")},
    )
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "tests.bench.pipeline_local",
                "--engine-port",
                str(engine_port),
                "--worker-engine-url",
                proxy.url,
            ],
            cwd=engines.REPO,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    deadline = time.monotonic() + READY_TIMEOUT
    while True:
        ready = [l for l in log_path.read_text(errors="replace").splitlines() if l.startswith("READY ")]
        if ready:
            return Pipeline(process, ready[0].removeprefix("READY "), log_path, proxy)
        if process.poll() is not None or time.monotonic() > deadline:
            process.terminate()
            raise RuntimeError(f"the local deployment did not start:\n{log_path.read_text(errors='replace')[-4000:]}")
        time.sleep(0.5)


def bench_pipeline(pipeline: Pipeline, input_path: Path) -> dict:
    client = pipeline.client()
    with input_path.open("rb") as f:
        file = client.files.create(file=f, purpose="batch")
    created = time.monotonic()
    batch = client.batches.create(input_file_id=file.id, endpoint="/v1/chat/completions", completion_window="24h")
    if pipeline.webhooks is not None:  # the terminal event's arrival, then one retrieve
        event = pipeline.webhooks.wait(batch.id, BATCH_TIMEOUT)
        if event is None:
            raise RuntimeError(f"no webhook for {batch.id} within {BATCH_TIMEOUT} s")
        done = event[1]
        batch = client.batches.retrieve(batch.id)
    else:
        while batch.status not in TERMINAL:
            if time.monotonic() - created > BATCH_TIMEOUT:
                raise RuntimeError(f"{batch.id} still {batch.status} after {BATCH_TIMEOUT} s")
            time.sleep(POLL_SECONDS)
            batch = client.batches.retrieve(batch.id)
        done = time.monotonic()
    if batch.status != "completed":
        raise RuntimeError(f"{batch.id} ended {batch.status}: {batch.errors}")
    results = [json.loads(l) for l in client.files.content(batch.output_file_id).text.splitlines()]
    tokens = bench_worker.output_tokens(results)
    seconds = done - created
    window = pipeline.proxy.window(created)
    assert window is not None, "no engine request went through the proxy"
    return {
        "system": "pipeline",
        "seconds": seconds,
        "output_tokens": tokens,
        "cached_tokens": bench_worker.cached_tokens(results),
        "tok_s": tokens / seconds,
        "failed": batch.request_counts.failed if batch.request_counts else None,
        "to_first_request": window.first_request - created,
        "engine_busy": window.last_answer - window.first_request,
        "after_last_answer": done - window.last_answer,
        "engine_requests": window.requests,
        "metrics_reads": window.metrics_reads,
        # How long the engine took to get its first max_num_seqs lines (None: the file has fewer).
        "to_full": _to_full(pipeline.proxy.arrivals(created)),
        "window": (window.first_request, window.last_answer),
    }


def _to_full(arrivals: list[float]) -> float | None:
    if len(arrivals) < bench_worker.MAX_NUM_SEQS:
        return None
    return arrivals[bench_worker.MAX_NUM_SEQS - 1] - arrivals[0]


# --- report ---------------------------------------------------------------------------------------
def table(rows: list[dict]) -> str:
    out = [
        "| dataset | round | output tokens | run-batch s | run-batch tok/s | pipeline s | pipeline tok/s "
        "| pipeline ÷ run-batch | (a) create → first request | (b) engine busy | (c) last answer → completed "
        "| cached prompt tokens, run-batch / pipeline |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for (dataset, rnd), pair in _pairs(rows).items():
        rb, pl = pair["vllm run-batch"], pair["pipeline"]
        out.append(
            f"| {dataset} | {rnd} | {pl['output_tokens']:,} | {rb['seconds']:.1f} | {rb['tok_s']:.0f} | "
            f"{pl['seconds']:.1f} | {pl['tok_s']:.0f} | {pl['tok_s'] / rb['tok_s']:.2f} | "
            f"{pl['to_first_request']:.2f} s | {pl['engine_busy']:.1f} s | {pl['after_last_answer']:.2f} s | "
            f"{rb['cached_tokens']:,} / {pl['cached_tokens']:,} |"
        )
    for dataset in dict.fromkeys(d for d, _ in _pairs(rows)):
        ratios = [
            p["pipeline"]["tok_s"] / p["vllm run-batch"]["tok_s"] for (d, _), p in _pairs(rows).items() if d == dataset
        ]
        out.append(f"| **{dataset}** | **median** | | | | | | **{statistics.median(ratios):.2f}** | | | | |")
    return "\n".join(out)


def cpu_table(rows: list[dict]) -> str:
    """CPU seconds each process used during the engine's window (pipeline: first request -> last
    answer; run-batch: its timed run), beside the engine's own, median over rounds."""
    names = sorted({n for row in rows for n in row.get("cpu", {}) if n != ENGINE})
    out = [
        "| dataset | system | window s | engine CPU s | " + " | ".join(names) + " | beside the engine, % of one core |",
        "| --- | --- | ---: | ---: | " + " | ".join("---:" for _ in names) + " | ---: |",
    ]
    groups: dict[tuple[str, str], list[dict]] = {}
    for row in rows:
        if row.get("cpu"):
            groups.setdefault((row["dataset"], row["system"]), []).append(row)
    med = statistics.median
    for (dataset, system), group in groups.items():
        spans = [r["window"][1] - r["window"][0] for r in group]
        beside = med(
            [sum(v for n, v in r["cpu"].items() if n != ENGINE) / span for r, span in zip(group, spans, strict=False)]
        )
        cells = " | ".join(f"{med([r['cpu'].get(n, 0.0) for r in group]):.2f}" for n in names)
        out.append(
            f"| {dataset} | {system} | {med(spans):.1f} | {med([r['cpu'].get(ENGINE, 0.0) for r in group]):.1f} | "
            f"{cells} | {100 * beside:.0f} % |"
        )
    return "\n".join(out)


def _pairs(rows: list[dict]) -> dict[tuple[str, int], dict[str, dict]]:
    pairs: dict[tuple[str, int], dict[str, dict]] = {}
    for row in rows:
        pairs.setdefault((row["dataset"], row["round"]), {})[row["system"]] = row
    return pairs


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--lines", type=int, default=200)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--datasets", default=",".join(DATASETS), help="comma-separated: " + ", ".join(DATASETS))
    p.add_argument(
        "--completion",
        choices=("webhook", "poll"),
        default="webhook",
        help="how the client learns the batch ended: its batch.completed webhook (default), or "
        f"batches.retrieve every {POLL_SECONDS} s",
    )
    args = p.parse_args()
    datasets = [d.strip() for d in args.datasets.split(",") if d.strip()]
    if unknown := [d for d in datasets if d not in DATASETS]:
        raise SystemExit(f"unknown dataset(s) {unknown}; one of {', '.join(DATASETS)}")
    if reason := engines.missing():
        raise SystemExit(reason)
    # SIGTERM (e.g. `timeout`) unwinds like Ctrl-C, so the finally below stops the deployment.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    began = time.monotonic()
    workdir = Path(tempfile.mkdtemp(prefix="bench-pipeline-"))
    inputs = {d: workdir / f"{d}.jsonl" for d in datasets}
    for d, path in inputs.items():
        make_dataset(d, path, args.lines)
    engine_port = free_port()
    rows: list[dict] = []
    with CpuSampler() as cpu, EngineProxy(f"http://127.0.0.1:{engine_port}") as proxy:
        pipeline = start_pipeline(workdir, proxy, engine_port)
        try:
            if args.completion == "webhook":
                subscribe(pipeline, workdir)
            bench_worker.warm_up(f"http://127.0.0.1:{engine_port}")
            for r in range(1, args.rounds + 1):
                for d in datasets:
                    # Interleaved: the first system alternates by round, so load from other work
                    # on the machine hits each alike.
                    runs = [
                        lambda: bench_pipeline(pipeline, inputs[d]),
                        lambda: bench_worker.bench_run_batch(inputs[d], workdir),
                    ]
                    for run in runs if r % 2 else runs[::-1]:
                        row = {"dataset": d, "round": r, **run()}
                        row["cpu"] = cpu.between(*row["window"])
                        rows.append(row)
                        print(json.dumps(row), flush=True)
        finally:
            pipeline.stop()
    print(
        f"\n{args.lines} chat lines per dataset, {args.rounds} rounds, max-num-seqs {bench_worker.MAX_NUM_SEQS}, "
        f"SmolLM2-135M ({' '.join(engines.chat_engine_args()) or 'bf16'}) on this CPU; the pipeline's end: "
        f"{'its batch.completed webhook' if args.completion == 'webhook' else f'polled every {POLL_SECONDS} s'}; "
        f"wall {time.monotonic() - began:.0f} s\n"
    )
    print(table(rows))
    print(
        "\nCPU seconds by process during the engine's window (median over rounds; other = the rest of the machine):\n"
    )
    print(cpu_table(rows))
    startup = [row["startup_seconds"] for row in rows if "startup_seconds" in row]
    print(f"\nrun-batch engine startup (excluded above): {statistics.median(startup):.1f} s per run (median)")
    print(f"failed lines across all runs: {sum(row['failed'] or 0 for row in rows)}")
    print(f"logs: {workdir}")


if __name__ == "__main__":
    main()
