"""The local deployment's supervisor (infra/local/processes.py) with stand-in processes instead of
vLLM and the worker: a child killed with SIGKILL is restarted after 1 s, doubling to 30 s while it
keeps dying, back to 1 s once it had run a minute; the other children are left alone; what is left
of a dead child's process group is killed before the restart; stopping leaves nothing running.
Time is a fake clock; the supervisor's waits are injected."""

import os
import signal
import sys
import time
from pathlib import Path

import pytest

from infra.local.processes import Backoff, ChildProcess, Restart, Supervisor

SLEEPER = [sys.executable, "-c", "import time; time.sleep(60)"]


def with_grandchild(ready: Path) -> list[str]:
    """A leader whose grandchild (as vLLM's engine-core process) lives on in its process group if
    the leader alone is killed; the grandchild creates ``ready`` once running."""
    grandchild = f"import time, pathlib; pathlib.Path({str(ready)!r}).touch(); time.sleep(60)"
    return ["bash", "-c", f'{sys.executable} -c "{grandchild}" & wait']


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def group_exists(pgid: int) -> bool:
    """True while a process of group ``pgid`` runs (zombies, not yet reaped by init, do not count)."""
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if fields[0] != "Z" and int(fields[2]) == pgid:
            return True
    return False


def gone(pgid: int) -> bool:
    """True once no process of group ``pgid`` runs: SIGKILL is delivered asynchronously, so a
    process killed a moment ago may still be running (waits at most ~5 s)."""
    for _ in range(250):
        if not group_exists(pgid):
            return True
        time.sleep(0.02)
    return False


def kill(child: ChildProcess) -> int:
    """SIGKILL the child's process group; returns once the leader has exited (not reaped: the
    supervisor must notice it)."""
    pid = child.pid
    assert pid is not None
    os.killpg(pid, signal.SIGKILL)
    os.waitid(os.P_PID, pid, os.WEXITED | os.WNOWAIT)
    return pid


@pytest.fixture
def children(tmp_path: Path):
    made = [
        ChildProcess("engine-m", SLEEPER, lambda: os.environ, tmp_path / "engine-m.log"),
        ChildProcess("worker-m", SLEEPER, lambda: os.environ, tmp_path / "worker-m.log"),
    ]
    for child in made:
        child.start()
    yield made
    for child in made:
        child.stop(timeout=5)


def test_backoff_doubles_to_thirty_seconds_and_resets_after_a_minute():
    b = Backoff()
    delays, previous = [], None
    for _ in range(8):
        previous = b.delay(previous, ran_for=0.1)
        delays.append(previous)
    assert delays == [1, 2, 4, 8, 16, 30, 30, 30]
    assert b.delay(30, ran_for=59.9) == 30
    assert b.delay(30, ran_for=60) == 1


def test_a_killed_child_is_restarted_with_backoff_and_the_others_are_left_alone(children, tmp_path):
    engine, worker = children
    clock = Clock()
    sup = Supervisor(children, tmp_path / "supervisor.log", clock=clock)
    sup.watch()
    worker_pid = worker.pid

    delays = []
    for expected in (1, 2, 4, 8, 16, 30, 30):
        old = kill(engine)
        sup.step()
        assert sup.restarts[-1] == Restart("engine-m", -signal.SIGKILL, expected)
        delays.append(sup.restarts[-1].delay)
        clock.now += expected - 0.01
        sup.step()
        assert not engine.alive()  # not before its delay
        clock.now += 0.01
        sup.step()
        assert engine.alive() and engine.pid != old
        clock.now += 0.5  # dies again soon after its restart
    assert delays == [1, 2, 4, 8, 16, 30, 30]

    clock.now += 60  # ran a minute: the next death starts again from 1 s
    kill(engine)
    sup.step()
    assert sup.restarts[-1] == Restart("engine-m", -signal.SIGKILL, 1)

    assert worker.pid == worker_pid and worker.alive()  # the worker was never touched
    assert [r.name for r in sup.restarts] == ["engine-m"] * 8

    logged = (tmp_path / "supervisor.log").read_text()
    assert logged.count("engine-m exited (killed by SIGKILL): restarting in 1 s") == 2
    assert "restarting in 30 s" in logged and "engine-m restarted (pid" in logged
    assert "supervisor: engine-m exited" in (tmp_path / "engine-m.log").read_text()


def test_the_watch_loop_restarts_a_dead_child_after_its_delay(children, tmp_path):
    engine, _ = children
    clock, waits = Clock(), []
    first = kill(engine)

    def wait(seconds: float) -> bool:  # the supervisor's sleep: advances the fake clock
        waits.append(seconds)
        clock.now += seconds
        return engine.pid != first  # stop once restarted

    sup = Supervisor(children, tmp_path / "supervisor.log", clock=clock, wait=wait, poll_seconds=0.5)
    sup.watch()
    sup.run()
    assert sup.restarts == [Restart("engine-m", -signal.SIGKILL, 1)]
    assert waits == [0.5, 0.5, 0.5]  # noticed at once, restarted 1 s later
    assert engine.alive()


def start_leaving_a_grandchild(tmp_path: Path) -> ChildProcess:
    """A child whose leader is SIGKILLed alone once its grandchild runs: the group lives on."""
    ready = tmp_path / "grandchild-running"
    child = ChildProcess("engine-m", with_grandchild(ready), lambda: os.environ, tmp_path / "engine-m.log")
    child.start()
    for _ in range(500):  # until the grandchild runs (at most ~10 s)
        if ready.exists():
            break
        time.sleep(0.02)
    assert ready.exists()
    leader = child.pid
    os.kill(leader, signal.SIGKILL)
    os.waitid(os.P_PID, leader, os.WEXITED | os.WNOWAIT)
    assert group_exists(leader)
    return child


def test_what_is_left_of_a_dead_childs_group_is_killed_before_the_restart(tmp_path):
    child = start_leaving_a_grandchild(tmp_path)
    leader = child.pid
    try:
        sup = Supervisor([child], tmp_path / "supervisor.log", clock=Clock())
        sup.watch()
        sup.step()
        assert gone(leader)
    finally:
        child.stop(timeout=5)


def test_stopping_a_child_whose_leader_died_kills_the_rest_of_its_group(tmp_path):
    child = start_leaving_a_grandchild(tmp_path)
    leader = child.pid
    child.stop(timeout=5)
    assert gone(leader)


def test_stopping_leaves_nothing_running_and_restarts_nothing(children, tmp_path):
    sup = Supervisor(children, tmp_path / "supervisor.log", poll_seconds=0.01)
    sup.start()
    sup.stop()  # as the deployment does: the supervisor first, then the workers and engines
    pids = [c.pid for c in children]
    for child in children:
        child.stop(timeout=5)
    assert all(gone(p) for p in pids)
    sup.step()  # a stopped supervisor starts nothing again
    assert not any(c.alive() for c in children) and sup.restarts == []


def test_a_child_that_cannot_start_is_tried_again_with_backoff(tmp_path):
    missing = ChildProcess("worker-m", [str(tmp_path / "no-such-command")], lambda: os.environ, tmp_path / "w.log")
    clock = Clock()
    sup = Supervisor([missing], tmp_path / "supervisor.log", clock=clock)
    sup.watch()
    sup.step()  # never ran: restart in 1 s
    for expected in (2, 4):
        clock.now += sup.restarts[-1].delay
        sup.step()  # the start fails (no such file): the supervisor goes on, waits longer
        assert sup.restarts[-1] == Restart("worker-m", None, expected)
    assert "worker-m could not start" in (tmp_path / "supervisor.log").read_text()
    missing.stop()
