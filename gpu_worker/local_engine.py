"""The engine ``batchctl run-batch --model NAME`` starts for itself, as ``vllm run-batch`` does.

``LocalEngine`` starts vLLM's OpenAI server through ``gpu_worker/engine/serve.sh`` (which holds
the CPU flags, for the two local models and for a model folder) in a process group of its own,
on a free loopback port (or the ``--enable-metrics`` port), with its log in a file. ``run`` waits
for ``/health`` while watching the process, runs the given coroutine while the process lives, and
stops the group whatever happens (SIGTERM, then SIGKILL after a grace): a finished run, an error,
Ctrl-C. ``EngineExited`` carries the log's last lines when the engine dies or never gets healthy.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import socket
import subprocess
import tempfile
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO, TypeVar

from .engine_client import EngineClient, EngineDown

SERVE_SH = Path(__file__).resolve().parent / "engine" / "serve.sh"
#: The models serve.sh knows by name (their folders are in .models/, made by `make engine`).
LOCAL_MODELS = ("smollm2-135m-instruct", "all-minilm-l6-v2", "whisper-tiny-en")
#: Seconds between SIGTERM and SIGKILL (vLLM stops in about 2 s on SIGTERM).
STOP_GRACE = 20.0
LOG_TAIL_LINES = 40

T = TypeVar("T")


class EngineExited(Exception):
    """The engine process ended before it was stopped (or before it was healthy)."""


class UnknownModel(ValueError):
    """NAME is neither a local model nor a folder with config.json (a usage error)."""


def model_argument(name: str) -> str:
    """serve.sh's first argument for NAME: a local model's name, or a folder's absolute path."""
    if name in LOCAL_MODELS:
        return name
    folder = Path(name).expanduser()
    if (folder / "config.json").is_file():
        return str(folder.resolve())
    raise UnknownModel(f"--model {name}: not one of {', '.join(LOCAL_MODELS)} and not a model folder with config.json")


def serve_command(model: str, port: int, engine_args: Sequence[str]) -> list[str]:
    """The engine's command line: serve.sh MODEL PORT [engine args]."""
    return [str(SERVE_SH), model, str(port), *engine_args]


def free_port(host: str = "127.0.0.1") -> int:
    """A port on ``host`` nothing listens on now (bind port 0). The local deployment's too."""
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def signal_group(process: subprocess.Popen[bytes], sig: signal.Signals) -> None:
    """``sig`` to ``process``'s process group (it was started with ``start_new_session``)."""
    try:
        os.killpg(process.pid, sig)
    except (ProcessLookupError, PermissionError):
        pass  # the whole group is gone


def stop_group(process: subprocess.Popen[bytes], grace: float) -> None:
    """SIGTERM to the process group, SIGKILL after ``grace`` seconds; idempotent. The group is
    signalled even when the leader has exited, and SIGKILLed once the leader is gone, so no child
    of it is left behind (a grandchild that outlived it would hold an engine's port). The local
    deployment stops its engines and workers with it too."""
    signal_group(process, signal.SIGTERM)
    try:
        process.wait(grace)
    except subprocess.TimeoutExpired:
        signal_group(process, signal.SIGKILL)
        process.wait()
    # Children that ignored SIGTERM after the leader exited.
    signal_group(process, signal.SIGKILL)


def _env() -> dict[str, str]:
    # The engine talks to nothing but loopback: no proxy from this environment.
    proxies = ("http_proxy", "https_proxy", "all_proxy")
    return {k: v for k, v in os.environ.items() if k.lower() not in proxies}


