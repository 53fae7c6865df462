"""``python -m gpu_worker.policy_process``: one check process of ``policy_checks.PolicyChecks``.

It lowers its own CPU priority (``os.nice``: the engine and the worker's event loop go first),
builds the detectors once, says it is ready, then answers one job at a time on its standard input
and output. A frame is a 4-byte big-endian length and that many bytes of JSON:

- job: ``{"op": "prompt" | "output", "policy": <GuardPolicy>, "body": <JSON>}``, or
  ``{"op": "import", "checks": [names]}`` (import pluggable checks before a job uses them: their
  import is not a job's time; one that does not import fails the job that calls it)
- answer: ``{"violation": [code, message] | null, "body": <the body to send>}`` (``body`` only when
  a prompt's body changed: redacted), or ``{"error": "<exception type>"}`` when the check itself
  failed (the parent fails the line closed).

The process holds no state between jobs but caches, so killing it at any moment (a job past its
time limit) loses nothing. Its standard output carries only frames: anything a pluggable check
prints goes to standard error.
"""

from __future__ import annotations

import json
import os
import struct
import sys
from functools import lru_cache
from typing import IO, Any

from functions.core import guard, secret_scan

#: The frame header: the payload's length.
HEADER = struct.Struct(">I")
#: The first frame a process writes, once it can take jobs.
READY = {"ready": True}
#: How much lower than the worker the check processes run (``os.nice`` increment).
NICE = 10


def read_frame(stream: IO[bytes]) -> Any | None:
    """The next frame's JSON, or None at the end of the stream."""
    header = stream.read(HEADER.size)
    if len(header) < HEADER.size:
        return None
    (size,) = HEADER.unpack(header)
    data = stream.read(size)
    if len(data) < size:
        return None
    return json.loads(data)


def frame(value: Any) -> bytes:
    data = json.dumps(value, separators=(",", ":")).encode()
    return HEADER.pack(len(data)) + data


@lru_cache(maxsize=64)
def _policy(data: str) -> guard.GuardPolicy:
    return guard.GuardPolicy.model_validate_json(data)


def answer(job: dict[str, Any]) -> dict[str, Any]:
    """What a job's check says (the module docstring's answer)."""
    if job.get("op") == "import":
        for name in job["checks"]:
            try:
                guard.resolve_check(name)
            except Exception:  # noqa: BLE001 - the job calling it fails closed (guard.check_output)
                pass
        return {"violation": None}
    try:
        policy = _policy(json.dumps(job["policy"], sort_keys=True))
        body = job["body"]
        if job["op"] == "prompt":
            checked, violation = policy.check_prompt(body)
            out: dict[str, Any] = {"violation": [violation.code, violation.message] if violation else None}
            if violation is None and checked is not body:
                out["body"] = checked
            return out
        violation = policy.check_output(body)
        return {"violation": [violation.code, violation.message] if violation else None}
    except Exception as exc:  # noqa: BLE001 - fail closed in the parent, never die on one job
        return {"error": type(exc).__name__}


def warm_up() -> None:
    """Load what every job needs before saying ready, so a job's time is its own."""
    secret_scan.find_secrets("warm up")
    secret_scan.normalize("warm up \u200b")
    guard.parse_pattern("warm up")


def serve(source: IO[bytes], sink: IO[bytes]) -> None:
    sink.write(frame(READY))
    sink.flush()
    while (job := read_frame(source)) is not None:
        sink.write(frame(answer(job)))
        sink.flush()


def main() -> int:
    os.nice(NICE)
    # Frames go to the original standard output; a check's print() goes to standard error.
    sink = os.fdopen(os.dup(sys.stdout.fileno()), "wb")
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())
    warm_up()
    serve(sys.stdin.buffer, sink)
    return 0


if __name__ == "__main__":
    sys.exit(main())
