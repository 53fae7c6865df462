"""Hostile line content never reaches an exception (docs/api.md, "Hostile content and file names"): JSON nested thousands deep,
huge values echoed into messages, lone UTF-16 surrogates, NUL characters, over-long custom_ids.
Each is either rejected by validation with its code, param and line, or carried through every
later write (result lines, error lines, the batch's errors, its status event)."""

import asyncio
import json

import pytest

from functions.core import results, schema
from functions.core.lines import LineError, check_request, iter_lines, parse_request
from functions.core.messages import WorkMessage
from functions.core.settings import ModelRoute, Settings
from functions.core.wire import BatchOutputLine
from functions.ingest import logic
from tests.builders import batch_record
from tests.fakes.aws import fake_stores
from tests.fakes.engine import InProcessEngine

CHAT = "/v1/chat/completions"
NOW = 1_000
SETTINGS = Settings(
    table_name="t", bucket_name="b", models={"chat": ModelRoute(endpoints=(CHAT,), queue_url="https://sqs.local/chat")}
)
#: The deployment's documented bounds (README), written out rather than read from limits.
DEPTH = 128
CUSTOM_ID = 512
MESSAGE = 500
ECHO = 100
DYNAMODB_ITEM = 400 * 1024
EVENTBRIDGE_EVENT = 256 * 1024


def request(custom_id="req-1", body=None, **over) -> dict:
    obj = {"custom_id": custom_id, "method": "POST", "url": CHAT, "body": body or {"model": "chat", "messages": []}}
    return {**obj, **over}


def text(obj) -> str:
    """The line as a client's JSON library writes it (lone surrogates become \\udXXX escapes)."""
    return json.dumps(obj)


def nested(depth: int) -> str:
    """A request line whose JSON nests exactly ``depth`` levels (the line's object is level 1)."""
    inner = "[" * (depth - 2) + "]" * (depth - 2)
    return f'{{"custom_id": "deep", "method": "POST", "url": "{CHAT}", "body": {{"model": "chat", "x": {inner}}}}}'


def raw(line: str, number: int = 1):
    (got,) = list(iter_lines([line.encode()], max_line_bytes=10**8, first_number=number))
    return got


def rejection(line: str, number: int = 1) -> tuple[str, str | None, str]:
    with pytest.raises(LineError) as info:
        check_request(parse_request(raw(line, number)), endpoint=CHAT)
    return info.value.code, info.value.param, info.value.message


def accepted(line: str) -> dict:
    obj = parse_request(raw(line))
    check_request(obj, endpoint=CHAT)
    return obj


def writable(line: BatchOutputLine) -> BatchOutputLine:
    """The result line survives the write path (JSON, UTF-8) and reads back equal."""
    return BatchOutputLine.model_validate_json(line.model_dump_json().encode("utf-8"))


# --- deep nesting ------------------------------------------------------------------------------


@pytest.mark.parametrize("depth", [DEPTH + 1, 1_000, 5_000, 100_000])
def test_a_line_nested_too_deep_is_an_invalid_json_line_with_its_number(depth):
    code, param, message = rejection(nested(depth), number=7)
    assert (code, param) == ("invalid_json_line", None)
    assert "Line 7" in message and str(DEPTH) in message


def test_nesting_up_to_the_limit_is_accepted():
    assert accepted(nested(DEPTH))["custom_id"] == "deep"


def test_a_deep_line_is_parsed_without_raising_even_deep_in_the_stack():
    # The worker and finalize parse lines from inside their own call stacks.
    def at_depth(n):
        return at_depth(n - 1) if n else rejection(nested(900))

    assert at_depth(300)[0] == "invalid_json_line"


# --- lone surrogates, NUL ---------------------------------------------------------------------


def test_a_custom_id_with_a_lone_surrogate_is_an_invalid_value_of_custom_id():
    for custom_id in ("\ud800", "a\udfffb", "\udc00\ud800"):
        code, param, message = rejection(text(request(custom_id)), number=3)
        assert (code, param) == ("invalid_value", "custom_id")
        assert message.encode("utf-8")  # the message itself is valid Unicode


