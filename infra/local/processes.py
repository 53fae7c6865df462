"""Child processes of the local deployment: one vLLM engine per served model (the CPU build, real
small models) and one GPU worker per model beside it, as an ECS task runs them together.

Each runs in its own process group; stopping sends SIGTERM to the group and waits (SIGKILL after a
timeout), so Ctrl-C on ``make up`` leaves nothing running. Their output goes to log files under
the state directory.

A ``Supervisor`` watches them as ECS watches a task: a child that dies on its own is restarted
with exponential backoff (1 s doubling to 30 s; back to 1 s once a child has run for a minute),
each restart logged to the console and to ``supervisor.log`` beside the children's logs. An engine
is restarted alone: its worker keeps running, releases its chunks (EngineDown) and waits for
/health, as it does at start.
"""

import logging
import os
import secrets
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from functions.core.settings import Settings
from gpu_worker.local_engine import signal_group, stop_group
from infra.local import state

log = logging.getLogger("infra.local.processes")

REPO_ROOT = Path(__file__).resolve().parents[2]
SERVE = REPO_ROOT / "gpu_worker" / "engine" / "serve.sh"


class ChildProcess:
    """A command in its own process group, logging to a file."""

    def __init__(self, name: str, argv: Sequence[str], env: Callable[[], Mapping[str, str]], log_path: Path):
        self.name, self._argv, self._env, self.log_path = name, list(argv), env, log_path
        self._process: subprocess.Popen | None = None
        self._log: IO[bytes] | None = None

    @property
    def pid(self) -> int | None:
        """The process (and process group) id of the running command, None if not started."""
        return None if self._process is None else self._process.pid

    def exit_code(self) -> int | None:
        """The exit status once it has exited on its own (negative: killed by that signal)."""
        return None if self._process is None else self._process.poll()

    def note(self, message: str) -> None:
        """A line in the child's own log (between its output)."""
        if self._log is not None:
            self._log.write(f"--- {message}\n".encode())
            self._log.flush()

    def start(self) -> None:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        if self._log is None:
            self._log = self.log_path.open("ab")
        self._process = subprocess.Popen(
            self._argv,
            env=dict(self._env()),
            stdout=self._log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            cwd=REPO_ROOT,
        )

    def alive(self) -> bool:
        return self._process is not None and self._process.poll() is None

    def reap(self) -> None:
        """After the command exited on its own: kill what is left of its process group (a
        grandchild that outlived it would hold the engine's port)."""
        if self._process is not None:
            signal_group(self._process, signal.SIGKILL)
            self._process.wait()

    def stop(self, timeout: float = 30.0) -> None:
        if self._process is not None:
            stop_group(self._process, timeout)
        self._process = None
        if self._log is not None:
            self._log.close()
            self._log = None

    def tail(self, lines: int = 20) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""


#: ``--max-num-seqs`` the local engines get (vLLM's own default for its OpenAI server on a CPU).
#: The same value goes to the worker beside each (``WORKER_ENGINE_MAX_NUM_SEQS``), whose in-flight
#: cap follows it (2 x, ``WorkerConfig.in_flight_cap``), as the ECS entrypoint does on AWS.
#: ``ENGINE_MAX_NUM_SEQS`` in the environment of ``make up`` overrides it.
LOCAL_MAX_NUM_SEQS = 128
MAX_NUM_SEQS_ENV = "ENGINE_MAX_NUM_SEQS"


def max_num_seqs(environ: Mapping[str, str]) -> int:
    value = environ.get(MAX_NUM_SEQS_ENV, "")
    try:
        number = int(value) if value else LOCAL_MAX_NUM_SEQS
    except ValueError:
        raise ValueError(f"{MAX_NUM_SEQS_ENV} must be a positive integer, not {value!r}") from None
    if number < 1:
        raise ValueError(f"{MAX_NUM_SEQS_ENV} must be a positive integer, not {value!r}")
    return number


@dataclass(frozen=True)
class EngineSpec:
    model: str
    port: int
    max_num_seqs: int = LOCAL_MAX_NUM_SEQS

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


def healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/health", timeout=2) as response:  # loopback
            return response.status == 200
    except (urllib.error.URLError, OSError):
        return False


#: What an engine's environment never holds, locally and in the GPU task (gpu_worker/entrypoint.sh
#: withholds the same): vLLM parses tenant input, so it gets no AWS credentials or endpoints, none
#: of the worker's or the deployment's settings (the cache-salt secret among them).
ENGINE_WITHHELD_PREFIXES = ("AWS_", "ECS_CONTAINER_METADATA_URI", "WORKER_", "BATCHAPI_")


