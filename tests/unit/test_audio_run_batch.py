"""Audio lines end to end through ``batchctl run-batch`` against the fake engine (multipart on the
audio paths): a mixed file (chat, a transcription by data: URL, a translation) in input order;
the form the engine gets (file, fields, repeated ``timestamp_granularities[]``); a text answer
wrapped; a fetch refused by the address policy and a host off the allowlist as error rows; the
engine client's multipart post retried with the same bytes as ``post``."""

from __future__ import annotations

import asyncio
import base64
import io
import json

import pytest

import batchctl
from functions.core.chunk_lifecycle import Usage
from functions.core.lines import RawLine, check_request
from functions.core.work import Spend, answered_spend
from gpu_worker.engine_client import EngineClient, RetryPolicy, encode_multipart
from gpu_worker.line_runner import audio_fields, run_line
from gpu_worker.media import MediaPolicy
from tests.fakes.engine import FakeEngine, InProcessEngine, chat_answer, default_respond

AUDIO = b"RIFF\x24\x00\x00\x00WAVEfmt fake audio"
DATA_URL = "data:audio/wav;base64," + base64.b64encode(AUDIO).decode()
TRANSCRIBE, TRANSLATE = "/v1/audio/transcriptions", "/v1/audio/translations"


def request(custom_id: str, url: str, body: dict) -> str:
    return json.dumps({"custom_id": custom_id, "method": "POST", "url": url, "body": {"model": "whisper", **body}})


@pytest.fixture
def fake():
    engine = FakeEngine().start()
    yield engine
    engine.stop()


def run_batch(fake, tmp_path, lines: list[str], *extra: str) -> tuple[list[dict], str]:
    (tmp_path / "in.jsonl").write_text("\n".join(lines) + "\n")
    argv = ["run-batch", "-i", str(tmp_path / "in.jsonl"), "-o", str(tmp_path / "out.jsonl")]
    code = batchctl.main(
        [*argv, "--engine-url", fake.url, *extra], env={}, out=io.StringIO(), err=(err := io.StringIO())
    )
    assert code == 0, err.getvalue()
    return [json.loads(l) for l in (tmp_path / "out.jsonl").read_text().splitlines()], err.getvalue()


