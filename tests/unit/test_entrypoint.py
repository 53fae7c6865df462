"""gpu_worker/entrypoint.sh with stand-in commands for vLLM and the worker (the image itself cannot
be built here: no Docker): the engine command line from the environment, one max-num-seqs for both
sides, the engine without the worker's credentials and settings and as its own user, either process
dying fails the task, SIGTERM drains the worker before the engine stops."""

import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

ENTRYPOINT = Path(__file__).resolve().parents[2] / "gpu_worker" / "entrypoint.sh"

#: A stand-in process: logs its argv and WORKER_* env, logs SIGTERM, exits EXIT_ON_TERM on it
#: (or never, if IGNORE_TERM), or exits EXIT_AFTER seconds after start with EXIT_CODE.
FAKE = r"""
import os, signal, sys, time
name, log = sys.argv[1], os.environ["LOG"]
def note(text):
    with open(log, "a") as f:
        f.write(f"{name} {text}\n")
note("argv " + " ".join(sys.argv[2:]))
note("env " + " ".join(f"{k}={v}" for k, v in sorted(os.environ.items()) if k.startswith(("WORKER_", "AWS_", "BATCHAPI_", "ECS_"))))
note(f"uid {os.getuid()}")
def term(*_):
    note("TERM")
    if os.environ.get(f"{name.upper()}_IGNORE_TERM"):
        return
    time.sleep(float(os.environ.get(f"{name.upper()}_DRAIN", "0")))
    note("exit")
    sys.exit(0)
signal.signal(signal.SIGTERM, term)
after = os.environ.get(f"{name.upper()}_EXIT_AFTER")
start = time.monotonic()
while True:
    time.sleep(0.02)
    if after and time.monotonic() - start > float(after):
        note("dies")
        sys.exit(int(os.environ.get(f"{name.upper()}_EXIT_CODE", "0")))
"""


@pytest.fixture
def run(tmp_path):
    fake = tmp_path / "fake.py"
    fake.write_text(FAKE)
    shared = Path(tempfile.mkdtemp(prefix="entrypoint-log-"))  # an engine run as another user writes here too
    shared.chmod(0o755)
    log = shared / "log.txt"
    log.touch()
    log.chmod(0o666)

    def start(**env):
        full = {
            "PATH": os.environ["PATH"],
            "LOG": str(log),
            "ENGINE_MODEL": "org/weights",
            "ENGINE_CMD": f"{sys.executable} {fake} engine",
            "WORKER_CMD": f"{sys.executable} {fake} worker",
            "ENGINE_STOP_SECONDS": "2",
            "ENGINE_USER": "",
            **env,
        }
        process = subprocess.Popen(["bash", str(ENTRYPOINT)], env=full, stderr=subprocess.PIPE, text=True)
        deadline = time.monotonic() + 10
        while log.read_text().count(" env ") < 2 and process.poll() is None and time.monotonic() < deadline:
            time.sleep(0.02)
        return process

    def lines():
        return log.read_text().splitlines()

    return start, lines


def started_and_stopped(run, **env) -> tuple[str, str]:
    """Start the entrypoint with ``env``, stop it with SIGTERM (a clean exit): the engine's argv
    line and the worker's env line it logged."""
    start, lines = run
    p = start(**env)
    p.send_signal(signal.SIGTERM)
    assert p.wait(10) == 0
    logged = lines()
    return next(l for l in logged if l.startswith("engine argv")), next(l for l in logged if l.startswith("worker env"))


def test_the_engine_command_line_comes_from_the_environment(run):
    engine_argv, worker_env = started_and_stopped(
        run, WORKER_MODEL="my-model", ENGINE_PORT="8123", ENGINE_ARGS="--max-model-len 8192 --enforce-eager"
    )
    assert engine_argv.split()[2:] == [
        "org/weights",
        "--served-model-name",
        "my-model",
        "--host",
        "127.0.0.1",
        "--port",
        "8123",
        "--max-model-len",
        "8192",
        "--enforce-eager",
        "--max-num-seqs",
        "256",
        "--enable-prompt-tokens-details",
        "--scheduling-policy",
        "priority",
        "--disable-uvicorn-access-log",
    ]
    assert "WORKER_ENGINE_URL=http://127.0.0.1:8123" in worker_env
    assert "WORKER_ENGINE_MAX_NUM_SEQS=256" in worker_env and "WORKER_MODEL=my-model" in worker_env
    assert "WORKER_ENGINE_PRIORITY=true" in worker_env  # the worker orders the engine's queue


@pytest.mark.parametrize(
    ("args", "priority"), [("--scheduling-policy fcfs", "false"), ("--scheduling-policy=priority", "true")]
)
def test_a_scheduling_policy_in_engine_args_is_kept_and_the_worker_told(run, args, priority):
    engine_argv, worker_env = started_and_stopped(run, ENGINE_ARGS=args)
    assert engine_argv.count("--scheduling-policy") == 1 and args in engine_argv
    assert f"WORKER_ENGINE_PRIORITY={priority}" in worker_env


def test_the_access_log_is_off_unless_engine_args_name_it(run):
    engine_argv = started_and_stopped(run, ENGINE_ARGS="--no-disable-uvicorn-access-log")[0].split()
    assert "--no-disable-uvicorn-access-log" in engine_argv and "--disable-uvicorn-access-log" not in engine_argv


