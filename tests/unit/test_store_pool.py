"""The worker's store pool (gpu_worker/store_pool.py): urgent calls (a chunk's start, its commit's
parts, count and signal) run before background ones (checkpoints, audit receipts) that were
submitted earlier, in submission order within a priority; errors reach the caller; with several
threads, calls run side by side."""

import asyncio
import threading

import pytest

from gpu_worker.store_pool import BACKGROUND, URGENT, StorePool


def test_urgent_calls_overtake_waiting_background_calls_in_order():
    pool = StorePool()
    gate, ran = threading.Event(), []
    blocker = pool.submit(URGENT, gate.wait)  # holds the thread while the rest queue up
    futures = [
        pool.submit(priority, ran.append, name)
        for priority, name in (
            (BACKGROUND, "checkpoint-1"),
            (URGENT, "count-1"),
            (BACKGROUND, "receipt-1"),
            (URGENT, "count-2"),
        )
    ]
    gate.set()
    for f in (blocker, *futures):
        f.result(timeout=5)
    assert ran == ["count-1", "count-2", "checkpoint-1", "receipt-1"]
    assert pool.calls == {URGENT: 3, BACKGROUND: 2}
    pool.shutdown()


def test_a_call_s_error_is_raised_to_its_awaiting_caller_and_the_thread_goes_on():
    pool = StorePool()

    async def go():
        with pytest.raises(ZeroDivisionError):
            await pool.call(URGENT, lambda: 1 / 0)
        return await pool.call(BACKGROUND, lambda x: x + 1, 41)

    assert asyncio.run(go()) == 42
    pool.shutdown()


def test_several_threads_run_calls_side_by_side():
    pool = StorePool(threads=3)
    assert pool.threads == 3
    # Three calls that each wait for the other two: they finish only if all three run at once.
    barrier = threading.Barrier(3, timeout=5)
    together = [pool.submit(URGENT, barrier.wait) for _ in range(3)]
    assert sorted(f.result(timeout=10) for f in together) == [0, 1, 2]
    assert pool.calls == {URGENT: 3, BACKGROUND: 0}
    pool.shutdown()
    assert all(not t.is_alive() for t in pool._threads)


def test_one_thread_is_the_least():
    with pytest.raises(ValueError):
        StorePool(threads=0)


def test_each_thread_runs_on_start_before_its_first_call():
    started, lock = [], threading.Lock()

    def on_start():
        with lock:
            started.append(threading.get_ident())

    pool = StorePool(threads=2, on_start=on_start)
    barrier = threading.Barrier(2, timeout=5)
    ran_on = [pool.submit(URGENT, lambda: (barrier.wait(), threading.get_ident())[1]) for _ in range(2)]
    idents = {f.result(timeout=5) for f in ran_on}
    assert len(idents) == 2 and set(started) == idents
    pool.shutdown()


def test_an_error_in_on_start_leaves_the_thread_serving():
    pool = StorePool(on_start=lambda: 1 / 0)
    assert pool.submit(URGENT, lambda: 7).result(timeout=5) == 7
    pool.shutdown()


def test_one_background_call_at_a_time_leaves_the_other_threads_to_urgent_ones():
    pool = StorePool(threads=3)
    gate, ran = threading.Event(), []
    slow_receipt = pool.submit(BACKGROUND, gate.wait)  # a background call holding one thread
    second = pool.submit(BACKGROUND, ran.append, "checkpoint")  # waits: one background at a time
    counts = [pool.submit(URGENT, ran.append, f"count-{i}") for i in range(4)]  # on the free threads
    for f in counts:
        f.result(timeout=5)
    assert sorted(ran) == ["count-0", "count-1", "count-2", "count-3"] and not second.done()
    gate.set()
    slow_receipt.result(timeout=5)
    second.result(timeout=5)
    assert ran[-1] == "checkpoint"
    pool.shutdown()
    with pytest.raises(RuntimeError):
        pool.submit(URGENT, ran.append, "late")


def test_urgent_calls_of_an_earlier_chunk_go_before_a_later_chunk_s_whenever_they_came():
    pool = StorePool()
    gate, ran = threading.Event(), []
    blocker = pool.submit(URGENT, gate.wait)
    queued = [
        pool.submit_ranked(URGENT, rank, ran.append, name)
        for rank, name in ((2, "chunk-2 start"), (1, "chunk-1 start"), (2, "chunk-2 read"), (1, "chunk-1 read"))
    ]
    queued.append(pool.submit(BACKGROUND, ran.append, "checkpoint"))
    queued.append(pool.submit(URGENT, ran.append, "worker's own"))  # rank 0
    gate.set()
    for f in (blocker, *queued):
        f.result(timeout=5)
    assert ran == ["worker's own", "chunk-1 start", "chunk-1 read", "chunk-2 start", "chunk-2 read", "checkpoint"]
    pool.shutdown()