def test_a_mixed_file_runs_chat_transcription_and_translation_in_input_order(fake, tmp_path):
    lines = [
        request("chat-1", "/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}]}),
        request(
            "tr-1",
            TRANSCRIBE,
            {
                "file_url": DATA_URL,
                "language": "en",
                "temperature": 0.2,
                "response_format": "verbose_json",
                "timestamp_granularities": ["word", "segment"],
            },
        ),
        request("tl-1", TRANSLATE, {"file_url": DATA_URL, "prompt": "Names: Ada."}),
    ]
    rows, err = run_batch(fake, tmp_path, lines)
    assert [r["custom_id"] for r in rows] == ["chat-1", "tr-1", "tl-1"]
    assert all(r["error"] is None and r["response"]["status_code"] == 200 for r in rows)
    assert rows[1]["response"]["body"] == {
        "text": f"heard {len(AUDIO)} bytes",
        "usage": {"type": "duration", "seconds": 1},
    }
    sent = dict(fake.requests)
    assert sent[TRANSCRIBE] == {
        "model": "whisper",
        "language": "en",
        "temperature": "0.2",
        "response_format": "verbose_json",
        "timestamp_granularities": ["word", "segment"],  # sent as repeated timestamp_granularities[]
        "file": {"filename": "audio.bin", "bytes": len(AUDIO)},
    }
    assert sent[TRANSLATE] == {
        "model": "whisper",
        "prompt": "Names: Ada.",
        "file": {"filename": "audio.bin", "bytes": len(AUDIO)},
    }
    assert sorted(path for path, _, _ in fake.files) == [TRANSCRIBE, TRANSLATE]
    assert all(data == AUDIO for _, _, data in fake.files)
    # the chat line's tokens are counted; the audio lines' usage in seconds adds none
    assert "3 completed, 0 failed" in err and "10 input / 3 output tokens" in err


def test_audio_lines_refused_before_the_engine_are_error_rows(fake, tmp_path):
    lines = [
        request("no-host", TRANSCRIBE, {"file_url": "https://media.example.com/a.wav?sig=s3cr3t"}),
        request("loopback", TRANSCRIBE, {"file_url": "http://127.0.0.1:9/a.wav"}),
        request("file", TRANSLATE, {"file": "a.wav"}),
        request("ok", TRANSLATE, {"file_url": DATA_URL}),
    ]
    rows, err = run_batch(fake, tmp_path, lines, "--allowed-media-domains", "127.0.0.1")
    codes = [(r["custom_id"], (r["error"] or {}).get("code")) for r in rows]
    assert codes == [
        ("no-host", "invalid_value"),
        ("loopback", "media_fetch_failed"),
        ("file", "invalid_value"),
        ("ok", None),
    ]
    assert "s3cr3t" not in json.dumps(rows)
    assert "a loopback address" in rows[1]["error"]["message"]
    assert [path for path, _ in fake.requests] == [TRANSLATE]  # nothing else reached the engine
    assert "1 completed, 3 failed" in err


def test_a_text_answer_is_wrapped_as_its_text():
    engine = InProcessEngine(lambda path, body, seen: (200, "hello there\n"))
    raw_line = request("t", TRANSCRIBE, {"file_url": DATA_URL, "response_format": "text"}).encode()
    result = asyncio.run(run_line(engine, RawLine(1, 0, len(raw_line), raw_line), endpoint=TRANSCRIBE))
    assert result.succeeded and result.line.response.body == {"text": "hello there\n"}
    assert engine.requests == [
        (
            TRANSCRIBE,
            {"model": "whisper", "response_format": "text", "file": {"filename": "audio.bin", "bytes": len(AUDIO)}},
        )
    ]


def test_run_line_checks_the_host_against_its_media_policy():
    engine = InProcessEngine(default_respond)
    raw_line = request("t", TRANSCRIBE, {"file_url": "https://media.example.com/a.wav"}).encode()
    line = RawLine(1, 0, len(raw_line), raw_line)
    refused = asyncio.run(run_line(engine, line, endpoint=TRANSCRIBE))
    assert refused.line.error.code == "invalid_value" and engine.requests == []
    # the same line with its host on the policy's allowlist passes validation: only the fetch is left
    policy = MediaPolicy(allowed_domains=("media.example.com",))
    assert check_request(json.loads(raw_line), endpoint=TRANSCRIBE, allowed_media_domains=policy.allowed_domains)


def test_form_fields_follow_vllms_parsing():
    assert audio_fields(
        {"model": "m", "file_url": "x", "temperature": 0, "stream": False, "vllm_xargs": {"a": 1}, "language": None}
    ) == [("model", "m"), ("temperature", "0"), ("stream", "false"), ("vllm_xargs", '{"a":1}')]


def test_a_multipart_post_is_retried_with_the_same_bytes(fake):
    seen_bodies = []

    def respond(path, body, seen):
        seen_bodies.append(body)
        return (503, {"error": {"message": "busy"}}, {"Retry-After": "0"}) if seen == 0 else (200, chat_answer(body))

    fake.respond = respond

    async def go():
        async with EngineClient(fake.url, max_in_flight=2, policy=RetryPolicy(backoff_base_seconds=0.01)) as engine:
            return await engine.post_form(TRANSCRIBE, [("model", "m")], [("file", "a.wav", AUDIO)])

    reply = asyncio.run(go())
    assert reply.status == 200 and reply.attempts == 2
    assert seen_bodies[0] == seen_bodies[1] == {"model": "m", "file": {"filename": "a.wav", "bytes": len(AUDIO)}}


def test_a_field_name_cannot_break_out_of_its_part_header():
    payload, content_type = encode_multipart([('x"\r\nEvil: 1', "v")], [])
    assert b'name="x%22%0D%0AEvil: 1"' in payload and content_type.startswith("multipart/form-data; boundary=")


@pytest.mark.parametrize(
    "usage",
    [
        {"type": "duration", "seconds": 3},
        {"type": "tokens", "input_tokens": "x", "output_tokens": None, "input_tokens_details": "?"},
        {"prompt_tokens": True, "prompt_tokens_details": [1], "completion_tokens_details": None},
        "12 seconds",
    ],
)
def test_a_usage_of_an_unknown_shape_counts_no_tokens_and_never_raises(usage):
    total = Usage()
    total.add_response(usage)
    assert total == Usage() and answered_spend(usage) == Spend()


def test_an_audio_answers_token_usage_is_counted():
    total = Usage()
    usage = {"type": "tokens", "input_tokens": 40, "output_tokens": 7, "input_token_details": {"audio_tokens": 40}}
    total.add_response(usage)
    assert (total.input_tokens, total.output_tokens) == (40, 7) and answered_spend(usage) == Spend(40, 7)
