"""Offline mode, as vLLM's ``run-batch``: a JSONL file through the engine with no AWS.

    batchctl run-batch -i IN -o OUT [--errors ERR] [--output-tmp-dir DIR] --engine-url URL
    batchctl run-batch -i IN -o OUT [--errors ERR] [--output-tmp-dir DIR] --model NAME [-- ENGINE_ARGS]

IN, OUT and ERR are local paths or ``http(s)`` URLs (``remote_io``: the input streamed from a GET,
each output PUT from a temporary file once the run ends, both retried with backoff), so a
presigned S3 GET and PUT pair works. ``--engine-url`` uses an engine already running; ``--model``
starts one for the run and stops it after (``local_engine``: serve.sh for a local model's name or
a model folder, a free loopback port, the log in ``--output-tmp-dir``), as vLLM's run-batch loads
its own. Exit codes: ``EPILOG`` (0 every line ran, per-line failures included; 1 engine or file
failure; 2 usage; 130 Ctrl-C).

Same per-line code path as the SQS worker (``line_runner.run_line`` under the engine client's global
cap, retries and overload backoff). Streaming: the input is read in 1 MiB pieces and results are
written in input order as they finish, with at most ``window`` lines between the oldest unfinished
line and the newest started one, so memory is bounded whatever the file size. A line that is not a
valid request becomes an error line (per-line isolation); it never stops the run. Without
``--errors`` error lines go to the output file, as vLLM's run-batch does.
"""

from __future__ import annotations

import argparse
import asyncio
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Final, TextIO

from functions.core import guard as guards
from functions.core import limits
from functions.core.chunk_lifecycle import Usage
from functions.core.lines import RawLine, iter_lines

from . import local_engine, remote_io
from .config import WorkerConfig
from .engine_client import EngineClient, EngineDown
from .line_runner import LineResult, run_line, run_ordered
from .media import DATA_URLS_ONLY, MediaPolicy
from .policy_checks import IN_PROCESS, Checks, PolicyChecks

READ_BYTES = 1024 * 1024
#: The paths a line may name offline: every batch endpoint, and the other routes vLLM's server
#: (and so ``vllm run-batch``) answers for the same calls: ``/score``, ``/rerank`` and
#: ``/v2/rerank`` (its Cohere-style rerank). A line is sent to the path it names.
OFFLINE_ENDPOINTS: Final = (*limits.DEFAULT_ENDPOINTS, "/score", "/rerank", "/v2/rerank")


@dataclass
class Summary:
    completed: int = 0
    failed: int = 0
    usage: Usage = field(default_factory=Usage)
    seconds: float = 0.0

    @property
    def output_tokens_per_second(self) -> float:
        return self.usage.output_tokens / self.seconds if self.seconds else 0.0


def _read(f: IO[bytes]) -> Iterator[bytes]:
    while data := f.read(READ_BYTES):
        yield data


def file_lines(f: IO[bytes], *, max_line_bytes: int) -> Iterator[RawLine]:
    return iter_lines(_read(f), max_line_bytes=max_line_bytes)


async def run_file(
    engine: EngineClient,
    source: IO[bytes],
    output: IO[bytes],
    errors: IO[bytes] | None = None,
    *,
    endpoints: tuple[str, ...] = OFFLINE_ENDPOINTS,
    max_line_bytes: int = limits.DEFAULT_MAX_LINE_BYTES,
    window: int | None = None,
    guard: guards.GuardPolicy | None = None,
    checks: Checks = IN_PROCESS,
    media: MediaPolicy = DATA_URLS_ONLY,
) -> Summary:
    """Run every line of ``source``; write results in input order. Returns counts and usage.
    ``guard``: the prompt and output policy every line passes (as in the worker), run by
    ``checks`` (``command`` passes check processes, as the worker does). ``media``: the hosts
    an audio line's ``file_url`` may name (``--allowed-media-domains``)."""
    summary = Summary()
    started = time.monotonic()
    window = window or 2 * engine.max_in_flight
    bound = checks.bind("", guard)

    async def run(raw: RawLine) -> LineResult:
        return await run_line(engine, raw, endpoint=None, endpoints=endpoints, guard=bound, media=media)

    async for result in run_ordered(file_lines(source, max_line_bytes=max_line_bytes), run, window=window):
        data = result.line.model_dump_json().encode() + b"\n"
        if result.succeeded:
            summary.completed += 1
            summary.usage.add_response(result.usage)
            output.write(data)
        else:
            summary.failed += 1
            (errors or output).write(data)
    summary.seconds = time.monotonic() - started
    return summary


async def run_paths(
    input_path: str | Path,
    output_path: str | Path,
    errors_path: str | Path | None,
    engine: EngineClient,
    *,
    health_timeout: float,
    guard: guards.GuardPolicy | None = None,
    checks: Checks = IN_PROCESS,
    tmp_dir: str | Path | None = None,
    media: MediaPolicy = DATA_URLS_ONLY,
) -> Summary:
    """``run_file`` between paths or ``http(s)`` URLs (``remote_io``): the input read as it
    arrives, each URL output PUT once the run has ended."""
    await engine.wait_healthy(health_timeout)
    with remote_io.source(input_path) as source, remote_io.sink(output_path, tmp_dir=tmp_dir) as output:
        if errors_path is None:
            return await run_file(engine, source, output, guard=guard, checks=checks, media=media)
        with remote_io.sink(errors_path, tmp_dir=tmp_dir) as errors:
            return await run_file(engine, source, output, errors, guard=guard, checks=checks, media=media)


