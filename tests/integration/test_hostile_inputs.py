"""Hostile batch input through the official SDK and the real ingest handler (docs/api.md, "Hostile content and file names"):
each hostile line fails its batch with the right code, param and line, the errors stay bounded,
and the ingest handler never raises (its queue is empty afterwards, the batch is terminal)."""

import json

import pytest

from functions.core import clients
from tests.integration.batch_helpers import (
    CHAT,
    executions,
    line,
    run_ingest,
    submit,
    take_work,
    wait_for_execution,
    wait_for_task_token,
)
from tests.integration.worker.harness import run_one_chunk

#: The README's bounds, written out.
MESSAGE = 500
CUSTOM_ID = 512
DYNAMODB_ITEM = 400 * 1024
EVENTBRIDGE_EVENT = 256 * 1024


def ingest_queue_left() -> int:
    from infra.local.resources import ingest_queue_url
    from tests.conftest import PREFIX

    attrs = clients.client("sqs").get_queue_attributes(
        QueueUrl=ingest_queue_url(clients.client, PREFIX),
        AttributeNames=["ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible"],
    )["Attributes"]
    return int(attrs["ApproximateNumberOfMessages"]) + int(attrs["ApproximateNumberOfMessagesNotVisible"])


def with_fields(i: int, **fields) -> str:
    return json.dumps({**json.loads(line(i)), **fields})


def deep(i: int, depth: int = 5_000) -> str:
    obj = json.loads(line(i))
    text = json.dumps(obj)
    return text[:-1] + ', "nested": ' + "[" * depth + "]" * depth + "}"


def surrogate_in_body(i: int) -> str:
    obj = json.loads(line(i))
    obj["body"]["messages"][0]["content"] = "hi \udc00"
    return json.dumps(obj)


CASES = {
    "deep_nesting": (deep(1), ("invalid_json_line", None)),
    "lone_surrogate_custom_id": (with_fields(1, custom_id="\ud800"), ("invalid_value", "custom_id")),
    "lone_surrogate_in_body": (surrogate_in_body(1), ("invalid_json_line", None)),
    "lone_surrogate_key": (with_fields(1, **{"\udbff": 1}), ("invalid_json_line", None)),
    "custom_id_too_long": (with_fields(1, custom_id="c" * (CUSTOM_ID + 1)), ("invalid_value", "custom_id")),
    "huge_url": (with_fields(1, url="/v1/" + "u" * 400_000), ("invalid_url", "url")),
    "huge_method": (with_fields(1, method="M" * 400_000), ("invalid_method", "method")),
}


def fail_batch(client, content: bytes):
    batch = submit(client, content)
    run_ingest()
    assert ingest_queue_left() == 0  # the handler never raised: nothing left to redeliver
    return client.batches.retrieve(batch.id)


@pytest.mark.parametrize("case", list(CASES))
def test_a_hostile_line_fails_its_batch_with_its_code_and_line(client, deployed, case):
    hostile, (code, param) = CASES[case]
    content = (line(0) + "\n" + hostile + "\n" + line(2) + "\n").encode()
    failed = fail_batch(client, content)
    assert failed.status == "failed" and failed.failed_at is not None
    assert [(e.code, e.param, e.line) for e in failed.errors.data] == [(code, param, 2)]
    assert all(len(e.message) <= MESSAGE for e in failed.errors.data)
    assert take_work(deployed) == [] and executions(deployed) == []


def test_many_huge_echoed_values_keep_the_errors_bounded(client, deployed):
    # each echo today would be 8 KB: 100 of them overflow a DynamoDB item and an event
    lines = [with_fields(i, method="\U0001f4a5" * 2_000) for i in range(150)]
    failed = fail_batch(client, ("\n".join(lines) + "\n").encode())
    assert failed.status == "failed"
    assert [e.line for e in failed.errors.data] == list(range(1, 101))
    assert all(len(e.message) <= MESSAGE for e in failed.errors.data)
    size = len(json.dumps([e.model_dump() for e in failed.errors.data], ensure_ascii=False).encode())
    assert size < EVENTBRIDGE_EVENT < DYNAMODB_ITEM


def test_nul_characters_are_valid_input(client, deployed):
    obj = json.loads(line(0))
    obj["custom_id"] = "a\u0000b"
    obj["body"]["messages"][0]["content"] = "\u0000"
    batch = submit(client, (json.dumps(obj) + "\n" + line(1) + "\n").encode())
    run_ingest()
    assert ingest_queue_left() == 0
    current = client.batches.retrieve(batch.id)
    assert current.status == "in_progress" and current.request_counts.total == 2
    (work,) = take_work(deployed)
    assert (work.first_line, work.line_count) == (1, 2)