@dataclass
class LocalEngine:
    command: list[str]
    port: int
    log_path: Path
    stop_grace: float = STOP_GRACE
    process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "wb") as log:  # the process keeps its own copy of the descriptor
            self.process = subprocess.Popen(
                self.command,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=_env(),
                start_new_session=True,  # its own process group: stop() reaches every vLLM process
            )

    def exited(self) -> int | None:
        return None if self.process is None else self.process.poll()

    def stop(self) -> None:
        """The engine's process group stopped (``stop_group``); idempotent."""
        if self.process is not None:
            stop_group(self.process, self.stop_grace)

    def log_tail(self, lines: int = LOG_TAIL_LINES) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def _exited_error(self, when: str) -> EngineExited:
        return EngineExited(
            f"the engine exited ({self.exited()}) {when}; the last lines of {self.log_path}:\n{self.log_tail()}"
        )

    async def wait_healthy(self, client: EngineClient, timeout: float, poll: float = 0.25) -> None:
        """Until ``/health`` answers 200; EngineExited as soon as the process ends first."""
        health = asyncio.ensure_future(client.wait_healthy(timeout, interval=poll))
        try:
            while not health.done():
                if self.exited() is not None:
                    raise self._exited_error("before it was healthy")
                await asyncio.wait({health}, timeout=poll)
            health.result()
        except EngineDown as exc:
            raise EngineDown(f"{exc}; the last lines of {self.log_path}:\n{self.log_tail()}") from exc
        finally:
            health.cancel()

    async def while_alive(self, work: Awaitable[T], poll: float = 0.25) -> T:
        """``work``'s result; cancelled, with EngineExited, if the engine dies first."""
        task = asyncio.ensure_future(work)
        try:
            while not task.done():
                if self.exited() is not None:
                    raise self._exited_error("during the run")
                await asyncio.wait({task}, timeout=poll)
            return task.result()
        finally:
            task.cancel()


def local_engine(
    name: str,
    *,
    served_model_names: Sequence[str] | None,
    engine_args: Sequence[str],
    log_dir: Path,
    port: int | None = None,
) -> LocalEngine:
    """The engine for ``--model NAME`` (not started). Served as ``served_model_names`` or NAME
    itself, as vLLM's run-batch serves ``--model``: a line's ``body.model`` is one of them or absent."""
    port = port or free_port()
    names = list(served_model_names or [name])
    args = ["--served-model-name", *names, *engine_args]
    return LocalEngine(serve_command(model_argument(name), port, args), port, log_dir / f"engine-{port}.log")


def serve_and_run(engine: LocalEngine, run: Callable[[str], Awaitable[T]], *, health_timeout: float) -> T:
    """Start ``engine``, wait for its /health, return ``run(engine.url)``'s result; the engine is
    stopped on every way out (done, an exception, KeyboardInterrupt). EngineExited if it dies."""

    async def go() -> T:
        async with EngineClient(engine.url, max_in_flight=1) as client:
            await engine.wait_healthy(client, health_timeout)
        return await engine.while_alive(run(engine.url))

    try:
        engine.start()
        return asyncio.run(go())
    finally:
        engine.stop()


#: vLLM run-batch's --port default (its Prometheus server's), used with --enable-metrics.
METRICS_PORT = 8000


def usage_problem(args: argparse.Namespace) -> str | None:
    """What is wrong with run-batch's arguments (None if nothing): the engine's own flags need --model."""
    if args.model is not None:
        return None
    given = [
        flag
        for flag, value in (
            ("--served-model-name", args.served_model_name),
            ("--enable-metrics", args.enable_metrics),
            ("--port", args.port),
            ("engine args after --", args.engine_args),
        )
        if value
    ]
    return (
        f"{', '.join(given)} only go with --model (with --engine-url the engine is already running)" if given else None
    )


def for_arguments(args: argparse.Namespace, *, err: TextIO) -> LocalEngine:
    """The engine run-batch's ``--model`` arguments describe (not started; says where on ``err``)."""
    log_dir = args.output_tmp_dir or Path(tempfile.mkdtemp(prefix="batchctl-run-batch-"))
    port = args.port or (METRICS_PORT if args.enable_metrics else None)
    engine = local_engine(
        args.model,
        served_model_names=args.served_model_name,
        engine_args=args.engine_args,
        log_dir=log_dir,
        port=port,
    )
    print(f"batchctl run-batch: starting {args.model} on {engine.url} (log: {engine.log_path})", file=err)
    if args.enable_metrics:
        print(f"batchctl run-batch: Prometheus metrics at {engine.url}/metrics during the run", file=err)
    return engine
