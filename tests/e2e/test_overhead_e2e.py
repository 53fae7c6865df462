"""The fixed overhead under `make up` (real vLLM, the worker in smart order, its default): a 1-line batch
completes, and the worker logs when its first line entered the engine, when the last answer came
and when its chunk was counted (``chunk done``), between the batch's creation and completion; a
batch of uneven ``max_tokens`` lines sharing system prompts, reordered in the engine, keeps input
order in its output file with every line once. The time each step takes is measured by
``python -m tests.bench.bench_overhead`` (docs/benchmarks.md, "Fixed overhead"): no
timing is asserted here."""

import json
import math
import random

import pytest

from infra import names
from tests.e2e.test_batches_e2e import chat_line, check_invariants, submit, wait

pytestmark = [pytest.mark.e2e, pytest.mark.engine, pytest.mark.local_only("reads the worker's log")]

CHAT = "/v1/chat/completions"


def chunk_logs(local_engines, batch_id: str) -> list[dict]:
    log = local_engines.state_dir / "logs" / f"worker-{names.LOCAL_CHAT_MODEL}.log"
    records = []
    for line in log.read_text(errors="replace").splitlines():
        if batch_id in line and '"chunk done"' in line:
            records.append(json.loads(line))
    return records


def test_a_one_line_batch_completes_and_the_worker_logs_its_engine_window(local_engines):
    sdk = local_engines.client()
    batch = submit(sdk, [chat_line(0, max_tokens=8)])
    done = wait(sdk, batch.id)
    assert done.status == "completed", done
    check_invariants(sdk, done, ["chat-0"])
    (record,) = chunk_logs(local_engines, batch.id)
    stamps = [record[k] for k in ("received_at", "first_sent_at", "last_answer_at", "committed_at")]
    assert stamps == sorted(stamps), record
    # unix seconds on both sides (the batch's are whole seconds)
    assert done.created_at <= math.ceil(stamps[0]) and math.floor(stamps[-1]) <= done.completed_at, (done, record)


def test_a_reordered_batch_keeps_input_order_and_every_line_once(local_engines):
    systems = [f"You are assistant {n}. " + "Answer briefly and politely, in plain English. " * 12 for n in "ABC"]
    rnd = random.Random(14)
    rows = []
    for i in range(30):
        row = chat_line(i, max_tokens=rnd.choice([4, 16, 48]))
        row["body"]["messages"].insert(0, {"role": "system", "content": rnd.choice(systems)})
        rows.append(row)
    sdk = local_engines.client()
    done = wait(sdk, submit(sdk, rows).id)
    assert done.status == "completed", done
    out, err = check_invariants(sdk, done, [r["custom_id"] for r in rows])
    assert len(out) == 30 and err == []