@pytest.mark.parametrize(
    "body",
    [
        {"model": "chat", "messages": [{"role": "user", "content": "x\ud83dy"}]},  # in a value
        {"model": "chat", "\udead": 1},  # in a key
        {"model": "chat\udbff"},  # in the model
    ],
)
def test_a_lone_surrogate_anywhere_else_is_an_invalid_json_line(body):
    code, param, message = rejection(text(request(body=body)), number=4)
    assert (code, param) == ("invalid_json_line", None)
    assert "Line 4" in message and "surrogate" in message


def test_surrogate_pairs_and_escaped_backslashes_are_ordinary_text():
    obj = accepted(text(request("\U0001f600", {"model": "chat", "messages": [{"content": "\U0001f600 \\ud800"}]})))
    assert obj["custom_id"] == "\U0001f600" and obj["body"]["messages"][0]["content"] == "\U0001f600 \\ud800"


def test_nul_characters_are_valid_and_survive_every_write():
    obj = accepted(text(request("a\u0000b", {"model": "chat", "messages": [{"content": "\u0000"}]})))
    assert obj["custom_id"] == "a\u0000b"
    line = raw(text(obj))
    assert writable(results.error_line(results.custom_id_of(obj, line), "x", "y")).custom_id == "a\u0000b"
    answer = results.response_line(obj["custom_id"], 200, {"echo": "\u0000"}, "r")
    assert writable(answer).response.body == {"echo": "\u0000"}


# --- custom_id length ---------------------------------------------------------------------------


def test_a_custom_id_of_512_characters_is_accepted_and_513_is_an_invalid_value():
    assert accepted(text(request("c" * CUSTOM_ID)))["custom_id"] == "c" * CUSTOM_ID
    code, param, message = rejection(text(request("c" * (CUSTOM_ID + 1))))
    assert (code, param) == ("invalid_value", "custom_id") and str(CUSTOM_ID) in message


# --- echoed values ------------------------------------------------------------------------------


@pytest.mark.parametrize("field", ["url", "method"])
def test_a_huge_echoed_value_is_cut_to_a_short_prefix(field):
    value = "/v1/" + "z" * 300_000
    _code, param, message = rejection(text(request(**{field: value})))
    assert param == field
    assert len(message) <= MESSAGE
    assert "/v1/" + "z" * (ECHO - 10) in message and "\u2026" in message


# --- the same lines through ingest, the worker and finalize ------------------------------------


def ingest(lines: list[str], settings=SETTINGS):
    stores = fake_stores()
    content = ("\n".join(lines) + "\n").encode()
    record = batch_record(created_at=NOW)
    stores.batches.put(record)
    stores.objects.put(record.input_key, content)
    status = logic.ingest(stores, settings, "acme", "batch_1", now=NOW)
    return stores, status, stores.batches.get("acme", "batch_1")


def test_ingest_fails_each_hostile_line_with_its_code_param_and_line():
    good = text(request("ok"))
    lines = [
        good,
        nested(5_000),
        text(request("\ud800")),
        text(request("b", {"model": "chat", "messages": [{"content": "\udc00"}]})),
        text(request("c" * (CUSTOM_ID + 1))),
        text(request("d", url="/" + "u" * 300_000)),
        text(request("e", method="M" * 300_000)),
        text(request("f\u0000", {"model": "chat", "messages": [{"content": "\u0000"}]})),  # valid
    ]
    stores, status, batch = ingest(lines)
    assert status == "failed"
    assert [(e["code"], e["param"], e["line"]) for e in batch.errors] == [
        ("invalid_json_line", None, 2),
        ("invalid_value", "custom_id", 3),
        ("invalid_json_line", None, 4),
        ("invalid_value", "custom_id", 5),
        ("invalid_url", "url", 6),
        ("invalid_method", "method", 7),
    ]
    assert all(len(e["message"]) <= MESSAGE for e in batch.errors)
    ((_event_type, detail),) = stores.events.published
    assert len(json.dumps(detail, ensure_ascii=False).encode()) < EVENTBRIDGE_EVENT


def test_a_valid_batch_with_nul_characters_is_accepted():
    _, status, batch = ingest([text(request("a\u0000", {"model": "chat", "messages": [{"content": "\u0000"}]}))])
    assert (status, batch.total) == ("in_progress", 1)


