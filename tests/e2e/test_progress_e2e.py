"""Live progress under `make up` (docs/lifecycle.md, "Live progress"): a 100-line chat batch of
uneven answers (4 to 40 tokens, ``ignore_eos``) polled every 0.25 s shows request_counts rising in
many steps (some of them lines of chunks still running), never going down, never above the final
counts, which match the output and error files. The e2e deployment checkpoints every second
(``WORKER_CHECKPOINT_SECONDS=1``, tests/e2e/conftest.py; 5 s by default), so a poll lands between a
checkpoint and its chunk's commit on a fast CPU too; the uneven lengths spread the lines' ends
over the run.
"""

import itertools
import time

import pytest

from tests.e2e.test_batches_e2e import TERMINAL, chat_line, check_invariants, sdk, submit

pytestmark = [pytest.mark.e2e, pytest.mark.engine, pytest.mark.slow]


LINES = 100


def test_a_batch_polled_while_it_runs_rises_in_steps(sdk):
    rows = [chat_line(i, max_tokens=4 + 4 * (i % 10)) for i in range(LINES)]
    for row in rows:
        row["body"]["ignore_eos"] = True
    batch = submit(sdk, rows)
    polls: list[tuple[int, int]] = []
    deadline = time.monotonic() + 600
    while True:
        current = sdk.batches.retrieve(batch.id)
        polls.append((current.request_counts.completed, current.request_counts.failed))
        if current.status in TERMINAL:
            break
        assert time.monotonic() < deadline, polls
        time.sleep(0.25)
    print("polls (completed, failed):", polls)
    assert current.status == "completed", current
    check_invariants(sdk, current, [r["custom_id"] for r in rows])
    final = polls[-1]
    assert final[0] + final[1] == LINES
    for before, after in itertools.pairwise(polls):
        assert after[0] >= before[0] and after[1] >= before[1], polls
    assert all(c <= final[0] and f <= final[1] for c, f in polls), polls
    assert len({c + f for c, f in polls}) >= 5, polls  # many steps, not one jump at the end
    # The local deployment's chunks are 25 lines: a total between two multiples of 25 is lines of
    # a chunk still running (its checkpoints), not only counted chunks.
    assert any((c + f) % 25 for c, f in polls), polls
