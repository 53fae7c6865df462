"""The engine's measured capacity (gpu_worker/capacity.py, docs/worker.md): the worker reads
vLLM's running/waiting gauges and lets in what runs plus a headroom, so lines wait in the worker's
order rather than in vLLM's first-come queue; an engine without /metrics keeps the configured cap."""

import asyncio

import pytest

from gpu_worker.admission import Admission
from gpu_worker.capacity import SAMPLES, CapacityWatch, EngineLoad, capacity_for, headroom, parse_metrics
from gpu_worker.config import WorkerConfig
from gpu_worker.engine_client import EngineClient
from tests.fakes.engine import FakeEngine
from tests.helpers import free_port


@pytest.fixture
def engine():
    fake = FakeEngine().start()
    yield fake
    fake.stop()


#: As vLLM 0.32 renders them (two served names, to show label sets are summed).
METRICS = """# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="chat"} 30.0
vllm:num_requests_running{engine="0",model_name="chat-alias"} 10.0
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="chat"} 55.0
# TYPE vllm:num_preemptions_total counter
vllm:num_preemptions_total{engine="0",model_name="chat"} 7.0
vllm:kv_cache_usage_perc{engine="0",model_name="chat"} 0.98
"""


def test_the_gauges_are_read_from_vllms_prometheus_text():
    assert parse_metrics(METRICS) == EngineLoad(running=40, waiting=55, preemptions=7, kv_usage=0.98)
    assert parse_metrics("# nothing of vLLM here\nprocess_cpu_seconds_total 3.0\n") is None


def test_capacity_is_what_runs_plus_the_headroom_only_when_the_engine_cannot_fit_more():
    limits = {"headroom": 32, "cap": 160, "max_num_seqs": 128}
    assert capacity_for(EngineLoad(40, 55, 0, kv_usage=0.97), **limits) == 72  # KV-bound: 40 run, 55 wait
    assert capacity_for(EngineLoad(0, 3, 9, kv_usage=0.2), **limits, preempted=True) == 32  # never below the headroom
    assert capacity_for(EngineLoad(14, 146, 0, kv_usage=0.06), **limits) == 160  # waiting for their prefill: the cap
    assert capacity_for(EngineLoad(128, 32, 0, kv_usage=0.99), **limits) == 160  # every slot taken: the cap
    assert capacity_for(EngineLoad(0, 0, 0), **limits) == 160  # idle (a worker starting): the cap
    assert capacity_for(EngineLoad(90, 0, 0, kv_usage=0.95), **limits) == 160  # nothing waits: the cap
    config = WorkerConfig(engine_max_num_seqs=128)
    assert headroom(config.admission_cap(), 128) == 32  # smart order: a quarter of max_num_seqs
    file_order = WorkerConfig(engine_max_num_seqs=128, order="file")
    assert headroom(file_order.admission_cap(), 128) == 128


def test_a_lower_capacity_holds_lines_back_in_the_workers_order_and_a_higher_one_lets_them_in():
    async def go():
        admission = Admission(4, "smart")
        entered: list[int] = []
        done = {t: asyncio.Event() for t in (1, 2, 3, 4, 16, 256, 32)}

        async def line(tokens: int):
            async with admission.slot({"max_tokens": tokens}):
                entered.append(tokens)
                await done[tokens].wait()

        tasks = [asyncio.create_task(line(t)) for t in done]
        await asyncio.sleep(0)
        assert entered == [1, 2, 3, 4] and admission.waiting == 3
        admission.resize(2)  # the engine runs fewer: nothing new enters until under 2 are in
        for t in (1, 2):
            done[t].set()
        await asyncio.sleep(0.01)
        assert entered == [1, 2, 3, 4] and admission.in_flight == 2
        done[3].set()
        await asyncio.sleep(0.01)
        assert entered == [1, 2, 3, 4, 256] and admission.in_flight == 2  # the longest waiting first
        admission.resize(8)  # room again: the rest enter at once, in order
        await asyncio.sleep(0.01)
        assert entered == [1, 2, 3, 4, 256, 32, 16] and admission.in_flight == 4
        for event in done.values():
            event.set()
        await asyncio.gather(*tasks)
        assert admission.in_flight == 0 and admission.waiting == 0

    asyncio.run(go())


