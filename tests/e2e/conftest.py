"""The deployment the end-to-end tests drive, chosen by ``BATCHAPI_E2E_TARGET`` (tests/e2e/target.py):

- ``local`` (the default): the local deployment as `make up` runs it, ``python -m infra.local`` in a
  subprocess, on free loopback ports, with its own state directory (so it never touches a
  developer's running ``make up``);
- ``aws``: a deployed stack (``make e2e-aws``), found through its CloudFormation outputs; nothing
  local is started, and tests marked ``local_only`` are skipped with their reason.

Tests reach it only over HTTP, with the official openai SDK, through the ``deployment`` (API only)
and ``deployment_with_models`` fixtures; ``local``, ``local_engines`` and ``start_local`` are the
local deployment itself, for ``local_only`` tests.
"""

import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar
from urllib.parse import SplitResult

import pytest
from openai import OpenAI

from batchctl import keys as batchctl_keys
from batchctl import targets as batchctl_targets
from infra import names
from infra.local import state as local_state
from tests.helpers import free_port

from . import target as e2e_target

REPO = Path(__file__).resolve().parents[2]
READY_PREFIX = "READY "
READY_TIMEOUT = 30.0
#: With the vLLM engines (each loads its model on the CPU in 20-40 s, both at once).
ENGINES_READY_TIMEOUT = 300.0
STOP_TIMEOUT = 60.0


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


@dataclass(frozen=True)
class _Process:
    pid: int
    pgid: int
    state: str
    environ: list[bytes]
    argv: list[bytes]


def _processes() -> Iterator[_Process]:
    """Every process of this machine that can be read now (one that exits meanwhile is skipped)."""
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        pid = int(proc.name)
        try:
            yield _Process(
                pid,
                os.getpgid(pid),
                (proc / "stat").read_text().rsplit(")", 1)[1].split()[0],
                (proc / "environ").read_bytes().split(b"\0"),
                (proc / "cmdline").read_bytes().split(b"\0"),
            )
        except (OSError, IndexError):
            continue


@dataclass
class LocalDeployment:
    process: subprocess.Popen
    log_path: Path
    state_dir: Path
    api_port: int
    moto_port: int
    ready_line: str
    started_in: float
    kind: ClassVar[str] = "local"
    #: The local authorizer reads the table on every request: a revoked key fails at once.
    key_cache_seconds: ClassVar[int] = 0

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

    def client(self, key: str | None = None) -> OpenAI:
        """The SDK with ``key`` (default: the key `make up` seeds)."""
        return OpenAI(base_url=self.base_url, api_key=key or names.LOCAL_KEY, max_retries=0, timeout=60)

    def tenant(self, name: str) -> str:
        return name  # a fresh deployment per session: nothing to tell runs apart

    def is_storage_url(self, url: SplitResult) -> bool:
        return (url.hostname, url.port) == ("127.0.0.1", self.moto_port)  # a presigned moto URL

    def new_key(self, tenant: str) -> str:
        """A key for ``tenant``, created with batchctl's logic against this deployment's moto."""
        return batchctl_keys.create_key(
            batchctl_keys.key_repo(batchctl_targets.local_target(self.state)), tenant, now=int(time.time())
        )

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

    def _markers(self) -> set[bytes]:
        """What this deployment's processes carry in their environment: workers its state
        directory setting, engines (which get no BATCHAPI_ setting) its engine mark."""
        return {
            f"{name}={self.state_dir}".encode() for name in (local_state.STATE_DIR_ENV, local_state.ENGINE_MARK_ENV)
        }

    def _processes(self) -> Iterator[_Process]:
        """This deployment's running processes (they carry its markers in their environment)."""
        markers = self._markers()
        return (p for p in _processes() if markers & set(p.environ))

    def leftovers(self) -> list[str]:
        """Processes still running that this deployment started (its engines and workers run in
        process groups of their own; they carry its state directory in their environment)."""
        return [b" ".join(p.argv).decode(errors="replace") for p in self._processes() if p.pid != os.getpid()]

    def child_group(self, kind: str, model: str) -> int | None:
        """The process group of this deployment's ``kind`` ("engine" or "worker") for ``model``: its
        leader's pid (engines and workers each lead a group of their own), None if none runs now."""
        for p in self._processes():
            if p.pgid != p.pid or p.state == "Z":
                continue
            worker = b"gpu_worker" in p.argv
            if kind == "worker" and worker and f"WORKER_MODEL={model}".encode() in p.environ:
                return p.pid
            if kind == "engine" and not worker and any(model.encode() in a for a in p.argv):
                return p.pid
        return None

    def group_members(self, leader: int) -> dict[int, list[bytes]]:
        """Every live process of the group ``leader`` leads, with its environment."""
        return {p.pid: p.environ for p in _processes() if p.pgid == leader and p.state != "Z"}

    def group_alive(self) -> bool:
        """True while any process of the deployment's session (its process group) exists."""
        try:
            os.killpg(self.process.pid, 0)
        except ProcessLookupError:
            return False
        return True