# --- hostile content that runs: to a terminal batch whose files agree with its counts ------------
#: The README's line limit, written out: a line's bytes without its CR/LF (and the file's BOM).
LINE_LIMIT = 1024 * 1024


class HttpEngine:
    """The worker's real HTTP engine client (its production response bound) against ``url``, one
    client per request: what ``run_one_chunk`` hands to the chunk path instead of the in-process
    engine when the bytes on the wire matter."""

    def __init__(self, url: str):
        self.url = url

    async def post(self, path, body):
        from gpu_worker.engine_client import EngineClient

        async with EngineClient(self.url, max_in_flight=4) as engine:
            return await engine.post(path, body)


def run_to_end(client, stores, deployed, content: bytes, engine=None):
    """Submit ``content``, ingest it, run every chunk through the worker's chunk path, wait for the
    workflow: the batch as the SDK then sees it."""
    batch = submit(client, content)
    run_ingest()
    assert ingest_queue_left() == 0
    wait_for_task_token(stores, "acme", batch.id)
    for message in take_work(deployed):
        run_one_chunk(stores, message, engine=engine)
    assert wait_for_execution(deployed, batch.id)["status"] == "SUCCEEDED"
    return client.batches.retrieve(batch.id)


def result_lines(client, file_id) -> list[dict]:
    if file_id is None:
        return []
    return [json.loads(raw) for raw in client.files.content(file_id).content.splitlines()]


def assert_files_agree(client, batch, custom_ids: list[str]) -> tuple[list[dict], list[dict]]:
    """Terminal; completed == output lines, failed == error lines, each custom_id exactly once."""
    assert batch.status == "completed", batch
    out, err = result_lines(client, batch.output_file_id), result_lines(client, batch.error_file_id)
    counts = batch.request_counts
    assert (counts.completed, counts.failed, counts.total) == (len(out), len(err), len(custom_ids))
    assert sorted(l["custom_id"] for l in out + err) == sorted(custom_ids)
    assert all(l["response"]["status_code"] == 200 for l in out) and all(
        l["response"] is None or l["response"]["status_code"] >= 400 for l in err
    )
    return out, err


def with_content(i: int, text: str, custom_id: str | None = None) -> str:
    obj = json.loads(line(i))
    obj["body"]["messages"][0]["content"] = text
    if custom_id is not None:
        obj["custom_id"] = custom_id
    return json.dumps(obj, ensure_ascii=False)  # raw UTF-8, as most writers send it (NUL stays \u0000)


def padded_to(i: int, size: int) -> str:
    """A valid request line of exactly ``size`` bytes (its content padded with "x")."""
    base = with_content(i, "")
    return with_content(i, "x" * (size - len(base.encode())))


@pytest.mark.workflow
def test_nul_in_a_custom_id_and_in_content_runs_and_is_written_back_exactly(client, stores, deployed):
    ids = ["a\u0000b", "req-1"]
    content = (with_content(0, "nul \u0000 here", custom_id=ids[0]) + "\n" + line(1) + "\n").encode()
    done = run_to_end(client, stores, deployed, content)
    out, err = assert_files_agree(client, done, ids)
    assert err == [] and out[0]["custom_id"] == "a\u0000b"
    assert out[0]["response"]["body"]["choices"][0]["message"]["content"] == "echo nul \u0000 here"


@pytest.mark.workflow
def test_a_500_kb_message_runs_to_completion(client, stores, deployed):
    big = "é" * 250_000  # 500,000 bytes of UTF-8, half the line limit
    content = (with_content(0, big) + "\n" + line(1) + "\n").encode()
    done = run_to_end(client, stores, deployed, content)
    out, err = assert_files_agree(client, done, ["req-0", "req-1"])
    assert err == [] and out[0]["response"]["body"]["choices"][0]["message"]["content"] == "echo " + big


@pytest.mark.workflow
def test_a_line_exactly_at_the_line_limit_runs(client, stores, deployed):
    at_limit = padded_to(0, LINE_LIMIT)
    assert len(at_limit.encode()) == LINE_LIMIT
    done = run_to_end(client, stores, deployed, (at_limit + "\r\n" + line(1) + "\n").encode())
    assert_files_agree(client, done, ["req-0", "req-1"])


def test_a_line_one_byte_over_the_line_limit_fails_the_batch_at_its_line(client, deployed):
    over = padded_to(1, LINE_LIMIT + 1)
    failed = fail_batch(client, (line(0) + "\n" + over + "\n" + line(2) + "\n").encode())
    assert failed.status == "failed" and failed.output_file_id is None and failed.error_file_id is None
    assert [(e.code, e.line) for e in failed.errors.data] == [("line_too_large", 2)]
    assert take_work(deployed) == []


