"""The bench's CPU sampler (tests/bench/cpu_sampler.py): processes named by their command line, and
the CPU a process burns inside a window is counted in that window only."""

import os
import time

import pytest

from tests.bench import cpu_sampler
from tests.bench.cpu_sampler import CpuSampler, label


def test_processes_are_named_by_their_command_line():
    assert label("VLLM::EngineCore") == cpu_sampler.ENGINE
    assert label("/x/.venv-engine/bin/python /x/bin/vllm serve /m --port 1") == "vLLM API server (pipeline)"
    assert label("/x/bin/python /x/bin/vllm run-batch -i a -o b") == "run-batch front end"
    assert label("/x/python -m gpu_worker ") == "our worker"
    assert label("python -m tests.bench.pipeline_local --engine-port 1").startswith("local AWS")
    assert label("bash") == cpu_sampler.OTHER


@pytest.mark.skipif(not cpu_sampler.os.path.isdir("/proc"), reason="needs /proc (Linux)")
def test_cpu_burnt_inside_a_window_counts_there_and_not_outside():
    with CpuSampler(every=0.05) as sampler:
        time.sleep(0.3)
        idle = (time.monotonic(), None)
        time.sleep(0.4)
        busy_start, spun = time.monotonic(), time.process_time()
        while time.process_time() - spun < 0.5:  # half a second of this process's CPU, however long it takes
            pass
        busy_end = time.monotonic()
        time.sleep(0.2)
    me = {os.getpid()}  # not the rest of the machine (another test process may be busy)
    quiet = sampler.between(idle[0], busy_start - 0.1, pids=me).get(cpu_sampler.OTHER, 0.0)
    burnt = sampler.between(busy_start, busy_end, pids=me).get(cpu_sampler.OTHER, 0.0)
    assert burnt >= 0.2  # this process burnt 0.5 s of CPU in the window (sampled every 0.05 s)
    assert quiet < burnt / 2
