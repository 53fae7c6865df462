"""``batchctl run-batch --model``'s engine start and stop (gpu_worker/local_engine.py), with a fake
engine command in place of serve.sh (tests/fakes/serve_engine.py: /health and /v1/embeddings)."""

import io
import json
import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

import batchctl
from gpu_worker import local_engine, offline

FAKE = Path(__file__).resolve().parents[1] / "fakes" / "serve_engine.py"
DIRECT = urllib.request.build_opener(urllib.request.ProxyHandler({}))


@pytest.fixture
def fake_engine(monkeypatch, tmp_path):
    """serve.sh replaced by the fake; returns a setter of its MODE and the dir with its pids."""
    mode = {"value": "ok"}
    state = tmp_path / "engine-state"
    state.mkdir()

    def command(model, port, engine_args):
        return [sys.executable, str(FAKE), str(port), mode["value"], str(state)]

    monkeypatch.setattr(local_engine, "serve_command", command)
    monkeypatch.setattr(local_engine, "STOP_GRACE", 5.0)
    return mode, state


def alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"  # a zombie has stopped


def group_stopped(engine: local_engine.LocalEngine, state: Path) -> bool:
    assert engine.process is not None
    child = int((state / "pids").read_text())
    deadline = time.monotonic() + 5  # the child's signal is delivered asynchronously
    while (alive(engine.process.pid) or alive(child)) and time.monotonic() < deadline:
        time.sleep(0.05)
    return not alive(engine.process.pid) and not alive(child)


def embedding_lines(n: int) -> str:
    return "".join(
        json.dumps(
            {
                "custom_id": f"req-{i}",
                "method": "POST",
                "url": "/v1/embeddings",
                "body": {"model": "all-minilm-l6-v2", "input": f"text {i}"},
            }
        )
        + "\n"
        for i in range(n)
    )


def engine_for(tmp_path: Path) -> local_engine.LocalEngine:
    return local_engine.local_engine(
        "all-minilm-l6-v2", served_model_names=None, engine_args=[], log_dir=tmp_path / "logs"
    )


def test_the_run_starts_after_health_and_the_group_is_stopped_after_it(fake_engine, tmp_path):
    _, state = fake_engine
    engine = engine_for(tmp_path)

    async def run(url):
        with DIRECT.open(f"{url}/health", timeout=2) as resp:
            return resp.status

    assert local_engine.serve_and_run(engine, run, health_timeout=30) == 200
    assert group_stopped(engine, state)


def test_the_group_is_stopped_when_the_run_raises(fake_engine, tmp_path):
    _, state = fake_engine
    engine = engine_for(tmp_path)

    async def run(url):
        raise RuntimeError("the run failed")

    with pytest.raises(RuntimeError, match="the run failed"):
        local_engine.serve_and_run(engine, run, health_timeout=30)
    assert group_stopped(engine, state)


def run_batch(tmp_path: Path, *extra: str) -> tuple[int, str]:
    (tmp_path / "in.jsonl").write_text(embedding_lines(3))
    err = io.StringIO()
    argv = ["run-batch", "-i", str(tmp_path / "in.jsonl"), "-o", str(tmp_path / "out.jsonl")]
    code = batchctl.main(
        [*argv, "--model", "all-minilm-l6-v2", "--output-tmp-dir", str(tmp_path / "logs"), *extra],
        env={},
        out=io.StringIO(),
        err=err,
    )
    return code, err.getvalue()


def started(monkeypatch) -> list[local_engine.LocalEngine]:
    engines: list[local_engine.LocalEngine] = []
    original = local_engine.LocalEngine.start

    def start(self):
        engines.append(self)
        original(self)

    monkeypatch.setattr(local_engine.LocalEngine, "start", start)
    return engines


def test_run_batch_with_model_runs_every_line_and_exits_0(fake_engine, tmp_path, monkeypatch):
    _, state = fake_engine
    engines = started(monkeypatch)
    code, err = run_batch(tmp_path)
    assert code == 0, err
    assert "3 completed, 0 failed" in err
    rows = [json.loads(line) for line in (tmp_path / "out.jsonl").read_text().splitlines()]
    assert [r["custom_id"] for r in rows] == ["req-0", "req-1", "req-2"]
    assert all(r["response"]["status_code"] == 200 for r in rows)
    assert group_stopped(engines[0], state)
    assert engines[0].log_path.parent == tmp_path / "logs"


