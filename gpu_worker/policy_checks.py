"""Bounded policy checks: every per-line check of a tenant's ``GuardPolicy`` (the prompt's secret
scan and redaction, deny patterns and output checks on a result) runs in a small pool of separate
processes (``policy_process``), never on the worker's event loop. Python's ``re`` holds the GIL, so
a thread would not keep the loop (and the heartbeats of every open chunk) running; a process also
can be killed.

Bounds (docs/governance.md, "Bounds on the checks"):

- **Time**: a check may run ``seconds`` (``limits.POLICY_CHECK_SECONDS``); past that its process is
  killed (replaced at the next job) and the line is an error line ``policy_check_timeout``.
- **Size**: a check's input over ``max_input_bytes`` (``limits.POLICY_CHECK_MAX_INPUT_BYTES``, the
  JSON handed to the process) is an error line ``policy_check_input_too_large``, not checked.
- **A process that dies** (out of memory, killed) fails its line closed: ``policy_check_failed``.
- **Fair share**: jobs wait in one queue per tenant and are started round-robin across tenants, at
  most ``processes`` at once; one tenant holds at most ``processes - reserve`` of them, so another
  tenant's check never waits behind a slow tenant's checks for more than the one slot it takes
  when one frees (with ``reserve`` 1 and two processes or more, not at all).
- **Priority**: the processes run ``policy_process.NICE`` below the worker (and the engine).

The processes start at the first check (a deployment without policies runs none) and are stopped
with the worker (``close``). ``InProcessChecks`` runs the same checks in the caller's thread, for
tests and tools that have no loop to protect.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import sys
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from functions.core import limits
from functions.core.guard import (
    POLICY_CHECK_FAILED,
    POLICY_CHECK_INPUT_TOO_LARGE,
    POLICY_CHECK_TIMEOUT,
    GuardPolicy,
    Violation,
    generated_texts,
)

from . import policy_process

log = logging.getLogger("gpu_worker.policy_checks")

#: The command of one check process.
COMMAND: tuple[str, ...] = (sys.executable, "-m", "gpu_worker.policy_process")
#: How long a new process may take to import and build its detectors before its job fails closed.
START_SECONDS = 120.0


def default_processes(cpus: int | None = None) -> int:
    """The pool's size on a machine of ``cpus`` cores: two, up to four on larger machines (the
    checks are a small share of a line's work; the engine has the cores)."""
    return max(2, min(4, (cpus or os.cpu_count() or 2) // 2))


@dataclass(frozen=True)
class LineChecks:
    """The checks of one tenant's policy, as ``run_line`` calls them."""

    checks: Checks
    tenant: str
    policy: GuardPolicy

    async def check_prompt(self, body: Any) -> tuple[Any, Violation | None]:
        return await self.checks.check_prompt(self.tenant, self.policy, body)

    async def check_output(self, body: Any) -> Violation | None:
        return await self.checks.check_output(self.tenant, self.policy, body)


class Checks:
    """What runs a tenant's checks: ``check_prompt`` (the body to send, or a violation) and
    ``check_output`` (None, or a violation)."""

    def bind(self, tenant: str, policy: GuardPolicy | None) -> LineChecks | None:
        """The checks of ``policy`` for ``tenant``'s lines; None without a policy."""
        return LineChecks(self, tenant, policy) if policy is not None else None

    async def check_prompt(self, tenant: str, policy: GuardPolicy, body: Any) -> tuple[Any, Violation | None]:
        raise NotImplementedError

    async def check_output(self, tenant: str, policy: GuardPolicy, body: Any) -> Violation | None:
        raise NotImplementedError


class InProcessChecks(Checks):
    """The checks run in the caller's thread (tests, tools): no bounds."""

    async def check_prompt(self, tenant: str, policy: GuardPolicy, body: Any) -> tuple[Any, Violation | None]:
        return policy.check_prompt(body)

    async def check_output(self, tenant: str, policy: GuardPolicy, body: Any) -> Violation | None:
        return policy.check_output(body)


IN_PROCESS = InProcessChecks()


@dataclass
class _Job:
    tenant: str
    payload: bytes
    done: asyncio.Future[dict[str, Any]]
    #: The pluggable checks the job calls (imported by the process before the job's time starts).
    checks: tuple[str, ...] = ()


@dataclass
class _Process:
    """One slot of the pool: its process, started at its first job and after each kill."""

    command: Sequence[str]
    proc: asyncio.subprocess.Process | None = None
    busy: bool = False
    #: The pluggable checks this process has imported.
    imported: set[str] = field(default_factory=set)

    async def ready(self, checks: Sequence[str] = ()) -> asyncio.subprocess.Process:
        """The process, started if need be, with ``checks`` imported (not part of a job's time)."""
        if self.proc is None or self.proc.returncode is not None:
            self.imported = set()
            self.proc = await asyncio.create_subprocess_exec(
                *self.command, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE
            )
            try:
                first = await asyncio.wait_for(_read(self.proc), START_SECONDS)
            except BaseException:
                await self.kill()
                raise
            if first != policy_process.READY:
                await self.kill()
                raise RuntimeError(f"a policy check process did not start (said {first!r})")
        if missing := [name for name in checks if name not in self.imported]:
            await asyncio.wait_for(self.call(policy_process.frame({"op": "import", "checks": missing})), START_SECONDS)
            self.imported.update(missing)
        return self.proc

    async def call(self, payload: bytes) -> dict[str, Any]:
        proc = self.proc
        assert proc is not None and proc.stdin is not None
        proc.stdin.write(payload)
        await proc.stdin.drain()
        answer = await _read(proc)
        if not isinstance(answer, dict):
            raise EOFError("the policy check process ended")
        return answer

    async def kill(self) -> None:
        proc, self.proc = self.proc, None
        if proc is not None and proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            await proc.wait()


async def _read(proc: asyncio.subprocess.Process) -> Any:
    assert proc.stdout is not None
    try:
        header = await proc.stdout.readexactly(policy_process.HEADER.size)
        (size,) = policy_process.HEADER.unpack(header)
        return json.loads(await proc.stdout.readexactly(size))
    except asyncio.IncompleteReadError:
        return None


@dataclass
class _Tenants:
    """Jobs waiting, by tenant, and the round-robin order of the tenants that have some."""

    waiting: dict[str, deque[_Job]] = field(default_factory=dict)
    running: dict[str, int] = field(default_factory=dict)
    order: deque[str] = field(default_factory=deque)

    def add(self, job: _Job) -> None:
        queue = self.waiting.setdefault(job.tenant, deque())
        if not queue:
            self.order.append(job.tenant)
        queue.append(job)

    def next(self, cap: int) -> _Job | None:
        """The next job in round-robin order from a tenant running fewer than ``cap``."""
        for _ in range(len(self.order)):
            tenant = self.order.popleft()
            queue = self.waiting[tenant]
            while queue and queue[0].done.done():
                queue.popleft()  # its caller went away (cancelled)
            if not queue:
                del self.waiting[tenant]
                continue
            if self.running.get(tenant, 0) >= cap:
                self.order.append(tenant)
                continue
            job = queue.popleft()
            if queue:
                self.order.append(tenant)
            else:
                del self.waiting[tenant]
            self.running[tenant] = self.running.get(tenant, 0) + 1
            return job
        return None

    def finished(self, tenant: str) -> None:
        self.running[tenant] -= 1
        if not self.running[tenant]:
            del self.running[tenant]


class PolicyChecks(Checks):
    """The pool (module docstring). Use as ``async with PolicyChecks(...) as checks`` or call
    ``close`` when done."""

    def __init__(
        self,
        processes: int = 0,
        *,
        seconds: float = limits.POLICY_CHECK_SECONDS,
        max_input_bytes: int = limits.POLICY_CHECK_MAX_INPUT_BYTES,
        reserve: int = 1,
        command: Sequence[str] = COMMAND,
    ):
        self.processes = processes or default_processes()
        self.seconds, self.max_input_bytes = seconds, max_input_bytes
        #: The most processes one tenant's jobs hold at once.
        self.per_tenant = max(1, self.processes - reserve)
        self._slots = [_Process(command) for _ in range(self.processes)]
        self._tenants = _Tenants()
        self._tasks: set[asyncio.Task[None]] = set()
        self._closed = False
        #: Checks that ran past the time limit, and processes that died (for logs and tests).
        self.timeouts = 0
        self.failures = 0

    async def __aenter__(self) -> PolicyChecks:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def check_prompt(self, tenant: str, policy: GuardPolicy, body: Any) -> tuple[Any, Violation | None]:
        if policy.prompt_secrets == "off":
            return body, None
        answer = await self._run(tenant, "prompt", policy, body, "request was not sent")
        if isinstance(answer, Violation):
            return body, answer
        return answer.get("body", body), _violation(answer)

    async def check_output(self, tenant: str, policy: GuardPolicy, body: Any) -> Violation | None:
        if not policy.output_deny_patterns and not policy.output_checks:
            return None
        if not policy.output_checks:  # deny patterns only read the generated text: hand over only that
            body = {"content": list(generated_texts(body))}
        answer = await self._run(tenant, "output", policy, body, "result was not written")
        return answer if isinstance(answer, Violation) else _violation(answer)

    async def _run(
        self, tenant: str, op: str, policy: GuardPolicy, body: Any, outcome: str
    ) -> dict[str, Any] | Violation:
        data = json.dumps({"op": op, "policy": policy.model_dump(), "body": body}, separators=(",", ":")).encode()
        if len(data) > self.max_input_bytes:
            return Violation(
                POLICY_CHECK_INPUT_TOO_LARGE,
                f"The {_what(op)} is larger than this organization's "
                f"policy checks take ({self.max_input_bytes} bytes); the {outcome}.",
            )
        if self._closed:
            return Violation(POLICY_CHECK_FAILED, f"The {_what(op)}'s policy check could not run; the {outcome}.")
        job = _Job(
            tenant,
            policy_process.HEADER.pack(len(data)) + data,
            asyncio.get_running_loop().create_future(),
            tuple(policy.output_checks) if op == "output" else (),
        )
        self._tenants.add(job)
        self._dispatch()
        answer = await job.done
        if answer.get("timeout"):
            return Violation(
                POLICY_CHECK_TIMEOUT,
                f"The {_what(op)}'s policy check did not finish within {self.seconds:g} s; the {outcome}.",
            )
        if "error" in answer:
            return Violation(
                POLICY_CHECK_FAILED, f"The {_what(op)}'s policy check could not run ({answer['error']}); the {outcome}."
            )
        return answer

    def _dispatch(self) -> None:
        for slot in self._slots:
            if slot.busy:
                continue
            job = self._tenants.next(self.per_tenant)
            if job is None:
                return
            slot.busy = True
            task = asyncio.ensure_future(self._execute(slot, job))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _execute(self, slot: _Process, job: _Job) -> None:
        try:
            try:
                await slot.ready(job.checks)  # a new process's start is not the job's time
                answer = await asyncio.wait_for(slot.call(job.payload), self.seconds)
            except TimeoutError:
                self.timeouts += 1
                log.warning(
                    "a policy check ran past %s s: its process is replaced", self.seconds, extra={"tenant": job.tenant}
                )
                await slot.kill()
                answer = {"timeout": True}
            except asyncio.CancelledError:  # close(): the worker stops
                if not job.done.done():
                    job.done.set_result({"error": "the worker is stopping"})
                await slot.kill()
                raise
            except Exception as exc:  # noqa: BLE001 - the process died or could not start: fail closed
                self.failures += 1
                log.warning("a policy check process failed: %r", exc, extra={"tenant": job.tenant})
                await slot.kill()
                answer = {
                    "error": "the check process ended" if isinstance(exc, EOFError | OSError) else type(exc).__name__
                }
            if not job.done.done():
                job.done.set_result(answer)
        finally:
            slot.busy = False
            self._tenants.finished(job.tenant)
            if not self._closed:
                self._dispatch()

    async def close(self) -> None:
        """Stop every process; waiting and running checks fail closed."""
        self._closed = True
        for queue in self._tenants.waiting.values():
            for job in queue:
                if not job.done.done():
                    job.done.set_result({"error": "the worker is stopping"})
        self._tenants.waiting.clear()
        self._tenants.order.clear()
        for task in list(self._tasks):
            task.cancel()
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
        for slot in self._slots:
            await slot.kill()

    def running(self) -> int:
        """Processes alive (for tests)."""
        return sum(1 for s in self._slots if s.proc is not None and s.proc.returncode is None)


def _what(op: str) -> str:
    return "request" if op == "prompt" else "result"


def _violation(answer: dict[str, Any]) -> Violation | None:
    found = answer.get("violation")
    return Violation(found[0], found[1]) if found else None