# --- the `batchctl run-batch` subcommand --------------------------------------------------------
EPILOG = """\
engine: exactly one of --engine-url (an engine already running) or --model NAME (started here:
NAME is smollm2-135m-instruct, all-minilm-l6-v2 or a Hugging Face model folder; started through
gpu_worker/engine/serve.sh on a free 127.0.0.1 port, log in --output-tmp-dir or a temp dir, stopped
when the run ends, fails or is interrupted). Arguments after `--` go to the engine (`vllm serve`).

exit codes:
  0    every line ran; lines that failed are error lines in the output (or --errors) file, and
       the summary on stderr counts them (as vLLM's run-batch, which also exits 0 then)
  1    the engine could not start, was not healthy in time or died; or a file could not be read
       or written (the last lines of a started engine's log are printed)
  2    usage error (bad or conflicting arguments, --model that is neither a local model nor a folder)
  130  interrupted (Ctrl-C); a started engine is stopped first
"""


def add_parser(commands: argparse._SubParsersAction) -> None:
    p = commands.add_parser(
        "run-batch",
        help="run a local batch file through an OpenAI-compatible engine (no AWS), like `vllm run-batch`",
        description="Run a local batch file (OpenAI batch lines) through an engine, like `vllm run-batch` "
        "(docs/run-batch.md: the flags side by side).",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "-i", "--input-file", "--input", dest="input", required=True, help="input JSONL: a path or an http(s) URL (GET)"
    )
    p.add_argument(
        "-o",
        "--output-file",
        "--output",
        dest="output",
        required=True,
        help="output JSONL (input order): a path or an http(s) URL (PUT once the run ends)",
    )
    where = "a path or an http(s) URL"
    p.add_argument("--errors", help=f"error lines go here (default: into the output file): {where}")
    engine = p.add_mutually_exclusive_group(required=True)
    engine.add_argument("--engine-url", help="a running engine's base URL, e.g. http://127.0.0.1:8000")
    engine.add_argument("--model", help="start this engine for the run: a local model's name or a model folder")
    p.add_argument(
        "--served-model-name",
        nargs="+",
        help="with --model: the names the engine answers to (default: NAME); a line's body.model is one of them",
    )
    p.add_argument(
        "--output-tmp-dir",
        type=Path,
        help="where URL outputs are written before their PUT, and with --model the engine's log (default: a temp dir)",
    )
    p.add_argument(
        "--enable-metrics", action="store_true", help="with --model: the engine on --port, Prometheus at /metrics"
    )
    p.add_argument("--port", type=int, help="with --model: the engine's port (default: a free one; 8000 with metrics)")
    p.add_argument("engine_args", nargs="*", metavar="-- ENGINE_ARGS", help="with --model: extra `vllm serve` args")
    p.add_argument(
        "--max-in-flight", type=int, default=0, help="requests in flight (default: 2 x --engine-max-num-seqs, or 512)"
    )
    p.add_argument("--engine-max-num-seqs", type=int, default=0, help="the engine's --max-num-seqs, if known")
    p.add_argument("--health-timeout", type=float, default=600.0, help="seconds to wait for the engine's /health")
    p.add_argument(
        "--allowed-media-domains",
        nargs="+",
        default=[],
        metavar="HOST",
        help="hosts an audio line's http(s) file_url may be fetched from (exact host; default: none, only data: URLs)",
    )
    # The same prompt and output policy a tenant's batches pass (docs/governance.md).
    guards.add_arguments(p.add_argument_group("prompt and output policy (as `batchctl tenants set`)"))


async def _run(args: argparse.Namespace, engine_url: str) -> Summary:
    config = WorkerConfig(
        engine_url=engine_url, max_in_flight=args.max_in_flight, engine_max_num_seqs=args.engine_max_num_seqs
    )
    # One tenant: it may use every check process (reserve 0).
    async with (
        EngineClient.from_config(config) as engine,
        PolicyChecks(config.policy_check_processes, seconds=config.policy_check_seconds, reserve=0) as checks,
    ):
        return await run_paths(
            args.input,
            args.output,
            args.errors,
            engine,
            health_timeout=args.health_timeout,
            guard=guards.from_arguments(args),
            checks=checks,
            tmp_dir=args.output_tmp_dir,
            media=MediaPolicy(allowed_domains=tuple(host.lower() for host in args.allowed_media_domains)),
        )


def command(args: argparse.Namespace, *, err: TextIO) -> int:
    """Exit codes: EPILOG."""
    if problem := local_engine.usage_problem(args):
        print(f"batchctl run-batch: {problem}", file=err)
        return 2
    try:
        if args.model is None:
            summary = asyncio.run(_run(args, args.engine_url))
        else:
            engine = local_engine.for_arguments(args, err=err)
            summary = local_engine.serve_and_run(
                engine, lambda url: _run(args, url), health_timeout=args.health_timeout
            )
    except local_engine.UnknownModel as exc:
        print(f"batchctl run-batch: {exc}", file=err)
        return 2
    except (EngineDown, local_engine.EngineExited, OSError) as exc:
        print(f"batchctl run-batch: {exc}", file=err)
        return 1
    except KeyboardInterrupt:
        print("batchctl run-batch: interrupted", file=err)
        return 130
    print(
        f"batchctl run-batch: {summary.completed} completed, {summary.failed} failed in {summary.seconds:.1f} s; "
        f"{summary.usage.input_tokens} input / {summary.usage.output_tokens} output tokens "
        f"({summary.output_tokens_per_second:.1f} output tokens/s)",
        file=err,
    )
    return 0