def test_an_engine_that_dies_before_health_is_exit_1_with_its_log_tail(fake_engine, tmp_path, monkeypatch):
    mode, state = fake_engine
    mode["value"] = "die"
    engines = started(monkeypatch)
    code, err = run_batch(tmp_path)
    assert code == 1
    assert "exited (3) before it was healthy" in err and "out of memory while loading" in err
    assert group_stopped(engines[0], state)  # its child too, though the leader had already exited


def test_an_io_error_is_exit_1_and_stops_the_engine(fake_engine, tmp_path, monkeypatch):
    _, state = fake_engine
    engines = started(monkeypatch)
    code, err = run_batch(tmp_path, "--errors", str(tmp_path / "no-such-dir" / "err.jsonl"))
    assert code == 1 and "no-such-dir" in err
    assert group_stopped(engines[0], state)


def test_ctrl_c_stops_the_engine_and_exits_130(fake_engine, tmp_path, monkeypatch):
    _, state = fake_engine
    engines = started(monkeypatch)

    async def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(offline, "run_paths", interrupted)
    code, err = run_batch(tmp_path)
    assert code == 130 and "interrupted" in err
    assert group_stopped(engines[0], state)


@pytest.mark.parametrize(
    "argv",
    [
        ["--engine-url", "http://127.0.0.1:1", "--served-model-name", "x"],
        ["--engine-url", "http://127.0.0.1:1", "--", "--max-num-seqs", "4"],
        ["--model", "no-such-model-or-folder"],
    ],
)
def test_usage_errors_are_exit_2(argv, tmp_path):
    err = io.StringIO()
    code = batchctl.main(["run-batch", "-i", "in", "-o", "out", *argv], env={}, out=io.StringIO(), err=err)
    assert code == 2, err.getvalue()


def test_the_engine_command_is_serve_sh_with_the_served_names_and_the_extra_args(tmp_path):
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.json").write_text("{}")
    engine = local_engine.local_engine(
        str(tmp_path / "m"), served_model_names=None, engine_args=["--max-num-seqs", "4"], log_dir=tmp_path, port=1234
    )
    assert engine.command == [
        str(local_engine.SERVE_SH),
        str(tmp_path / "m"),
        "1234",
        "--served-model-name",
        str(tmp_path / "m"),
        "--max-num-seqs",
        "4",
    ]
    args = offline_args("--model", "all-minilm-l6-v2", "--served-model-name", "a", "b", "--enable-metrics")
    engine = local_engine.for_arguments(args, err=io.StringIO())
    assert engine.port == 8000 and engine.command[1:] == ["all-minilm-l6-v2", "8000", "--served-model-name", "a", "b"]


def offline_args(*argv: str):
    return batchctl.cli.parser().parse_args(["run-batch", "-i", "in", "-o", "out", *argv])


def serve_sh_args(tmp_path: Path, *argv: str) -> list[str]:
    """The `vllm serve` arguments serve.sh execs, with a stand-in vllm that prints them."""
    vllm = tmp_path / "venv" / "bin" / "vllm"
    vllm.parent.mkdir(parents=True)
    vllm.write_text('#!/bin/sh\nfor a in "$@"; do echo "$a"; done\n')
    vllm.chmod(0o755)
    env = {"PATH": os.environ["PATH"], "ENGINE_VENV": str(tmp_path / "venv"), "ENGINE_DTYPE": "float32"}
    done = subprocess.run([str(local_engine.SERVE_SH), *argv], capture_output=True, text=True, env=env, timeout=30)
    assert done.returncode == 0, done.stderr
    return done.stdout.splitlines()


def test_serve_sh_gives_a_model_folder_the_cpu_settings_and_no_local_model_flags(tmp_path):
    folder = tmp_path / "my-model"
    folder.mkdir()
    (folder / "config.json").write_text("{}")
    args = serve_sh_args(tmp_path, str(folder), "1234", "--served-model-name", "mine")
    assert args[:2] == ["serve", str(folder)]
    assert "--runner" not in args and "--max-model-len" not in args
    assert args[args.index("--port") + 1] == "1234" and args[args.index("--host") + 1] == "127.0.0.1"
    assert args[args.index("--kv-cache-memory-bytes") + 1] == "2G"  # float32: the doubled default
    assert {"--enforce-eager", "--enable-prompt-tokens-details"} <= set(args)
    assert args[-2:] == ["--served-model-name", "mine"]