def engine_environment(environ: Mapping[str, str]) -> dict[str, str]:
    """``environ`` without what an engine must not see (``ENGINE_WITHHELD_PREFIXES``), marked with
    the deployment's state directory (``state.ENGINE_MARK_ENV``) when it has one."""
    kept = {k: v for k, v in environ.items() if not k.startswith(ENGINE_WITHHELD_PREFIXES)}
    if state.STATE_DIR_ENV in environ:
        kept[state.ENGINE_MARK_ENV] = environ[state.STATE_DIR_ENV]
    return kept


class Engines:
    """All engines, started together (each takes ~20-40 s to load on the CPU) and awaited, each
    with ``engine_environment``."""

    name = "engines"

    def __init__(self, specs: Sequence[EngineSpec], log_dir: Path, ready_timeout: float = 300.0):
        self.specs = list(specs)
        self._ready_timeout = ready_timeout
        self._children = [
            ChildProcess(
                f"engine-{s.model}",
                ["bash", str(SERVE), s.model, str(s.port), "--max-num-seqs", str(s.max_num_seqs)],
                lambda: engine_environment(os.environ),
                log_dir / f"engine-{s.model}.log",
            )
            for s in self.specs
        ]

    @property
    def children(self) -> list[ChildProcess]:
        return list(self._children)

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


#: The nice value the local control plane runs at: the local deployment's own threads (moto, the
#: API front, the Lambdas, pollers and sweepers: ``deployment.Deployment``) and its workers
#: (``WORKER_NICE``). vLLM's CPU engine runs each step on one thread per core, and a core taken by
#: another thread for a moment stalls the whole step; at this value the control plane takes the
#: cores the engines leave free (docs/local.md, "CPU priority: the engines first").
CONTROL_PLANE_NICE = 19

#: The local workers' settings where the environment of `make up` sets none (a `WORKER_*` variable
#: there wins, as every other one does: e.g. the e2e deployment's WORKER_VISIBILITY_SECONDS=15).
LOCAL_WORKER_DEFAULTS = {
    # A long poll returns as soon as a message is sent (moto wakes it); 5 s keeps an idle worker's
    # empty receives few, and a stop waits at most that long.
    "WORKER_POLL_WAIT_SECONDS": "5",
    "WORKER_DRAIN_SECONDS": "10",
    # A chunk held by a worker that died (SIGKILL) is taken again once its visibility lapses: 30 s
    # here (heartbeats every 10 s) instead of 120 s.
    "WORKER_VISIBILITY_SECONDS": "30",
    "WORKER_METRICS_INTERVAL_SECONDS": "30",
    "WORKER_NICE": str(CONTROL_PLANE_NICE),
}


class Workers:
    """One ``python -m gpu_worker`` per model, pointed at its engine and its work queue; the
    environment (moto endpoint, ``BATCHAPI_*`` settings) is the deployment's, read at start."""

    name = "workers"

    def __init__(self, specs: Sequence[EngineSpec], log_dir: Path, environ: Mapping[str, str]):
        # The tenants' prefix-cache salts are derived from one secret per run (the state is moto's
        # memory, gone when the run stops); one the environment sets wins.
        salt_secret = {"WORKER_CACHE_SALT_SECRET": secrets.token_hex(32)}

        def env_of(s: EngineSpec) -> Callable[[], Mapping[str, str]]:
            return lambda: {
                **LOCAL_WORKER_DEFAULTS,
                **salt_secret,
                # The deployment's, but the audit signing key's path: only the appender signs.
                **{k: v for k, v in environ.items() if k != Settings.env_name("audit_local_key_file")},
                "WORKER_MODEL": s.model,
                "WORKER_ENGINE_URL": s.url,
                # The engine's --max-num-seqs: the worker's in-flight cap follows it (2 x), so
                # vLLM's waiting queue is never empty; WORKER_MAX_IN_FLIGHT (if set) still wins.
                "WORKER_ENGINE_MAX_NUM_SEQS": str(s.max_num_seqs),
                # serve.sh starts every engine with --scheduling-policy priority: the worker orders
                # its waiting queue (docs/worker.md, "Order of lines in the engine").
                "WORKER_ENGINE_PRIORITY": "true",
            }

        self._children = [
            ChildProcess(
                f"worker-{s.model}", [sys.executable, "-m", "gpu_worker"], env_of(s), log_dir / f"worker-{s.model}.log"
            )
            for s in specs
        ]

    @property
    def children(self) -> list[ChildProcess]:
        return list(self._children)

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


