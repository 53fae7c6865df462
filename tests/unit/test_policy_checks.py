"""The bounded check pool (``gpu_worker.policy_checks.PolicyChecks``) with real check processes:
the same verdicts as the policy in this process; a check past its time limit is killed with its
process and gives ``policy_check_timeout`` and the pool goes on; an input over the size limit and a
process that dies have their own codes; a slow tenant's checks do not hold another tenant's; the
processes run at a lower priority; and the worker's heartbeats go on while a line is checked.

Slow checks here (tests/unit/policy_check_fixtures.py) block on a gate file rather than on time, so no verdict depends on how
fast this machine is: a test opens the gate when it has seen what it waits for."""

import asyncio
import os
import time
from pathlib import Path

import pytest

from functions.core.guard import (
    OUTPUT_BLOCKED,
    POLICY_CHECK_FAILED,
    POLICY_CHECK_INPUT_TOO_LARGE,
    POLICY_CHECK_TIMEOUT,
    PROMPT_SECRET_DETECTED,
    GuardPolicy,
)
from gpu_worker import policy_process
from gpu_worker.policy_checks import PolicyChecks, default_processes
from tests.fakes.engine import chat_answer
from tests.unit.policy_check_fixtures import GATE
from tests.unit.test_guard import SECRETS, chat_body
from tests.unit.test_worker_loop import Rig, seed

#: Upper bound for anything a test waits for; never reached when it passes.
PATIENCE = 60.0


def check(name: str) -> GuardPolicy:
    return GuardPolicy(output_checks=[f"tests.unit.policy_check_fixtures:{name}"])


def answer(text: str) -> dict:
    return chat_answer({"model": "test-chat", "messages": [{"role": "user", "content": text}]})


@pytest.fixture
def gate(tmp_path, monkeypatch):
    monkeypatch.setenv(GATE, str(tmp_path))  # the check processes inherit it
    return tmp_path


def started(gate: Path) -> int:
    return len(list(gate.glob("started-*")))


async def eventually(predicate, what: str) -> None:
    deadline = time.monotonic() + PATIENCE
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.01)


def test_the_pool_gives_the_verdicts_of_the_policy():
    secret = SECRETS["AWS access key id"][1]

    async def go():
        async with PolicyChecks(2) as checks:
            clean = chat_body("hello")
            assert await checks.check_prompt("a", GuardPolicy(prompt_secrets="refuse"), clean) == (clean, None)
            body, violation = await checks.check_prompt(
                "a", GuardPolicy(prompt_secrets="refuse"), chat_body(f"k {secret}")
            )
            assert violation.code == PROMPT_SECRET_DETECTED and secret not in violation.message
            body, violation = await checks.check_prompt(
                "a", GuardPolicy(prompt_secrets="redact"), chat_body(f"k {secret}")
            )
            assert violation is None and body["messages"][1]["content"] == "k [REDACTED:AWS Access Key]"
            deny = GuardPolicy(output_deny_patterns=["(?i)confidential"])
            assert (await checks.check_output("b", deny, answer("a CONFIDENTIAL plan"))).code == OUTPUT_BLOCKED
            assert await checks.check_output("b", deny, answer("a plan")) is None
            blocked = await checks.check_output("b", check("block_word"), answer("forbidden"))
            assert blocked.code == OUTPUT_BLOCKED and blocked.message.endswith("it mentions forbidden")
            missing = await checks.check_output("b", check("no_such_check"), answer("x"))
            assert missing.code == OUTPUT_BLOCKED and "could not run" in missing.message
            assert checks.running() >= 1
        assert checks.running() == 0  # closed with the pool

    asyncio.run(go())


def test_a_policy_without_checks_starts_no_process():
    async def go():
        async with PolicyChecks(2) as checks:
            body = chat_body("hi")
            assert await checks.check_prompt("a", GuardPolicy(output_deny_patterns=["x"]), body) == (body, None)
            assert await checks.check_output("a", GuardPolicy(prompt_secrets="refuse"), answer("x")) is None
            assert checks.running() == 0

    asyncio.run(go())


def test_a_check_past_its_time_limit_is_killed_with_its_process_and_the_pool_recovers():
    async def go():
        async with PolicyChecks(2, seconds=1.0) as checks:
            first = await checks.check_output("a", check("block_word"), answer("fine"))
            assert first is None
            pids = {s.proc.pid for s in checks._slots if s.proc is not None}
            violation = await checks.check_output("a", check("loop_forever"), answer("x"))
            assert violation.code == POLICY_CHECK_TIMEOUT and "within 1 s" in violation.message
            assert checks.timeouts == 1
            assert not any(
                s.proc is not None and s.proc.pid in pids and s.proc.returncode is None for s in checks._slots
            )
            # The next check runs in a new process.
            assert (await checks.check_output("a", check("block_word"), answer("forbidden"))).code == OUTPUT_BLOCKED

    asyncio.run(go())


