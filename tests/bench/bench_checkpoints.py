"""Checkpoints of a running chunk: what they cost (extra S3 PUTs and DynamoDB writes per chunk) and
what they save (lines not sent again when the chunk is delivered again after its worker died).

Counted, not timed: the real chunk path (``gpu_worker.chunk.ChunkRunner``) on the in-memory
stores of tests/fakes, with an in-process engine whose line i answers at step i (lines finish in
input order, as they roughly do in one chunk sent at once) and that dies at step k, for every k in
1..n-1. The second delivery runs with a healthy engine; its engine requests are the lines re-sent.

    .venv/bin/python -m tests.bench.bench_checkpoints [--lines 100]
"""

from __future__ import annotations

import argparse
import asyncio
import logging

from gpu_worker.attempt import RunPolicy
from gpu_worker.engine_client import EngineDown, Reply
from tests.chunks import process_chunk
from tests.fakes.aws import fake_stores
from tests.fakes.engine import InProcessEngine, chat_answer, content
from tests.unit.test_worker_loop import seed


class DiesAtStep:
    """Line i answers at step i + 1; at step ``k`` the engine dies (every open request fails)."""

    def __init__(self, k: int):
        self.k, self.step, self.requests = k, 0, 0
        self.in_flight, self.waiting, self.max_in_flight = 0, 0, 1024

    async def healthy(self) -> bool:
        return True

    async def wait_healthy(self, timeout: float, interval: float = 1.0) -> float:
        return 0.0

    async def post(self, path, body):
        self.requests += 1
        i = int(content(body).split()[-1])
        while self.step <= i:
            if self.step >= self.k:
                raise EngineDown("died")
            await asyncio.sleep(0)
            if i == min(self.step, self.k - 1) and self.step < self.k:
                self.step += 1
                return Reply(200, chat_answer(body), "req")
        raise EngineDown("died")


async def direct(fn, *args, **kwargs):
    return fn(*args, **kwargs)


def one(n: int, k: int, policy: RunPolicy) -> tuple[int, int, int]:
    """(S3 PUTs, DynamoDB run-record writes, lines re-sent) for a death at step k."""
    stores = fake_stores()
    (message,) = seed(stores, n, per_chunk=n)

    def go(engine):
        return process_chunk(stores, message, engine, io=direct, max_line_bytes=1 << 20, now=lambda: 0, policy=policy)

    try:
        asyncio.run(go(DiesAtStep(k)))
    except EngineDown:
        pass
    puts = stores.faults.calls["objects.put"] - 1  # the input file
    writes = stores.faults.calls["batches.save_chunk_run"]
    again = InProcessEngine()
    asyncio.run(go(again))
    return puts, writes, len(again.requests)


def clean(n: int, policy: RunPolicy) -> tuple[int, int]:
    """(S3 PUTs, DynamoDB run-record writes) of a chunk that never dies (the parts included)."""
    stores = fake_stores()
    (message,) = seed(stores, n, per_chunk=n)
    asyncio.run(
        process_chunk(
            stores, message, InProcessEngine(), io=direct, max_line_bytes=1 << 20, now=lambda: 0, policy=policy
        )
    )
    return stores.faults.calls["objects.put"] - 1, stores.faults.calls["batches.save_chunk_run"]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--lines", type=int, default=100)
    n = parser.parse_args().lines
    logging.disable(logging.WARNING)  # every death logs a warning
    print(f"chunk of {n} lines; a death at each step 1..{n - 1} (line k answered at step k), then one redelivery")
    print(
        "| checkpoint_lines | PUTs, clean chunk | run-record writes, clean chunk | lines re-sent after a death (mean) | worst |"
    )
    print("| ---: | ---: | ---: | ---: | ---: |")
    for every in (0, 10, 25, 50):
        policy = RunPolicy(checkpoint_lines=every, checkpoint_seconds=0, checkpoint_min_seconds=0)
        puts, writes = clean(n, policy)
        resent = [one(n, k, policy)[2] for k in range(1, n)]
        print(f"| {every or 'off'} | {puts} | {writes} | {sum(resent) / len(resent):.1f} | {max(resent)} |")


if __name__ == "__main__":
    main()