def test_the_watch_applies_the_measured_capacity_and_keeps_the_cap_without_metrics():
    applied = []

    async def go(texts):
        it = iter(texts)

        async def read():
            return next(it)

        watch = CapacityWatch(read, applied.append, headroom=32, cap=160, max_num_seqs=128)
        return [await watch.step() for _ in texts]

    assert asyncio.run(go([METRICS, None, "garbage"])) == [72, 160, 160]
    assert applied == [72, 160, 160]


def test_the_engine_is_read_only_while_lines_wait_in_the_worker():
    waiting = [False, False, True, False]
    reads = []

    async def read():
        reads.append(1)
        return METRICS

    async def sleep(_):
        if not waiting:
            raise asyncio.CancelledError
        waiting.pop(0)

    watch = CapacityWatch(
        read,
        lambda c: None,
        headroom=32,
        cap=160,
        max_num_seqs=128,
        sleep=sleep,
        needed=lambda: bool(waiting) and waiting[0],
    )
    try:
        asyncio.run(watch.run())
    except asyncio.CancelledError:
        pass
    assert len(reads) == 1 and watch.reads == 1


def gauges(*, running: int, waiting: int, kv: float, preemptions: int = 0) -> str:
    return (
        f"vllm:num_requests_running {running}\nvllm:num_requests_waiting {waiting}\n"
        f"vllm:num_preemptions_total {preemptions}\nvllm:kv_cache_usage_perc {kv}\n"
    )


def test_an_engine_far_from_full_is_read_a_quarter_as_often():
    texts = [
        gauges(running=128, waiting=96, kv=0.35),  # calm: the next read 4 periods later
        gauges(running=128, waiting=96, kv=0.44),  # calm
        gauges(running=40, waiting=55, kv=0.95),  # full: the capacity drops, read every period
        gauges(running=128, waiting=96, kv=0.35, preemptions=2),  # preempted since the last read
        gauges(running=128, waiting=96, kv=0.60, preemptions=2),  # +0.25 in a period: every period
        gauges(running=128, waiting=96, kv=0.30, preemptions=2),  # calm again
    ]
    capacities, slept = paced(texts)
    assert capacities == [160, 160, 72, 160, 160, 160]
    assert slept == [1.5, 0.5, 1.5, 0.5, 0.5, 0.5, 0.5, 1.5, 0.5]


def test_a_kv_cache_that_would_not_fill_before_the_next_calm_read_is_calm():
    """Past ``KV_CALM`` the watch projects the KV cache's growth since the read before over the
    ``CALM_READS`` periods it would wait: a cache well used but steady is read a quarter as often, one
    filling fast every period."""
    texts = [
        gauges(running=128, waiting=96, kv=0.40),  # first read, under KV_CALM: calm
        gauges(running=128, waiting=96, kv=0.70),  # +0.30 in 2 s: 0.70 + 0.15/s x 2 s past KV_FULL
        gauges(running=128, waiting=96, kv=0.72),  # +0.02 in 0.5 s: 0.72 + 0.08 stays under
        gauges(running=128, waiting=96, kv=0.74),  # +0.02 in 2 s: calm
        gauges(running=128, waiting=96, kv=0.60),  # shrinking: calm
    ]
    assert paced(texts)[1] == [1.5, 0.5, 0.5, 1.5, 0.5, 1.5, 0.5, 1.5, 0.5]


