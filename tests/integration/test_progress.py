"""Live progress on moto through the SDK (docs/lifecycle.md, "Live progress"): a 60-line batch
is spread over 3 chunks by ingest; while the worker's real chunk path runs them (checkpoints
every 3 lines), ``client.batches.retrieve`` after every store call of the worker shows
request_counts rising in many steps, never going down, never above the final counts."""

import asyncio
import itertools

import pytest

from gpu_worker.attempt import RunPolicy
from tests.chunks import process_chunk
from tests.fakes.engine import InProcessEngine, rejecting
from tests.integration.batch_helpers import line, run_ingest, submit, take_work

pytestmark = pytest.mark.settings(chunk_max_lines=100)


def test_a_batch_polled_while_its_chunks_run_shows_counts_rising_in_steps(client, stores, deployed):
    batch = submit(client, ("\n".join(line(i) for i in range(60)) + "\n").encode())
    run_ingest()
    messages = take_work(deployed)
    assert [m.line_count for m in messages] == [25, 25, 10]  # a small batch over several chunks of >= 25
    polls: list[tuple[int, int]] = []

    def poll() -> None:
        counts = client.batches.retrieve(batch.id).request_counts
        assert counts.total == 60
        polls.append((counts.completed, counts.failed))

    async def io(fn, *args, **kwargs):
        try:
            return fn(*args, **kwargs)
        finally:
            poll()

    engine = InProcessEngine(rejecting("hi 4"))
    for message in messages:
        asyncio.run(
            process_chunk(
                stores,
                message,
                engine,
                io=io,
                max_line_bytes=1 << 20,
                policy=RunPolicy(checkpoint_min_seconds=0, checkpoint_lines=3, checkpoint_seconds=0),
            )
        )
    poll()
    final = (59, 1)  # one line rejected by the engine
    assert polls[-1] == final
    for before, after in itertools.pairwise(polls):
        assert after[0] >= before[0] and after[1] >= before[1], polls
    assert all(c <= final[0] and f <= final[1] for c, f in polls), polls
    # checkpoints every 3 lines of a chunk (not its last lines), then its commit
    steps = [0, *range(3, 25, 3), 25, *range(28, 50, 3), 50, 53, 56, 59, 60]
    assert sorted({c + f for c, f in polls}) == steps and len(steps) == 23
