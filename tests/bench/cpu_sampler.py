"""CPU time of the processes beside the engine, sampled from ``/proc`` (for ``bench_pipeline``): who
else runs on the engine's cores while it works. Every ``every`` seconds a background thread reads
each process's user + system time (``/proc/<pid>/stat``, fields 14 and 15, in clock ticks) and
names it by its command line (``label``); ``between(start, end)`` is the CPU seconds each name used
in that window (monotonic times of this process, as the proxy and run-batch's timer keep them),
from the samples nearest to its ends. Linux only; on a machine without ``/proc`` it reports nothing.
"""

from __future__ import annotations

import bisect
import os
import threading
import time
from collections import Counter

ENGINE = "engine (vLLM EngineCore + its worker)"
API_SERVER = "vLLM API server (pipeline)"
#: (what the command line contains, the name it is reported under); first match wins.
LABELS = (
    ("VLLM::", ENGINE),
    ("vllm serve", API_SERVER),
    ("vllm run-batch", "run-batch front end"),
    ("tests.bench.pipeline_local", "local AWS (moto, API front, Lambdas, sweepers)"),
    ("-m gpu_worker", "our worker"),
    ("tests.bench.bench_pipeline", "bench (proxy, client, webhook receiver)"),
)
OTHER = "other"


def label(cmdline: str) -> str:
    for needle, name in LABELS:
        if needle in cmdline:
            return name
    return OTHER


class CpuSampler:
    def __init__(self, every: float = 0.25) -> None:
        self.every = every
        self._tick = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
        self._times: list[float] = []
        self._samples: list[dict[int, tuple[str, float]]] = []
        self._names: dict[int, str] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="cpu-sampler", daemon=True)

    def __enter__(self) -> CpuSampler:
        if os.path.isdir("/proc"):
            self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(5)

    def _read(self) -> dict[int, tuple[str, float]]:
        out: dict[int, tuple[str, float]] = {}
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            pid = int(entry)
            try:
                with open(f"/proc/{pid}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
                if self._names.get(pid, OTHER) == OTHER:  # vLLM renames its processes after they start
                    with open(f"/proc/{pid}/cmdline", "rb") as f:
                        self._names[pid] = label(f.read().replace(b"\0", b" ").decode(errors="replace"))
            except OSError:
                continue  # gone
            out[pid] = (self._names[pid], (int(fields[11]) + int(fields[12])) / self._tick)
        return out

    def _run(self) -> None:
        while not self._stop.is_set():
            at, sample = time.monotonic(), self._read()
            self._times.append(at)
            self._samples.append(sample)
            self._stop.wait(self.every)

    def between(self, start: float, end: float, pids: set[int] | None = None) -> dict[str, float]:
        """CPU seconds by name in [start, end] (a process born or gone inside counts from 0 / to its
        last sample); ``pids``: only those processes."""
        if len(self._times) < 2:
            return {}
        i = max(0, bisect.bisect_right(self._times, start) - 1)
        j = min(len(self._times) - 1, bisect.bisect_left(self._times, end))
        first, last = self._samples[i], self._samples[j]
        if pids is not None:
            first = {pid: v for pid, v in first.items() if pid in pids}
            last = {pid: v for pid, v in last.items() if pid in pids}
        used: Counter[str] = Counter()
        for pid, (name, cpu) in last.items():
            used[name] += cpu - first.get(pid, (name, 0.0))[1]
        for pid, (name, cpu) in first.items():  # ended inside the window: up to its last sample
            if pid not in last:
                final = next((s[pid][1] for s in reversed(self._samples[i : j + 1]) if pid in s), cpu)
                used[name] += final - cpu
        return {name: round(seconds, 2) for name, seconds in used.most_common() if seconds > 0}