def test_a_period_without_a_read_forgets_the_rate():
    """Nothing waited in the worker for a while: the read after it has no rate, so it is calm only
    under ``KV_CALM``, however slowly the cache grew across the gap."""
    texts = [gauges(running=128, waiting=96, kv=0.30), gauges(running=128, waiting=96, kv=0.60)]
    waits = [True, False, False, True]  # read, two periods with nothing waiting, read: +0.30 in 3 s
    assert paced(texts, needed=lambda: waits.pop(0) if waits else True)[1] == [1.5, 0.5, 0.5, 0.5, 0.5]


def paced(texts: list[str], needed=lambda: True) -> tuple[list[int], list[float]]:
    """Run a watch (period 0.5 s) over the given /metrics answers: the capacities it applied and
    the sleeps between its reads."""
    it, capacities, slept = iter(texts), [], []

    async def read():
        try:
            return next(it)
        except StopIteration:
            raise asyncio.CancelledError from None

    async def sleep(seconds):
        slept.append(seconds)

    watch = CapacityWatch(
        read, capacities.append, headroom=32, cap=160, max_num_seqs=128, every=0.5, sleep=sleep, needed=needed
    )
    try:
        asyncio.run(watch.run())
    except asyncio.CancelledError:
        pass
    return capacities, slept


# --- reading the gauges from the engine -----------------------------------------------------
#: The rest of a /metrics text, which the worker does not need (vLLM's is ~50 KB of histograms).
OTHER_METRICS = (
    "".join(f'vllm:request_latency_seconds_bucket{{le="{b}",model_name="chat"}} {b}\n' for b in range(500))
    + 'python_gc_objects_collected_total{generation="0"} 14107.0\n'
)


def read_twice(fake: FakeEngine) -> list[str | None]:
    async def go():
        async with EngineClient(fake.url, max_in_flight=1) as engine:
            return [await engine.metrics_text(SAMPLES), await engine.metrics_text(SAMPLES)]

    return asyncio.run(go())


def test_the_worker_asks_the_engine_for_the_gauges_alone(engine):
    engine.metrics = METRICS + OTHER_METRICS
    texts = read_twice(engine)
    assert [parse_metrics(t) for t in texts] == [EngineLoad(running=40, waiting=55, preemptions=7, kv_usage=0.98)] * 2
    assert all("request_latency" not in t and "python_gc" not in t for t in texts)
    filtered = "/metrics/?" + "&".join(f"name%5B%5D={name.replace(':', '%3A')}" for name in SAMPLES)
    assert engine.probes == [filtered, filtered]


def test_an_engine_that_cannot_filter_its_metrics_is_read_whole_from_then_on(engine):
    engine.metrics, engine.metrics_filter = METRICS + OTHER_METRICS, False
    texts = read_twice(engine)
    assert [parse_metrics(t) for t in texts] == [EngineLoad(running=40, waiting=55, preemptions=7, kv_usage=0.98)] * 2
    assert [p.split("?")[0] for p in engine.probes] == ["/metrics/", "/metrics", "/metrics"]


def test_an_engine_without_metrics_reads_as_none(engine):
    assert read_twice(engine) == [None, None]
    assert [p.split("?")[0] for p in engine.probes] == ["/metrics/", "/metrics", "/metrics"]


def test_a_read_with_no_answer_asks_for_the_gauges_alone_again():
    """An engine not there yet (no connection) is not one that cannot filter: once it answers,
    the worker still asks for its four samples alone."""
    fake = FakeEngine()
    fake.port = free_port()  # nothing listens there yet
    fake.metrics = METRICS + OTHER_METRICS

    async def go():
        async with EngineClient(fake.url, max_in_flight=1) as engine:
            before = await engine.metrics_text(SAMPLES)
            fake.start()
            try:
                return before, await engine.metrics_text(SAMPLES)
            finally:
                fake.stop()

    before, after = asyncio.run(go())
    assert before is None
    assert parse_metrics(after) == EngineLoad(running=40, waiting=55, preemptions=7, kv_usage=0.98)
    assert [p.split("?")[0] for p in fake.probes] == ["/metrics/"]