def test_a_process_that_dies_fails_its_line_closed_and_the_next_check_runs():
    async def go():
        async with PolicyChecks(2) as checks:
            violation = await checks.check_output("a", check("die"), answer("x"))
            assert violation.code == POLICY_CHECK_FAILED and checks.failures == 1
            assert await checks.check_output("a", check("block_word"), answer("fine")) is None

    asyncio.run(go())


def test_an_input_over_the_size_limit_is_not_checked():
    async def go():
        async with PolicyChecks(2, max_input_bytes=1000) as checks:
            _, violation = await checks.check_prompt("a", GuardPolicy(prompt_secrets="refuse"), chat_body("x" * 2000))
            assert violation.code == POLICY_CHECK_INPUT_TOO_LARGE and "1000 bytes" in violation.message
            assert checks.running() == 0
            # Deny patterns read only the generated text: an answer's other fields do not count.
            big = {**answer("short"), "padding": "y" * 5000}
            assert await checks.check_output("a", GuardPolicy(output_deny_patterns=["z"]), big) is None

    asyncio.run(go())


def test_a_slow_tenant_does_not_hold_another_tenants_check(gate):
    """Tenant A's three checks block; with two processes A holds one, so B's check runs on the other
    at once and is answered while A's first is still blocked and its others still wait."""

    async def go():
        async with PolicyChecks(2) as checks:
            slow = [
                asyncio.create_task(checks.check_output("A", check("wait_for_gate"), answer(f"a{i}"))) for i in range(3)
            ]
            await eventually(lambda: started(gate) == 1, "A's first check started")
            assert await checks.check_output("B", check("block_word"), answer("forbidden")) is not None
            assert started(gate) == 1 and not any(t.done() for t in slow)  # A's others wait for its slot
            (gate / "open").touch()
            assert await asyncio.gather(*slow) == [None, None, None]
            assert started(gate) == 3

    asyncio.run(go())


def test_round_robin_across_tenants():
    """Queued jobs start one tenant at a time in turn: B's one job is not behind all of A's."""
    from gpu_worker.policy_checks import _Job, _Tenants

    async def go():
        tenants = _Tenants()
        loop = asyncio.get_running_loop()
        jobs = [_Job(t, b"", loop.create_future()) for t in ("A", "A", "A", "B", "C", "A")]
        for job in jobs:
            tenants.add(job)
        order = []
        while (job := tenants.next(cap=10)) is not None:
            order.append(job.tenant)
        assert order == ["A", "B", "C", "A", "A", "A"]
        # A tenant at its cap is passed over, not waited for.
        more = _Tenants()
        for job in [_Job("A", b"", loop.create_future()) for _ in range(2)] + [_Job("B", b"", loop.create_future())]:
            more.add(job)
        assert [more.next(cap=1).tenant, more.next(cap=1).tenant, more.next(cap=1)] == ["A", "B", None]
        more.finished("A")
        assert more.next(cap=1).tenant == "A"

    asyncio.run(go())


def test_the_check_processes_run_at_a_lower_priority(gate):
    async def go():
        async with PolicyChecks(2) as checks:
            task = asyncio.create_task(checks.check_output("A", check("wait_for_gate"), answer("x")))
            await eventually(lambda: started(gate) == 1, "the check started")
            (pid,) = {s.proc.pid for s in checks._slots if s.proc is not None}
            assert os.getpriority(os.PRIO_PROCESS, pid) == os.getpriority(os.PRIO_PROCESS, 0) + policy_process.NICE
            (gate / "open").touch()
            await task

    asyncio.run(go())


def test_the_pool_is_small_and_sized_for_the_machine():
    assert [default_processes(c) for c in (1, 2, 4, 8, 16, 96)] == [2, 2, 2, 4, 4, 4]


# --- the worker: its loop and heartbeats go on while a line is checked -----------------------------
def test_the_worker_heartbeats_while_a_line_is_being_checked(gate):
    rig = Rig(policy_check_processes=2)
    (message,) = seed(rig.stores, 2, per_chunk=2)
    message = message.model_copy(update={"guard": check("wait_for_gate")})
    rig.queue.send([message.model_dump_json()])

    async def beat(seconds):
        rig.sleeps.append(seconds)
        await asyncio.sleep(0.01)

    rig.worker._sleep = beat
    marks: dict[str, int] = {}

    def checked_and_beating() -> bool:
        if started(gate) < 1:
            return False
        marks.setdefault("extended", len(rig.queue.extended))
        if len(rig.queue.extended) < marks["extended"] + 5:
            return False  # the loop extends visibility while the check holds its line
        (gate / "open").touch()
        return bool(rig.queue.deleted)

    rig.run_until(checked_and_beating, "heartbeats during the check, then the chunk done")
    assert rig.counted(0) and rig.queue.releases == [] and rig.metrics.totals.chunks_redelivered == 0
    assert rig.worker.checks.running() == 0  # stopped with the worker