def test_the_errors_stay_bounded_in_count_and_total_size():
    # 150 bad lines, each echoing a long value of 4-byte characters: at most 100 errors, each
    # message at most 500 characters, the whole list within one DynamoDB item and one event.
    lines = [text(request(f"r{i}", url="/\U0001f4a5" * 3_000, method="\U0001f4a5" * 3_000)) for i in range(150)]
    stores, status, batch = ingest(lines)
    assert status == "failed"
    assert len(batch.errors) == 100 and [e["line"] for e in batch.errors] == list(range(1, 101))
    assert all(len(e["message"]) <= MESSAGE for e in batch.errors)
    size = len(json.dumps(batch.errors, ensure_ascii=False).encode())
    assert size < EVENTBRIDGE_EVENT < DYNAMODB_ITEM
    ((_, detail),) = stores.events.published
    assert len(json.dumps(detail, ensure_ascii=False).encode()) < EVENTBRIDGE_EVENT


def test_a_model_or_duplicate_custom_id_echo_is_cut():
    long_model = "m" * 300_000
    _, _, batch = ingest([text(request("a", {"model": long_model}))])
    ((code, message),) = [(e["code"], e["message"]) for e in batch.errors]
    assert code == "model_not_found" and len(message) <= MESSAGE
    dup = "d" * CUSTOM_ID
    _, _, batch = ingest([text(request(dup)), text(request(dup))])
    ((code, message),) = [(e["code"], e["message"]) for e in batch.errors]
    assert code == "duplicate_custom_id" and len(message) <= MESSAGE and "d" * (ECHO - 10) in message


HOSTILE = [
    nested(5_000),
    text(request("\ud800")),
    text(request("b", {"model": "chat", "\udead": "\ud800"})),
    text(request("c" * (CUSTOM_ID + 1))),
    text(request("\u0000", {"model": "chat", "messages": [{"content": "\u0000"}]})),
]


def test_unrun_lines_of_a_chunk_of_hostile_lines_are_all_writable():
    stores = fake_stores()
    content = ("\n".join(HOSTILE) + "\n").encode()
    key = schema.batch_input_key("acme", "batch_1")
    stores.objects.put(key, content)
    message = WorkMessage(
        tenant="acme",
        batch_id="batch_1",
        chunk=0,
        input_key=key,
        byte_start=0,
        byte_end=len(content),
        first_line=1,
        line_count=len(HOSTILE),
        endpoint=CHAT,
        model="chat",
        expires_at=NOW + 86_400,
    )
    lines = list(results.unrun_lines(stores.objects, message, "batch_expired", "expired"))
    assert [l.custom_id for l in lines] == ["line-1", "line-2", "line-3", "line-4", "\u0000"]
    parts = results.write_parts(stores.objects, message, lines)
    assert (parts.completed, parts.failed) == (0, 5)
    written = stores.objects.get(schema.chunk_part_key("acme", "batch_1", 0, parts.attempt, "err"))
    assert [BatchOutputLine.model_validate_json(l).custom_id for l in written.splitlines()] == [
        l.custom_id for l in lines
    ]


def test_the_worker_turns_each_hostile_line_into_one_writable_result_line():
    from gpu_worker.line_runner import run_line

    engine = InProcessEngine()

    async def run_all():
        return [await run_line(engine, raw(l, n), endpoint=CHAT) for n, l in enumerate(HOSTILE, 1)]

    got = [writable(r.line) for r in asyncio.run(run_all())]
    assert [(l.custom_id, l.error.code if l.error else None) for l in got] == [
        ("line-1", "invalid_json_line"),
        ("line-2", "invalid_value"),
        ("line-3", "invalid_json_line"),
        ("line-4", "invalid_value"),
        ("\u0000", None),
    ]
    assert got[-1].response.status_code == 200 and len(engine.requests) == 1


def test_every_line_error_message_is_capped_even_where_a_value_is_echoed_whole():
    # Offline mode (batchctl run-batch) names a line's own url in its message with !r.
    from gpu_worker.line_runner import run_line

    huge = text(request(url="/v1/" + "q" * 300_000))
    result = asyncio.run(run_line(InProcessEngine(), raw(huge), endpoint=None, endpoints=[CHAT]))
    line = writable(result.line)
    assert line.error.code == "invalid_url" and len(line.error.message) <= MESSAGE
    assert line.error.message.endswith("\u2026")
