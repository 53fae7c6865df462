"""Live progress under `make up` (docs/reliability.md, "Live progress"): a 200-line chat batch
polled every second shows request_counts rising in many steps (some of them lines of chunks
still running), never going down, never above the final counts, which match the output and
error files. Measured on this 2-core machine: 24 polls over ~24 s, 6 distinct totals (0, 2, 51,
126, 176, 200), four of them mid-chunk. The mid-chunk assertion depends on a poll landing between a
checkpoint (every 5 s) and its chunk's commit: with 48-token answers every run here had several.
"""

import time

import pytest

from tests.e2e.test_batches_e2e import TERMINAL, chat_line, check_invariants, sdk, submit  # noqa: F401 - sdk fixture

pytestmark = [pytest.mark.e2e, pytest.mark.engine, pytest.mark.slow]


def test_a_200_line_batch_polled_every_second_rises_in_steps(sdk):  # noqa: F811
    rows = [chat_line(i, max_tokens=48) for i in range(200)]
    batch = submit(sdk, rows)
    polls: list[tuple[int, int]] = []
    deadline = time.monotonic() + 600
    while True:
        current = sdk.batches.retrieve(batch.id)
        polls.append((current.request_counts.completed, current.request_counts.failed))
        if current.status in TERMINAL:
            break
        assert time.monotonic() < deadline, polls
        time.sleep(1.0)
    print("polls (completed, failed):", polls)
    assert current.status == "completed", current
    check_invariants(sdk, current, [r["custom_id"] for r in rows])
    final = polls[-1]
    assert final[0] + final[1] == 200
    for before, after in zip(polls, polls[1:]):
        assert after[0] >= before[0] and after[1] >= before[1], polls
    assert all(c <= final[0] and f <= final[1] for c, f in polls), polls
    assert len({c + f for c, f in polls}) >= 5, polls  # many steps, not one jump at the end
    # The local deployment's chunks are 25 lines: a total between two multiples of 25 is lines of
    # a chunk still running (its checkpoints), not only counted chunks.
    assert any((c + f) % 25 for c, f in polls), polls