def start_local_deployment(directory: Path, *, engines: bool = False, speech: bool = True) -> LocalDeployment:
    """``python -m infra.local`` on free ports; returns once it printed its ready line. Without
    ``engines`` it runs the API, ingest and workflow only (no vLLM engines, no workers); without
    ``speech``, no speech model (the benchmarks measure chat and embeddings alone)."""
    directory.mkdir(parents=True, exist_ok=True)
    for _ in range(PORT_ATTEMPTS):
        local = _start_on_free_ports(directory, engines=engines, speech=speech)
        if local is not None:
            return local
    pytest.fail(f"python -m infra.local found its ports taken {PORT_ATTEMPTS} times:\n{_log(directory).read_text()}")


#: A port found free can be taken by another process before infra.local binds it; then it exits
#: saying so (infra/local/__main__.py), and the deployment starts again on other ports.
PORT_ATTEMPTS = 3
PORT_TAKEN = "is already in use"


def _log(directory: Path) -> Path:
    return directory / "infra-local.log"


def _start_on_free_ports(directory: Path, *, engines: bool, speech: bool) -> LocalDeployment | None:
    state_dir, log_path = directory / "state", _log(directory)
    api_port, moto_port = free_port(), free_port()
    env = clean_env(
        PORT=str(api_port),
        MOTO_PORT=str(moto_port),
        PYTHONUNBUFFERED="1",
        BATCHAPI_LOCAL_ENGINES="1" if engines else "0",
        BATCHAPI_LOCAL_SPEECH="1" if speech else "0",
        # Live progress every second (5 s by default): the progress test sees running chunks'
        # lines within its small batch on a fast CPU too (tests/e2e/test_progress_e2e.py).
        WORKER_CHECKPOINT_SECONDS="1",
        # A killed worker's chunk comes back after 15 s, not 30 (tests/e2e/test_recovery_e2e.py);
        # heartbeats every 5 s.
        WORKER_VISIBILITY_SECONDS="15",
        **{local_state.STATE_DIR_ENV: str(state_dir)},
    )
    started = time.monotonic()
    with log_path.open("wb") as log:  # a file, not a pipe: the child can never block on output
        process = subprocess.Popen(
            [sys.executable, "-m", "infra.local"],
            cwd=REPO,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its own process group: the test can check nothing is left
        )
    timeout = ENGINES_READY_TIMEOUT if engines else READY_TIMEOUT
    deadline = started + timeout
    while True:
        ready = [line for line in log_path.read_text(errors="replace").splitlines() if line.startswith(READY_PREFIX)]
        if ready:
            return LocalDeployment(
                process=process,
                log_path=log_path,
                state_dir=state_dir,
                api_port=api_port,
                moto_port=moto_port,
                ready_line=ready[0],
                started_in=time.monotonic() - started,
            )
        if process.poll() is not None:
            if PORT_TAKEN in log_path.read_text(errors="replace"):
                shutil.rmtree(state_dir, ignore_errors=True)  # the next attempt starts afresh
                return None
            pytest.fail(
                f"python -m infra.local exited with {process.returncode} before it was ready:\n{log_path.read_text()}"
            )
        if time.monotonic() > deadline:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
            pytest.fail(f"python -m infra.local was not ready within {timeout}s:\n{log_path.read_text()}")
        time.sleep(0.05)