def test_max_num_seqs_in_engine_args_is_the_one_the_worker_gets(run):
    engine_argv, worker_env = started_and_stopped(run, ENGINE_ARGS="--max-num-seqs 64", ENGINE_MAX_NUM_SEQS="999")
    assert engine_argv.count("--max-num-seqs") == 1 and engine_argv.endswith(
        "--max-num-seqs 64 --enable-prompt-tokens-details --scheduling-policy priority --disable-uvicorn-access-log"
    )
    assert "WORKER_ENGINE_MAX_NUM_SEQS=64" in worker_env and "WORKER_MODEL=org/weights" in worker_env


def test_sigterm_drains_the_worker_before_stopping_the_engine(run):
    start, lines = run
    p = start(WORKER_DRAIN="0.5")
    p.send_signal(signal.SIGTERM)
    assert p.wait(10) == 0
    events = [l for l in lines() if l.split()[1] in ("TERM", "exit")]
    assert events == ["worker TERM", "worker exit", "engine TERM", "engine exit"]


def test_an_engine_that_ignores_sigterm_is_killed(run):
    start, _lines = run
    p = start(ENGINE_IGNORE_TERM="1", ENGINE_STOP_SECONDS="1")
    p.send_signal(signal.SIGTERM)
    assert p.wait(10) == 0
    assert "engine did not stop" in p.stderr.read()


def test_the_engine_dying_fails_the_task_and_stops_the_worker(run):
    start, lines = run
    p = start(ENGINE_EXIT_AFTER="0.3", ENGINE_EXIT_CODE="3")
    assert p.wait(10) == 3
    assert lines()[-2:] == ["worker TERM", "worker exit"]
    assert "the engine exited (3)" in p.stderr.read()


def test_the_engine_exiting_cleanly_still_fails_the_task(run):
    start, _ = run
    p = start(ENGINE_EXIT_AFTER="0.3", ENGINE_EXIT_CODE="0")
    assert p.wait(10) == 1


def test_the_worker_dying_fails_the_task_and_stops_the_engine(run):
    start, lines = run
    p = start(WORKER_EXIT_AFTER="0.3", WORKER_EXIT_CODE="5")
    assert p.wait(10) == 5
    assert lines()[-2:] == ["engine TERM", "engine exit"]


def test_engine_model_is_required(run, tmp_path):
    p = subprocess.run(["bash", str(ENTRYPOINT)], env={"PATH": os.environ["PATH"]}, capture_output=True, text=True)
    assert p.returncode != 0 and "ENGINE_MODEL" in p.stderr


#: A shell stand-in for the engine (any user can run bash; the test's Python may live where only
#: root can read): logs its uid and environment, exits on SIGTERM.
SHELL_ENGINE = r"""
echo "engine uid $(id -u)" >> "$LOG"
echo "engine env $(env | grep -E '^(AWS_|ECS_|WORKER_|BATCHAPI_)' | sort | tr '\n' ' ')" >> "$LOG"
trap 'exit 0' TERM
while true; do sleep 0.05; done
"""


def test_the_engine_gets_none_of_the_credentials_or_settings_and_runs_as_its_own_user(run):
    start, lines = run
    secret_env = {
        "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI": "/v2/credentials/abc",
        "AWS_REGION": "eu-west-1",
        "AWS_ACCESS_KEY_ID": "AKIAEXAMPLE",
        "ECS_CONTAINER_METADATA_URI_V4": "http://169.254.170.2/v4/x",
        "WORKER_CACHE_SALT_SECRET": "salt-secret",
        "BATCHAPI_TABLE_NAME": "t",
    }
    shared = Path(tempfile.mkdtemp(prefix="entrypoint-"))  # readable by the engine's user
    shared.chmod(0o755)
    (shared / "engine.sh").write_text(SHELL_ENGINE)
    user = "nobody" if os.getuid() == 0 else ""  # switching user needs root (the GPU task's entrypoint is root)
    p = start(**secret_env, ENGINE_USER=user, HF_HOME=str(shared / "hf"), ENGINE_CMD=f"bash {shared / 'engine.sh'}")
    p.send_signal(signal.SIGTERM)
    assert p.wait(10) == 0
    assert next(l for l in lines() if l.startswith("engine env")).strip() == "engine env"  # nothing of the above
    worker_env = next(l for l in lines() if l.startswith("worker env"))
    for name, value in secret_env.items():
        assert f"{name}={value}" in worker_env  # the worker keeps all of it
    if user:
        import pwd

        uid = pwd.getpwnam(user).pw_uid
        assert f"engine uid {uid}" in lines()
        assert (shared / "hf").stat().st_uid == uid  # its cache is its own to write


def test_the_local_engines_withhold_what_the_gpu_tasks_engine_withholds():
    from infra.local.processes import ENGINE_WITHHELD_PREFIXES, engine_environment

    line = next(l for l in ENTRYPOINT.read_text().splitlines() if l.startswith("ENGINE_WITHHELD_PREFIXES="))
    assert tuple(line.split("=", 1)[1].strip('"').split()) == ENGINE_WITHHELD_PREFIXES
    kept = engine_environment(
        {
            "AWS_SECRET_ACCESS_KEY": "x",
            "AWS_ENDPOINT_URL": "http://moto",
            "WORKER_CACHE_SALT_SECRET": "s",
            "BATCHAPI_TABLE_NAME": "t",
            "PATH": "/bin",
            "ENGINE_DTYPE": "float32",
            "HF_HUB_OFFLINE": "1",
        }
    )
    assert kept == {"PATH": "/bin", "ENGINE_DTYPE": "float32", "HF_HUB_OFFLINE": "1"}
    marked = engine_environment({"BATCHAPI_LOCAL_STATE_DIR": "/s", "BATCHAPI_TABLE_NAME": "t"})
    assert marked == {"LOCAL_BATCH_DEPLOYMENT": "/s"}  # only which deployment started it
