"""The engine's measured capacity (docs/worker.md, "Concurrency: the global in-flight cap"): how
many lines the worker lets into the engine follows what the engine actually runs, not only its
``--max-num-seqs``.

vLLM runs at most ``max_num_seqs`` sequences, and fewer when its KV cache cannot hold them (long
prompts, long outputs: it then keeps the rest waiting, and preempts running ones when it runs
out). Lines waiting *inside* vLLM start in its first-come order; lines waiting in the worker start
in the worker's order (``admission.Admission``: longest first, shared prefixes together, fair across
tenants). So the worker keeps vLLM's waiting queue short but never empty: it reads vLLM's own
gauges from its Prometheus text (``vllm:num_requests_running``, ``vllm:num_requests_waiting``,
``vllm:kv_cache_usage_perc``, ``vllm:num_preemptions``; only those samples, ``SAMPLES``) about once
a second, while lines wait in the worker (otherwise the capacity decides nothing). While vLLM keeps
lines waiting although it runs fewer than ``max_num_seqs`` *because it cannot fit more* (its KV
cache is at least ``KV_FULL`` used, or it preempted since the last read; lines merely waiting
for their prefill, as every line does when a batch starts, are not that), the admission
capacity is what runs plus a headroom
(``WorkerConfig.admission_cap() - max_num_seqs``: a quarter of ``max_num_seqs`` in smart order,
enough to fill the slots that free up between two reads; ``max_num_seqs`` in file order), within
``[headroom, cap]``; otherwise (nothing waits, or every sequence slot is taken) it is the
configured cap, so a worker starts at full speed and an engine with room is never held back. An
engine without ``/metrics`` (or an answer that cannot be read) keeps the configured cap.
"""

from __future__ import annotations

import asyncio
import logging
import math
import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

log = logging.getLogger("gpu_worker.capacity")

#: How often the engine's gauges are read.
READ_SECONDS = 1.0
#: The KV cache use (0-1) at which lines waiting in vLLM are lines it cannot fit.
KV_FULL = 0.9
#: With the capacity at the cap and no preemption since the read before, the engine is calm when its
#: KV cache use, grown for ``CALM_READS`` periods at the rate it grew since the read before, stays
#: below ``KV_FULL``: the next read then waits ``CALM_READS`` x longer (each read is CPU of vLLM's
#: API server, ``SAMPLES``). A first read, with no rate yet, is calm below ``KV_CALM``.
KV_CALM = KV_FULL / 2
CALM_READS = 4
_SAMPLE = re.compile(r"^(vllm:[a-z_]+?)(?:_total)?(?:\{[^}]*\})?\s+([-+0-9.eE]+|NaN)\s*$")
WANTED = ("vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:num_preemptions", "vllm:kv_cache_usage_perc")
#: The samples of ``WANTED`` as vLLM exposes them (a counter's sample ends in ``_total``): the
#: worker asks for these alone (``EngineClient.metrics_text``): 0.5 ms of a chat engine's API
#: server CPU a read, against 6.5 ms for its whole text (docs/worker.md, "Measured capacity").
SAMPLES = tuple(f"{name}_total" if name == "vllm:num_preemptions" else name for name in WANTED)


@dataclass(frozen=True)
class EngineLoad:
    running: int
    waiting: int
    preemptions: int
    kv_usage: float = 0.0


def parse_metrics(text: str) -> EngineLoad | None:
    """The gauges (counts summed over label sets, e.g. several served model names) from vLLM's
    Prometheus text; None if the text has neither gauge (not vLLM, or a version that renamed them)."""
    values: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith("#"):
            continue
        match = _SAMPLE.match(line.strip())
        if match and match.group(1) in WANTED and match.group(2) != "NaN":
            name, value = match.group(1), float(match.group(2))
            # Counts add up over label sets; the KV cache's use is one engine's: the highest.
            values[name] = (
                max(values.get(name, 0.0), value)
                if name == "vllm:kv_cache_usage_perc"
                else values.get(name, 0.0) + value
            )
    if "vllm:num_requests_running" not in values or "vllm:num_requests_waiting" not in values:
        return None
    return EngineLoad(
        int(values["vllm:num_requests_running"]),
        int(values["vllm:num_requests_waiting"]),
        int(values.get("vllm:num_preemptions", 0)),
        float(values.get("vllm:kv_cache_usage_perc", 0.0)),
    )