@pytest.mark.parametrize(
    "bad",
    [b"\xff\xfe", b"\xc3\x28", b"\xed\xa0\x80", b"\xf4\x90\x80\x80"],
    ids=["invalid-start", "bad-continuation", "encoded-surrogate", "above-u10ffff"],
)
def test_invalid_utf8_fails_the_batch_at_its_line(client, deployed, bad):
    hostile = line(1).encode().replace(b"hi 1", b"hi " + bad)
    failed = fail_batch(client, line(0).encode() + b"\n" + hostile + b"\n" + line(2).encode() + b"\n")
    assert failed.status == "failed" and failed.output_file_id is None and failed.error_file_id is None
    assert [(e.code, e.line) for e in failed.errors.data] == [("invalid_json_line", 2)]
    assert failed.request_counts is None or failed.request_counts.completed == failed.request_counts.failed == 0
    assert take_work(deployed) == []


@pytest.mark.workflow
def test_a_bom_crlf_file_with_blank_lines_runs_with_the_files_own_line_numbers(client, stores, deployed):
    content = b"\xef\xbb\xbf" + line(0).encode() + b"\r\n\r\n   \r\n" + line(1).encode() + b"\r\n" + line(2).encode()
    done = run_to_end(client, stores, deployed, content)
    out, err = assert_files_agree(client, done, ["req-0", "req-1", "req-2"])
    assert err == [] and [l["custom_id"] for l in out] == ["req-0", "req-1", "req-2"]


@pytest.mark.parametrize("content", [b"\n\n\n", b"\r\n \t\r\n", b"\xef\xbb\xbf\n"], ids=["lf", "crlf-spaces", "bom"])
def test_a_file_of_only_blank_lines_fails_as_empty(client, deployed, content):
    failed = fail_batch(client, content)
    assert failed.status == "failed" and [e.code for e in failed.errors.data] == ["empty_file"]
    assert failed.output_file_id is None and failed.error_file_id is None
    assert take_work(deployed) == [] and executions(deployed) == []


@pytest.mark.workflow
def test_an_engine_answer_over_the_response_bound_is_an_error_line_and_the_batch_completes(client, stores, deployed):
    from tests.fakes.engine import FakeEngine, chat_answer
    from tests.fakes.engine import content as content_of

    huge = "z" * (8 * 1024 * 1024 + 1)  # one byte over the worker's 8 MiB response bound
    engine = FakeEngine(
        lambda path, body, seen: (200, huge) if content_of(body) == "hi 1" else (200, chat_answer(body))
    ).start()
    try:
        done = run_to_end(
            client, stores, deployed, "".join(line(i) + "\n" for i in range(3)).encode(), HttpEngine(engine.url)
        )
    finally:
        engine.stop()
    out, err = assert_files_agree(client, done, ["req-0", "req-1", "req-2"])
    assert [l["custom_id"] for l in out] == ["req-0", "req-2"]
    (too_large,) = err
    assert too_large["custom_id"] == "req-1" and too_large["error"]["code"] == "response_too_large"
    assert str(8 * 1024 * 1024) in too_large["error"]["message"]
    assert engine.contents().count("hi 1") == 1  # not retried


def test_the_most_errors_with_the_longest_echoes_fit_an_item_and_an_event(client, deployed):
    """150 failing lines (more than the 100 reported), each echoing a huge 4-byte-character value
    (a too-long custom_id, a 40 KB url): the failed batch, errors and all, stays under
    EventBridge's event and DynamoDB's item, every message within its bound."""
    emoji = "\U0001f4a5"
    lines = [
        json.dumps(
            {
                **json.loads(line(i)),
                **({"custom_id": emoji * (CUSTOM_ID + 1)} if i % 2 else {"url": "/v1/" + emoji * 10_000}),
            },
            ensure_ascii=False,
        )
        for i in range(150)
    ]
    failed = fail_batch(client, ("\n".join(lines) + "\n").encode())
    assert failed.status == "failed" and len(failed.errors.data) == 100
    assert [e.line for e in failed.errors.data] == list(range(1, 101))
    assert [e.code for e in failed.errors.data[:2]] == ["invalid_url", "invalid_value"]
    assert all(len(e.message) <= MESSAGE for e in failed.errors.data)
    size = len(json.dumps(failed.model_dump(), ensure_ascii=False).encode())
    assert size < EVENTBRIDGE_EVENT < DYNAMODB_ITEM
    assert take_work(deployed) == []
