"""The local deployment as `make up` runs it: ``python -m infra.local`` in a subprocess, on free
loopback ports, with its own state directory (so it never touches a developer's running
``make up``). Tests reach it only over HTTP, with the official openai SDK."""

import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from openai import OpenAI

from batchctl import keys as batchctl_keys
from batchctl import targets as batchctl_targets
from infra import names
from infra.local import state as local_state

REPO = Path(__file__).resolve().parents[2]
READY_PREFIX = "READY "
READY_TIMEOUT = 30.0
#: With the vLLM engines (each loads its model on the CPU in 20-40 s, both at once).
ENGINES_READY_TIMEOUT = 300.0
STOP_TIMEOUT = 60.0


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def port_open(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.settimeout(1)
        return sock.connect_ex(("127.0.0.1", port)) == 0


def clean_env(**extra: str) -> dict[str, str]:
    """This process's environment without any AWS settings (what a developer's shell may hold
    must not matter), plus ``extra``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "BATCHAPI_", "MOTO_"))}
    env.pop("PORT", None)
    return {**env, **extra}


@dataclass
class LocalDeployment:
    process: subprocess.Popen
    log_path: Path
    state_dir: Path
    api_port: int
    moto_port: int
    ready_line: str
    started_in: float

    @property
    def base_url(self) -> str:
        return self.ready_line.removeprefix(READY_PREFIX)

    @property
    def state_file(self) -> Path:
        return self.state_dir / names.LOCAL_STATE_FILE

    @property
    def state(self) -> local_state.LocalState:
        state = local_state.LocalState.read(self.state_file)
        assert state is not None, f"no state file at {self.state_file}"
        return state

    @property
    def env(self) -> dict[str, str]:
        """The environment another process needs to find this deployment (only its state dir)."""
        return clean_env(**{local_state.STATE_DIR_ENV: str(self.state_dir)})

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def client(self, key: str = names.LOCAL_KEY) -> OpenAI:
        return OpenAI(base_url=self.base_url, api_key=key, max_retries=0, timeout=60)

    def new_key(self, tenant: str) -> str:
        """A key for ``tenant``, created with batchctl's logic against this deployment's moto."""
        return batchctl_keys.create_key(batchctl_keys.key_repo(batchctl_targets.local_target(self.state)), tenant, now=int(time.time()))

    def stop(self, signum: int = signal.SIGINT) -> int:
        """Send ``signum`` (Ctrl-C by default) and return the exit status."""
        if self.process.poll() is None:
            self.process.send_signal(signum)
        try:
            return self.process.wait(timeout=STOP_TIMEOUT)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()
            pytest.fail(f"the local deployment did not stop within {STOP_TIMEOUT}s of signal {signum}:\n{self.log()}")

    def leftovers(self) -> list[str]:
        """Processes still running that this deployment started (its engines and workers run in
        process groups of their own; they carry its state directory in their environment)."""
        marker = f"{local_state.STATE_DIR_ENV}={self.state_dir}".encode()
        found = []
        for proc in Path("/proc").iterdir():
            if not proc.name.isdigit() or int(proc.name) == os.getpid():
                continue
            try:
                if marker in (proc / "environ").read_bytes().split(b"\0"):
                    found.append((proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace"))
            except OSError:
                continue
        return found

    def child_group(self, kind: str, model: str) -> int | None:
        """The process group of this deployment's ``kind`` ("engine" or "worker") for ``model``: its
        leader's pid (engines and workers each lead a group of their own), None if none runs now."""
        marker = f"{local_state.STATE_DIR_ENV}={self.state_dir}".encode()
        for proc in Path("/proc").iterdir():
            if not proc.name.isdigit():
                continue
            pid = int(proc.name)
            try:
                if os.getpgid(pid) != pid:
                    continue
                environ = (proc / "environ").read_bytes().split(b"\0")
                argv = (proc / "cmdline").read_bytes().split(b"\0")
                state = (proc / "stat").read_text().rsplit(")", 1)[1].split()[0]
            except (OSError, IndexError):
                continue
            if marker not in environ or state == "Z":
                continue
            worker = b"gpu_worker" in argv
            if kind == "worker" and worker and f"WORKER_MODEL={model}".encode() in environ:
                return pid
            if kind == "engine" and not worker and any(model.encode() in a for a in argv):
                return pid
        return None

    def group_alive(self) -> bool:
        """True while any process of the deployment's session (its process group) exists."""
        try:
            os.killpg(self.process.pid, 0)
        except ProcessLookupError:
            return False
        return True


def start_local_deployment(directory: Path, *, engines: bool = False) -> LocalDeployment:
    """``python -m infra.local`` on free ports; returns once it printed its ready line. Without
    ``engines`` it runs the API, ingest and workflow only (no vLLM engines, no workers)."""
    directory.mkdir(parents=True, exist_ok=True)
    state_dir, log_path = directory / "state", directory / "infra-local.log"
    api_port, moto_port = free_port(), free_port()
    env = clean_env(
        PORT=str(api_port),
        MOTO_PORT=str(moto_port),
        PYTHONUNBUFFERED="1",
        BATCHAPI_LOCAL_ENGINES="1" if engines else "0",
        **{local_state.STATE_DIR_ENV: str(state_dir)},
    )
    started = time.monotonic()
    with log_path.open("wb") as log:  # a file, not a pipe: the child can never block on output
        process = subprocess.Popen(
            [sys.executable, "-m", "infra.local"], cwd=REPO, env=env,
            stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
            start_new_session=True,  # its own process group: the test can check nothing is left
        )
    timeout = ENGINES_READY_TIMEOUT if engines else READY_TIMEOUT
    deadline = started + timeout
    while True:
        ready = [line for line in log_path.read_text(errors="replace").splitlines() if line.startswith(READY_PREFIX)]
        if ready:
            return LocalDeployment(
                process=process, log_path=log_path, state_dir=state_dir, api_port=api_port, moto_port=moto_port,
                ready_line=ready[0], started_in=time.monotonic() - started,
            )
        if process.poll() is not None:
            pytest.fail(f"python -m infra.local exited with {process.returncode} before it was ready:\n{log_path.read_text()}")
        if time.monotonic() > deadline:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
            pytest.fail(f"python -m infra.local was not ready within {timeout}s:\n{log_path.read_text()}")
        time.sleep(0.05)


@pytest.fixture(scope="session")
def local(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalDeployment]:
    """One local deployment for the session's e2e tests; stopped with Ctrl-C (SIGINT) at the end,
    which must exit 0 and remove its state file."""
    deployment = start_local_deployment(tmp_path_factory.mktemp("local"))
    try:
        yield deployment
    finally:
        code = deployment.stop(signal.SIGINT)
    assert code == 0, deployment.log()
    assert not deployment.state_file.exists()


@pytest.fixture(scope="package")  # stopped when tests/e2e is done: the worker tests start their own engines
def local_engines(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalDeployment]:
    """The whole system as `make up` runs it, engines and workers included (started once)."""
    deployment = start_local_deployment(tmp_path_factory.mktemp("local-engines"), engines=True)
    try:
        yield deployment
    finally:
        code = deployment.stop(signal.SIGINT)
    assert code == 0, deployment.log()
    assert not deployment.group_alive(), "make up left processes behind"
    assert deployment.leftovers() == [], "make up left engines or workers behind"


@pytest.fixture
def client(local: LocalDeployment) -> OpenAI:
    """The SDK with the key `make up` seeds (overrides the in-process `client` of tests/conftest.py)."""
    return local.client()


@pytest.fixture
def fresh_client(local: LocalDeployment, request: pytest.FixtureRequest) -> OpenAI:
    """The SDK with a key for a tenant of its own, so listings see only this test's files."""
    tenant = "t-" + re.sub(r"[^A-Za-z0-9_.-]", "-", request.node.name)[:60]
    return local.client(local.new_key(tenant))
