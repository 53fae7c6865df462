"""A hostile tenant against the prompt scan, under `make up` (real vLLM, the real worker and its
check processes): tenant A, whose policy refuses prompts with secrets, submits 1 MiB lines made of
a short repeated pattern (the shapes on which the detectors' regexes were quadratic on Python's
``re``) and secrets hidden by invisible characters, in a JSON key, split across text parts and
escaped in tool-call arguments; tenant B's small batch, submitted right after, completes normally
meanwhile and none of its chunks is received twice (the worker's heartbeats went on); A's lines end
with the right codes: every hidden secret ``prompt_secret_detected``, the long line without a
secret refused by the engine (over its context), its ordinary line completed. No timing is
asserted: the benchmark measures it (``python -m tests.bench.bench_hostile_scan``)."""

import io
import json

import pytest

from batchctl import cli
from infra import names
from tests.e2e.test_batches_e2e import chat_line, check_invariants, submit, wait
from tests.unit.test_guard import SECRETS
from tests.unit.test_secret_scan import escaped, spread

pytestmark = [pytest.mark.e2e, pytest.mark.engine, pytest.mark.local_only("reads the worker's log")]

CHAT = "/v1/chat/completions"
#: A line's content: about 1 MiB (the default line limit is 1 MiB of JSON).
LONG = 1_000_000


def row(custom_id: str, model: str, **body) -> dict:
    return {"custom_id": custom_id, "method": "POST", "url": CHAT, "body": {"model": model, "max_tokens": 8, **body}}


def chunk_logs(local_engines, batch_id: str) -> list[dict]:
    log = local_engines.state_dir / "logs" / f"worker-{names.LOCAL_CHAT_MODEL}.log"
    return [
        json.loads(line)
        for line in log.read_text(errors="replace").splitlines()
        if batch_id in line and '"chunk done"' in line
    ]


def test_a_hostile_tenant_cannot_stall_another_or_walk_around_the_scan(local_engines):
    model = names.LOCAL_CHAT_MODEL
    code = cli.main(
        ["tenants", "set", "--tenant", "hostile-a", "--prompt-secrets", "refuse"],
        env=local_engines.env,
        out=io.StringIO(),
        err=(err := io.StringIO()),
    )
    assert code == 0, err.getvalue()
    a = local_engines.client(local_engines.new_key("hostile-a"))
    b = local_engines.client(local_engines.new_key("honest-b"))
    aws, github = SECRETS["AWS access key id"][1], SECRETS["GitHub token"][1]

    def user(content):
        return [{"role": "user", "content": content}]

    hostile = [
        row("long-slashes-key", model, messages=user("//" * (LONG // 2) + f" {aws}")),
        row("long-no-secret", model, messages=user("sk-" * (LONG // 3))),
        row("zero-width", model, messages=user(f"use {spread(aws, chr(0x200B))}")),
        row(
            "split-parts",
            model,
            messages=user([{"type": "text", "text": github[:10]}, {"type": "text", "text": github[10:]}]),
        ),
        row(
            "schema-key",
            model,
            messages=user("hi"),
            tools=[
                {
                    "type": "function",
                    "function": {
                        "name": "f",
                        "parameters": {"type": "object", "properties": {aws: {"type": "string"}}},
                    },
                }
            ],
        ),
        row(
            "escaped-args",
            model,
            messages=[
                *user("hi"),
                {
                    "role": "assistant",
                    "content": None,
                    "tool_calls": [
                        {
                            "id": "c1",
                            "type": "function",
                            "function": {"name": "f", "arguments": '{"k": "' + escaped(github) + '"}'},
                        }
                    ],
                },
                {"role": "tool", "tool_call_id": "c1", "content": "ok"},
            ],
        ),
        row("ordinary", model, messages=user("Say a word about the sea.")),
    ]
    batch_a = submit(a, hostile)
    batch_b = submit(b, [chat_line(i, model=model, max_tokens=8) for i in range(3)])

    done_b = wait(b, batch_b.id, timeout=600)
    assert done_b.status == "completed", done_b
    out_b, err_b = check_invariants(b, done_b, ["chat-0", "chat-1", "chat-2"])
    assert len(out_b) == 3 and err_b == []
    records = chunk_logs(local_engines, batch_b.id)
    assert records and all(r["receive_count"] == 1 for r in records), records  # never redelivered

    done_a = wait(a, batch_a.id, timeout=600)
    assert done_a.status == "completed", done_a
    out_a, err_a = check_invariants(a, done_a, [r["custom_id"] for r in hostile])
    codes = {e.custom_id: (e.error.code if e.error else e.response.status_code) for e in err_a}
    assert codes == {
        "long-slashes-key": "prompt_secret_detected",
        "long-no-secret": 400,
        "zero-width": "prompt_secret_detected",
        "split-parts": "prompt_secret_detected",
        "schema-key": "prompt_secret_detected",
        "escaped-args": "prompt_secret_detected",
    }, codes
    assert [o.custom_id for o in out_a] == ["ordinary"]
    for file_id in (done_a.output_file_id, done_a.error_file_id):
        text = a.files.content(file_id).text
        assert aws not in text and github not in text