# --- The target -------------------------------------------------------------------------------
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """On AWS, skip the tests marked local_only (before any fixture of theirs is set up)."""
    try:
        kind = e2e_target.E2ESettings.from_env(os.environ).kind
    except ValueError as exc:
        raise pytest.UsageError(str(exc)) from None
    if kind == "local":
        return
    for item in items:
        marker = item.get_closest_marker(e2e_target.LOCAL_ONLY)
        if marker is not None and item.path.is_relative_to(Path(__file__).parent):
            why = marker.args[0] if marker.args else "needs the local deployment"
            item.add_marker(pytest.mark.skip(reason=f"local_only on {kind}: {why}"))


@pytest.fixture(scope="session")
def e2e_settings() -> e2e_target.E2ESettings:
    return e2e_target.E2ESettings.from_env(os.environ)


@pytest.fixture(autouse=True)
def _aws_env(e2e_settings: e2e_target.E2ESettings, request: pytest.FixtureRequest) -> None:
    """tests/conftest.py's guard (fake credentials, a dead proxy) for the local target; a deployed
    stack is reached with the operator's own credentials and network, so there it stays off."""
    if e2e_settings.kind == "local":
        request.getfixturevalue("_aws_env")  # the guard of tests/conftest.py


def refuse_on_aws(settings: e2e_target.E2ESettings, what: str) -> None:
    if settings.kind != "local":
        pytest.fail(
            f"{what} is the local deployment, and the target is {settings.kind}: a test that needs "
            f"it must be marked {e2e_target.LOCAL_ONLY} (nothing local is started on {settings.kind})"
        )


