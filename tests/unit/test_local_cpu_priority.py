"""The local deployment's CPU priority (docs/local.md, "CPU priority: the engines first"):
``Deployment.start`` starts the control plane's components at ``CONTROL_PLANE_NICE``, so every
thread and process they start runs there, and starts the components that start processes (the
engines, the workers, the supervisor) from its own thread, so the engines keep its priority; the
workers lower their own (``WORKER_NICE`` in their environment). Linux keeps a nice value per
thread; these tests read it from /proc."""

import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from infra.local.deployment import Deployment
from infra.local.processes import CONTROL_PLANE_NICE, LOCAL_WORKER_DEFAULTS, ChildProcess, Supervisor

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="a nice value per thread is Linux's")


def nice_of(tid: int) -> int:
    """The nice value of thread (or process) ``tid``, as the kernel reports it (/proc stat field 19)."""
    return int(Path(f"/proc/{tid}/stat").read_text().rsplit(")", 1)[1].split()[16])


def own_nice() -> int:
    return nice_of(threading.get_native_id())


class ThreadComponent:
    """A control-plane component: its start() starts a thread, which starts a process, as moto's
    server thread starts a thread per connection and a poller runs a Lambda."""

    name = "threads"

    def __init__(self) -> None:
        self.thread_nice: int | None = None
        self.process_nice: int | None = None
        self.starter_nice: int | None = None
        self._done = threading.Event()

    def start(self) -> None:
        self.starter_nice = own_nice()

        def run() -> None:
            self.thread_nice = own_nice()
            out = subprocess.run(
                [sys.executable, "-c", "import os; print(os.getpriority(os.PRIO_PROCESS, 0))"],
                capture_output=True,
                text=True,
                check=True,
            )
            self.process_nice = int(out.stdout)
            self._done.set()

        threading.Thread(target=run).start()
        assert self._done.wait(30)

    def stop(self) -> None:
        pass


class Failing:
    name = "failing"

    def start(self) -> None:
        raise RuntimeError("port in use")

    def stop(self) -> None:  # pragma: no cover - never started
        raise AssertionError("a component that failed to start is not stopped")


class Stopped:
    name = "stopped"

    def __init__(self) -> None:
        self.stopped = False

    def start(self) -> None:
        pass

    def stop(self) -> None:
        self.stopped = True


def test_the_control_plane_its_threads_and_their_processes_run_at_the_control_plane_nice():
    base = own_nice()
    component = ThreadComponent()
    deployment = Deployment([component])
    deployment.start()
    try:
        expected = max(base, CONTROL_PLANE_NICE)
        assert (component.starter_nice, component.thread_nice, component.process_nice) == (expected,) * 3
        assert own_nice() == base  # the caller's own thread keeps its priority
    finally:
        deployment.stop()


def test_a_caller_at_a_higher_nice_value_keeps_it_for_the_control_plane():
    """``make up`` started under ``nice -n 5``: a control-plane nice of 2 would give the engines'
    cores back to the control plane; its threads keep the caller's 5."""
    component = ThreadComponent()
    callers: list[int] = []

    def caller() -> None:
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), max(5, own_nice()))
        callers.append(own_nice())
        deployment = Deployment([component], control_plane_nice=2)
        deployment.start()
        deployment.stop()

    thread = threading.Thread(target=caller)
    thread.start()
    thread.join()
    assert callers and component.thread_nice == component.process_nice == callers[0] >= 5


def test_the_supervisors_watch_thread_and_its_engine_keep_the_callers_priority(tmp_path):
    """The engines are started by ``Engines`` on the caller's thread and restarted by the
    supervisor's watch thread: both keep the caller's priority."""
    base = own_nice()
    child = ChildProcess("engine-x", [sys.executable, "-c", "import time; time.sleep(60)"], dict, tmp_path / "x.log")
    child.start()
    deployment = Deployment([Supervisor([child], tmp_path / "supervisor.log")])
    deployment.start()
    try:
        (watch,) = [t for t in threading.enumerate() if t.name == "supervisor"]
        assert watch.native_id is not None and nice_of(watch.native_id) == base
        assert child.pid is not None and nice_of(child.pid) == base
    finally:
        deployment.stop()
        child.stop()


def test_a_component_that_fails_to_start_fails_the_start_and_stops_those_started():
    first = Stopped()
    with pytest.raises(RuntimeError, match="port in use"):
        Deployment([first, Failing()]).start()
    assert first.stopped


def test_the_local_workers_lower_their_own_priority_to_the_control_planes():
    assert LOCAL_WORKER_DEFAULTS["WORKER_NICE"] == str(CONTROL_PLANE_NICE)
