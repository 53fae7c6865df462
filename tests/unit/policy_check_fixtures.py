"""Pluggable output checks for tests/unit/test_policy_checks.py, in a module that imports next to
nothing (a check process imports it before its first job)."""

import json
import os
import time
from pathlib import Path

#: The environment variable naming the gate directory ``wait_for_gate`` waits on.
GATE = "POLICY_CHECKS_TEST_GATE"


def wait_for_gate(body):
    """Says it started (a file ``started-<pid>-<n>``), then waits until ``open`` exists."""
    gate = Path(os.environ[GATE])
    (gate / f"started-{os.getpid()}-{time.monotonic_ns()}").touch()
    while not (gate / "open").exists():
        time.sleep(0.01)


def loop_forever(body):
    while True:
        pass


def die(body):
    os._exit(3)


def block_word(body):
    return "it mentions forbidden" if "forbidden" in json.dumps(body) else None