@dataclass(frozen=True)
class Backoff:
    """Delay before restarting a child that died: ``initial`` doubling up to ``maximum`` on each
    death in a row; a child that had run ``reset_after`` seconds starts again from ``initial``."""

    initial: float = 1.0
    maximum: float = 30.0
    reset_after: float = 60.0

    def delay(self, previous: float | None, ran_for: float) -> float:
        if previous is None or ran_for >= self.reset_after:
            return self.initial
        return min(self.maximum, previous * 2)


@dataclass
class Restart:
    """One restart decision, as logged: which child, how it exited, how long it waits."""

    name: str
    exit_code: int | None
    delay: float


@dataclass
class _Watched:
    child: ChildProcess
    started_at: float
    last_delay: float | None = None
    due: float | None = None  # when a dead child is to be started again


class Supervisor:
    """Watches child processes and restarts those that die on their own (see the module doc).

    ``step()`` is one look at every child (what the watch thread does every ``poll_seconds``);
    ``clock`` and ``wait`` (returns True once stopped) are injectable so tests drive time."""

    name = "supervisor"

    def __init__(
        self,
        children: Sequence[ChildProcess],
        log_path: Path,
        *,
        backoff: Backoff = Backoff(),
        poll_seconds: float = 0.5,
        clock: Callable[[], float] = time.monotonic,
        wait: Callable[[float], bool] | None = None,
    ):
        self._children = list(children)
        self.log_path, self.backoff, self._poll, self._clock = log_path, backoff, poll_seconds, clock
        self._stop = threading.Event()
        self._wait = wait or self._stop.wait
        self._watched: list[_Watched] = []
        self._thread: threading.Thread | None = None
        #: Every restart decided, oldest first.
        self.restarts: list[Restart] = []

    def watch(self) -> None:
        """Take the children (already started, by Engines and Workers) under watch."""
        self._stop.clear()
        now = self._clock()
        self._watched = [_Watched(child, now) for child in self._children]

    def start(self) -> None:
        """Watch the children in a thread of its own."""
        self.watch()
        self._thread = threading.Thread(target=self.run, name="supervisor", daemon=True)
        self._thread.start()

    def run(self) -> None:
        while not self._stop.is_set():
            self.step()
            if self._wait(self._poll):
                return

    def step(self) -> None:
        now = self._clock()
        for w in self._watched:
            if self._stop.is_set():
                return
            if w.due is not None:
                if now >= w.due:
                    w.due, w.started_at = None, now
                    try:
                        w.child.start()
                    except OSError as exc:  # counts as a death: tried again after a longer delay
                        self._schedule(w, now, ran_for=0.0, code=None, why=f"could not start ({exc}): retrying")
                        continue
                    self._record(f"{w.child.name} restarted (pid {w.child.pid})", w.child)
            elif not w.child.alive():
                code = w.child.exit_code()
                w.child.reap()
                self._schedule(
                    w, now, ran_for=now - w.started_at, code=code, why=f"exited ({describe(code)}): restarting"
                )

    def _schedule(self, w: _Watched, now: float, *, ran_for: float, code: int | None, why: str) -> None:
        """Decide when a dead (or unstartable) child starts again, and say so."""
        w.last_delay = self.backoff.delay(w.last_delay, ran_for)
        w.due = now + w.last_delay
        self.restarts.append(Restart(w.child.name, code, w.last_delay))
        self._record(f"{w.child.name} {why} in {w.last_delay:g} s", w.child)

    def stop(self) -> None:
        """Stop watching (the children are stopped by their own components, after this)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None

    def _record(self, message: str, child: ChildProcess) -> None:
        log.warning("%s", message)
        child.note(f"supervisor: {message}")
        try:
            self.log_path.parent.mkdir(parents=True, exist_ok=True)
            with self.log_path.open("a") as out:
                out.write(f"{time.strftime('%Y-%m-%dT%H:%M:%S')} {message}\n")
        except OSError:
            log.exception("could not write %s", self.log_path)


def describe(code: int | None) -> str:
    if code is None:
        return "status unknown"
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"status {code}"


#: The components that start (and restart) processes: ``deployment.Deployment`` starts them from
#: its own thread, not at ``CONTROL_PLANE_NICE``, so that the engines they start keep its priority.
PROCESS_COMPONENTS = (Engines, Workers, Supervisor)