def capacity_for(load: EngineLoad, *, headroom: int, cap: int, max_num_seqs: int, preempted: bool = False) -> int:
    """Lines the worker lets into the engine: the cap, unless the engine holds lines waiting while
    it runs fewer than ``max_num_seqs`` because it cannot fit more (KV cache ``KV_FULL`` used, or
    ``preempted`` since the last read); then what it runs plus ``headroom``, within ``[headroom, cap]``."""
    full = load.kv_usage >= KV_FULL or preempted
    if load.waiting > 0 and load.running < max_num_seqs and full:
        return max(max(1, headroom), min(cap, load.running + headroom))
    return cap


class CapacityWatch:
    """Reads the engine's load every ``every`` seconds and applies ``capacity_for`` through
    ``apply`` (the admission's ``resize``). ``read`` returns the /metrics text (None: no answer)."""

    def __init__(
        self,
        read: Callable[[], Awaitable[str | None]],
        apply: Callable[[int], None],
        *,
        headroom: int,
        cap: int,
        max_num_seqs: int,
        every: float = READ_SECONDS,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        needed: Callable[[], bool] = lambda: True,
    ):
        self.read, self.apply, self.every, self._sleep, self.needed = read, apply, every, sleep, needed
        self.headroom, self.cap, self.max_num_seqs = max(1, headroom), max(1, cap), max(1, max_num_seqs)
        self.last: EngineLoad | None = None
        #: How fast the KV cache use grew (per second) from the read before ``last`` to ``last``;
        #: None: no rate, after a first read or a period with no read because nothing waited.
        self._growth: float | None = None
        #: Seconds slept since ``last`` (None: a period passed without a read).
        self._slept: float | None = 0.0
        self.capacity = cap
        self.preempted = False
        self.unreadable = 0
        self.reads = 0

    async def step(self) -> int:
        """One read; the capacity now in force."""
        try:
            text = await self.read()
        except Exception:  # noqa: BLE001 - an unreadable engine keeps the configured cap
            text = None
        load = parse_metrics(text) if text else None
        if load is None:
            self.unreadable += 1
            self.capacity = self.cap
        else:
            self.preempted = self.last is not None and load.preemptions > self.last.preemptions
            since = self._slept
            self._growth = (
                max(0.0, load.kv_usage - self.last.kv_usage) / since if self.last is not None and since else None
            )
            self._slept = 0.0
            self.last = load
            self.capacity = capacity_for(
                load, headroom=self.headroom, cap=self.cap, max_num_seqs=self.max_num_seqs, preempted=self.preempted
            )
        self.apply(self.capacity)
        self.reads += 1
        return self.capacity

    def calm(self) -> bool:
        """The last read found the engine far from full: no preemption, the capacity at the cap,
        and its KV cache use below ``KV_FULL`` for the next ``CALM_READS`` periods if it keeps
        growing as it did since the read before (below ``KV_CALM`` after a first read)."""
        last = self.last
        if last is None or self.preempted or self.capacity != self.cap:
            return False
        if self._growth is None:
            return last.kv_usage < KV_CALM
        return last.kv_usage + self._growth * self.every * CALM_READS < KV_FULL

    async def _pause(self, seconds: float) -> None:
        await self._sleep(seconds)
        if self._slept is not None:
            self._slept += seconds

    async def run(self) -> None:
        """Read while lines wait in the worker (``needed``): otherwise the capacity decides nothing
        and the engine's API server is spared rendering its metrics. After a calm read the next
        waits ``CALM_READS`` periods."""
        while True:
            if self.needed():
                await self.step()
                if self.calm():
                    await self._pause(self.every * (CALM_READS - 1))
            else:
                self._slept = None
            await self._pause(self.every)


def headroom(admission_cap: int, max_num_seqs: int) -> int:
    """Lines kept waiting in vLLM beyond what it runs: the part of the configured admission cap
    above ``max_num_seqs`` (at least one eighth of it)."""
    return max(admission_cap - max_num_seqs, math.ceil(max_num_seqs / 8), 1)