@pytest.fixture(scope="session")
def stack(
    e2e_settings: e2e_target.E2ESettings, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[e2e_target.StackDeployment]:
    """The deployed stack (BATCHAPI_E2E_TARGET=aws): its outputs, this run's keys (files deleted and
    keys revoked at the end)."""
    if e2e_settings.kind != "aws":
        pytest.fail(f"the stack fixture is for {e2e_target.TARGET_ENV}=aws (the target is {e2e_settings.kind})")
    deployment = e2e_target.open_stack(
        e2e_settings,
        cloudformation=batchctl_targets.cloudformation(batchctl_targets.aws_region(os.environ)),
        operator_env=os.environ,
        region=batchctl_targets.aws_region(os.environ),
        state_dir=tmp_path_factory.mktemp("no-local-state"),
    )
    try:
        yield deployment
    finally:
        problems = deployment.close()
    assert problems == [], problems


@pytest.fixture(scope="session")
def deployment(e2e_settings: e2e_target.E2ESettings, request: pytest.FixtureRequest) -> e2e_target.Deployment:
    """The deployment under test, for tests of the API alone (locally: no engines)."""
    return request.getfixturevalue("stack" if e2e_settings.kind == "aws" else "local")


@pytest.fixture(scope="package")
def deployment_with_models(
    e2e_settings: e2e_target.E2ESettings, request: pytest.FixtureRequest
) -> e2e_target.Deployment:
    """The deployment under test with its models served (locally: the engines and workers too)."""
    return request.getfixturevalue("stack" if e2e_settings.kind == "aws" else "local_engines")


@pytest.fixture(scope="package")
def target_models(deployment_with_models: e2e_target.Deployment, e2e_settings: e2e_target.E2ESettings) -> dict:
    """The chat and the embeddings model the tests use, from what the target serves (``GET
    /v1/models``; None: there is none to use). On AWS both are warmed up first (one one-line batch
    each, at once): the GPU services idle at zero, and the tests' per-batch timeouts are minutes."""
    with deployment_with_models.client() as client:
        served = [m.id for m in client.models.list()]
        embed = e2e_target.pick_model(served, wanted=e2e_settings.embed_model, local=names.LOCAL_EMBED_MODEL)
        chat = e2e_target.pick_model(
            served, wanted=e2e_settings.chat_model, local=names.LOCAL_CHAT_MODEL, exclude=embed, only_if_alone=True
        )
        if deployment_with_models.kind == "aws":
            endpoints = {m: e for m, e in ((chat, "/v1/chat/completions"), (embed, "/v1/embeddings")) if m is not None}
            statuses = e2e_target.warm_up(client, endpoints, within=e2e_settings.warm_up_seconds)
            assert all(s == "completed" for s in statuses.values()), (
                f"warm-up batches after {e2e_settings.warm_up_seconds}s ({e2e_target.WARM_UP_ENV}): {statuses}"
            )
        speech = e2e_target.pick_model(served, wanted=e2e_settings.speech_model, local=names.LOCAL_SPEECH_MODEL)
    return {"chat": chat, "embed": embed, "speech": speech, "served": served}


@pytest.fixture(scope="package")
def chat_model(target_models: dict) -> str:
    if target_models["chat"] is None:
        pytest.skip(f"no chat model to use among {target_models['served']} (set {e2e_target.CHAT_MODEL_ENV})")
    return target_models["chat"]


@pytest.fixture(scope="package")
def embed_model(target_models: dict) -> str:
    if target_models["embed"] is None:
        pytest.skip(f"no embeddings model to use among {target_models['served']} (set {e2e_target.EMBED_MODEL_ENV})")
    return target_models["embed"]


@pytest.fixture(scope="package")
def speech_model(target_models: dict) -> str:
    if target_models["speech"] is None:
        pytest.skip(f"no speech model to use among {target_models['served']} (set {e2e_target.SPEECH_MODEL_ENV})")
    return target_models["speech"]


# --- The local deployment (local_only tests) ---------------------------------------------------
@pytest.fixture(scope="session")
def local(e2e_settings: e2e_target.E2ESettings, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalDeployment]:
    """One local deployment for the session's e2e tests; stopped with Ctrl-C (SIGINT) at the end,
    which must exit 0 and remove its state file."""
    refuse_on_aws(e2e_settings, "the local fixture")
    deployment = start_local_deployment(tmp_path_factory.mktemp("local"))
    try:
        yield deployment
    finally:
        code = deployment.stop(signal.SIGINT)
    assert code == 0, deployment.log()
    assert not deployment.state_file.exists()


@pytest.fixture(scope="package")  # stopped when tests/e2e is done: the worker tests start their own engines
def local_engines(
    e2e_settings: e2e_target.E2ESettings, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[LocalDeployment]:
    """The whole system as `make up` runs it, engines and workers included (started once)."""
    refuse_on_aws(e2e_settings, "the local_engines fixture")
    deployment = start_local_deployment(tmp_path_factory.mktemp("local-engines"), engines=True)
    try:
        yield deployment
    finally:
        code = deployment.stop(signal.SIGINT)
    assert code == 0, deployment.log()
    assert not deployment.group_alive(), "make up left processes behind"
    assert deployment.leftovers() == [], "make up left engines or workers behind"


@pytest.fixture
def start_local(e2e_settings: e2e_target.E2ESettings) -> Callable[..., LocalDeployment]:
    """``start_local_deployment`` for tests that start (and stop) a deployment of their own."""
    refuse_on_aws(e2e_settings, "the start_local fixture")
    return start_local_deployment


@pytest.fixture
def client(deployment: e2e_target.Deployment) -> OpenAI:
    """The SDK with the session's key (locally the one `make up` seeds; overrides the in-process
    `client` of tests/conftest.py)."""
    return deployment.client()


@pytest.fixture
def fresh_client(deployment: e2e_target.Deployment, request: pytest.FixtureRequest) -> OpenAI:
    """The SDK with a key for a tenant of its own, so listings see only this test's files."""
    tenant = "t-" + re.sub(r"[^A-Za-z0-9_.-]", "-", request.node.name)[:60]
    return deployment.client(deployment.new_key(tenant))
