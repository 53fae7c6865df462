"""Child processes of the local deployment: one vLLM engine per served model (the CPU build, real
small models) and one GPU worker per model beside it, as an ECS task runs them together.

Each runs in its own process group; stopping sends SIGTERM to the group and waits (SIGKILL after a
timeout), so Ctrl-C on ``make up`` leaves nothing running. Their output goes to log files under
the state directory.
"""

import logging
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO

log = logging.getLogger("infra.local.processes")

REPO_ROOT = Path(__file__).resolve().parents[2]
SERVE = REPO_ROOT / "gpu_worker" / "engine" / "serve.sh"


class ChildProcess:
    """A command in its own process group, logging to a file."""

    def __init__(self, name: str, argv: Sequence[str], env: Callable[[], Mapping[str, str]], log_path: Path):
        self.name, self._argv, self._env, self.log_path = name, list(argv), env, log_path
        self._process: subprocess.Popen | None = None
        self._log: IO[bytes] | None = None

    def start(self) -> None:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log = self.log_path.open("ab")
        self._process = subprocess.Popen(
            self._argv, env=dict(self._env()), stdout=self._log, stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL, start_new_session=True, cwd=REPO_ROOT,
        )

    def alive(self) -> bool:
        return self._process is not None and self._process.poll() is None

    def stop(self, timeout: float = 30.0) -> None:
        process, self._process = self._process, None
        if process is not None and process.poll() is None:
            try:
                os.killpg(process.pid, signal.SIGTERM)
                process.wait(timeout)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()
            except ProcessLookupError:
                pass
        if self._log is not None:
            self._log.close()
            self._log = None

    def tail(self, lines: int = 20) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""


@dataclass(frozen=True)
class EngineSpec:
    model: str
    port: int

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


def healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/health", timeout=2) as response:  # noqa: S310 - loopback
            return response.status == 200
    except (urllib.error.URLError, OSError):
        return False


class Engines:
    """All engines, started together (each takes ~20-40 s to load on the CPU) and awaited."""

    name = "engines"

    def __init__(self, specs: Sequence[EngineSpec], log_dir: Path, ready_timeout: float = 300.0):
        self.specs = list(specs)
        self._ready_timeout = ready_timeout
        self._children = [
            ChildProcess(f"engine-{s.model}", ["bash", str(SERVE), s.model, str(s.port)], lambda: os.environ, log_dir / f"engine-{s.model}.log")
            for s in self.specs
        ]

    def start(self) -> None:
        for child in self._children:
            child.start()
        deadline = time.monotonic() + self._ready_timeout
        waiting = dict(zip(self._children, self.specs, strict=True))
        while waiting:
            for child, spec in list(waiting.items()):
                if healthy(spec.url):
                    del waiting[child]
                elif not child.alive():
                    raise RuntimeError(f"{child.name} exited while loading:\n{child.tail()}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"engines not healthy within {self._ready_timeout}s: {[c.name for c in waiting]}")
            time.sleep(0.5)

    def stop(self) -> None:
        for child in self._children:
            child.stop()


class Workers:
    """One ``python -m gpu_worker`` per model, pointed at its engine and its work queue; the
    environment (moto endpoint, ``BATCHAPI_*`` settings) is the deployment's, read at start."""

    name = "workers"

    def __init__(self, specs: Sequence[EngineSpec], log_dir: Path, environ: Mapping[str, str]):
        self._children = [
            ChildProcess(
                f"worker-{s.model}",
                [sys.executable, "-m", "gpu_worker"],
                lambda s=s: {
                    **environ,
                    "WORKER_MODEL": s.model,
                    "WORKER_ENGINE_URL": s.url,
                    "WORKER_POLL_WAIT_SECONDS": "1",
                    # the CPU engine's sweet spot (docs/engine.md: 64 concurrent requests)
                    "WORKER_MAX_IN_FLIGHT": "64",
                    "WORKER_DRAIN_SECONDS": "10",
                    "WORKER_METRICS_INTERVAL_SECONDS": "30",
                },
                log_dir / f"worker-{s.model}.log",
            )
            for s in specs
        ]

    def start(self) -> None:
        for child in self._children:
            child.start()
        time.sleep(0.5)
        for child in self._children:
            if not child.alive():
                raise RuntimeError(f"{child.name} exited at start:\n{child.tail()}")

    def stop(self) -> None:
        for child in self._children:
            child.stop()
