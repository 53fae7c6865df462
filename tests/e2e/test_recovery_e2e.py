"""The local deployment recovers as ECS does: SIGKILL the chat worker's process group, or the chat
engine's (vLLM), in the middle of a batch; the supervisor of ``make up`` starts it again and the
batch completes with every line exactly once (driven only with the official openai SDK).

The batch's first chunk is short work and the other is long (``ignore_eos``), so once the first
chunk is counted the long one is still being generated: the kill lands mid-batch. A
killed worker's chunks come back when their visibility lapses (30 s in the local deployment, 15 s
in the e2e one); a killed engine's chunks are released by the worker (EngineDown), which waits
for /health."""

import os
import re
import signal
import time

import pytest
from openai import OpenAI

from infra import names
from tests.e2e.test_batches_e2e import CHUNK_LINES, chat_line, check_invariants, submit, wait

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.engine,
    pytest.mark.slow,
    pytest.mark.local_only("kills the local deployment's worker and engine processes and reads its supervisor log"),
]

CHAT = names.LOCAL_CHAT_MODEL
LINES = 2 * CHUNK_LINES
LONG_TOKENS = 48
#: An engine loads its model in 20-40 s on this CPU; a worker starts in a second or two.
RESTART_TIMEOUT = 120.0


@pytest.fixture
def sdk(local_engines, request) -> OpenAI:
    tenant = "e2e-" + re.sub(r"[^A-Za-z0-9_.-]", "-", request.node.name)[:50]
    return local_engines.client(local_engines.new_key(tenant))


def rows() -> list[dict]:
    made = [chat_line(i, max_tokens=8) for i in range(CHUNK_LINES)]
    made += [chat_line(i, max_tokens=LONG_TOKENS) for i in range(CHUNK_LINES, LINES)]
    for row in made[CHUNK_LINES:]:
        row["body"]["ignore_eos"] = True
    return made


def wait_for_group(local_engines, kind: str, *, other_than: int | None = None) -> int:
    deadline = time.monotonic() + RESTART_TIMEOUT
    while time.monotonic() < deadline:
        pid = local_engines.child_group(kind, CHAT)
        if pid is not None and pid != other_than:
            return pid
        time.sleep(0.25)
    raise AssertionError(
        f"no {kind} for {CHAT} (other than {other_than}) within {RESTART_TIMEOUT}s:\n{local_engines.log()}"
    )


@pytest.mark.parametrize("kind", ["worker", "engine"])
def test_a_batch_completes_after_its_chat_process_is_killed_mid_run(local_engines, sdk, kind):
    before = wait_for_group(local_engines, kind)
    lines = rows()
    batch = submit(sdk, lines)
    deadline = time.monotonic() + 180
    while (running := sdk.batches.retrieve(batch.id)).request_counts.completed == 0:  # the short chunk
        assert running.status in ("validating", "in_progress"), running
        assert time.monotonic() < deadline, running
        time.sleep(0.1)

    os.killpg(before, signal.SIGKILL)
    at_kill = sdk.batches.retrieve(batch.id)
    assert at_kill.status == "in_progress" and at_kill.request_counts.completed < LINES, at_kill  # mid-batch

    after = wait_for_group(local_engines, kind, other_than=before)  # started again
    done = wait(sdk, batch.id, timeout=360)
    assert done.status == "completed", done
    out, err = check_invariants(sdk, done, [r["custom_id"] for r in lines])  # every line exactly once
    assert (len(out), err) == (LINES, [])
    assert done.request_counts.completed == LINES and done.request_counts.failed == 0
    supervisor_log = (local_engines.state_dir / "logs" / "supervisor.log").read_text()
    assert f"{kind}-{CHAT} exited (killed by SIGKILL)" in supervisor_log
    assert f"{kind}-{CHAT} restarted (pid {after})" in supervisor_log
