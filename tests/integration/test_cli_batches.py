"""batchctl's user commands (files, batches) through the openai SDK against the in-process API."""

import argparse
import io
import json
import os

import pytest
from openai.types import Batch, FileObject

from batchctl import batches as cli_batches
from batchctl.settings import CliSettings
from tests.fakes.engine import REJECTED, InProcessEngine, chat_answer, content
from tests.integration.batch_helpers import line, run_ingest, submit, take_work
from tests.integration.worker.harness import run_one_chunk


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    parser.add_argument("--aws", dest="target", action="store_const", const="aws")
    cli_batches.add_parsers(parser.add_subparsers(dest="command", required=True))
    return parser.parse_args(argv)


def run(client, *argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = cli_batches.run(parse(*argv), client, out=out, err=err)
    return code, out.getvalue(), err.getvalue()


def test_upload_small_and_large_files(client, tmp_path, stores):
    small = tmp_path / "small.jsonl"
    small.write_text(line(0) + "\n")
    code, out, _ = run(client, "files", "upload", str(small))
    assert code == 0 and FileObject.model_validate_json(out).bytes == small.stat().st_size
    big = tmp_path / "big.jsonl"
    big.write_bytes(os.urandom(cli_batches.PART_BYTES + 100))  # over one part: the Uploads API
    code, out, _ = run(client, "files", "upload", str(big), "--purpose", "user_data")
    uploaded = FileObject.model_validate_json(out)
    assert code == 0 and uploaded.bytes == big.stat().st_size
    # (its content would be a redirect to S3, which the in-process moto does not serve)
    assert stores.objects.get(stores.files.get("acme", uploaded.id, now=0).s3_key) == big.read_bytes()


def test_batch_commands(client, tmp_path, deployed):
    src = tmp_path / "in.jsonl"
    src.write_text("\n".join(line(i) for i in range(3)) + "\n")
    code, out, _ = run(client, "batches", "create", "--input", str(src), "--metadata", "team=nlp", "run=1")
    batch = Batch.model_validate_json(out)
    assert code == 0 and batch.metadata == {"team": "nlp", "run": "1"} and batch.status == "validating"
    run_ingest()
    assert Batch.model_validate_json(run(client, "batches", "get", batch.id)[1]).status == "in_progress"
    code, out, _ = run(client, "batches", "list", "--limit", "5")
    assert [json.loads(row)["id"] for row in out.splitlines()] == [batch.id]
    assert Batch.model_validate_json(run(client, "batches", "cancel", batch.id)[1]).status == "cancelling"
    code, _, err = run(client, "batches", "download", batch.id)
    assert code == 1 and "no output or error file" in err


def test_wait_shows_progress_and_times_out(client, tmp_path):
    src = tmp_path / "in.jsonl"
    src.write_text(line(0) + "\n")
    batch = Batch.model_validate_json(run(client, "batches", "create", "--input", str(src))[1])
    err = io.StringIO()
    ticks = iter(range(100))
    with pytest.raises(TimeoutError, match="still validating"):
        cli_batches.wait_for(
            client, batch.id, timeout=3, interval=1, err=err, sleep=lambda _: None, clock=lambda: next(ticks)
        )
    assert "validating" in err.getvalue() and "0/?" in err.getvalue()


def test_api_client_resolution():
    args = parse("batches", "list")
    args.base_url = args.api_key = None
    local = cli_batches.api_client(
        args, CliSettings.from_env({}), local_base_url="http://127.0.0.1:8080/v1", aws_base_url=lambda: "x"
    )
    assert str(local.base_url).startswith("http://127.0.0.1:8080/v1") and local.api_key == "sk-local"
    aws = cli_batches.api_client(
        args,
        CliSettings.from_env({"OPENAI_API_KEY": "sk-x"}),
        local_base_url=None,
        aws_base_url=lambda: "https://api.example/prod/v1",
    )
    assert str(aws.base_url).startswith("https://api.example/prod/v1") and aws.api_key == "sk-x"
    with pytest.raises(ValueError, match="API key"):
        cli_batches.api_client(
            args, CliSettings.from_env({}), local_base_url=None, aws_base_url=lambda: "https://api.example/prod/v1"
        )


# --- retry: a finished batch's failed and never-run requests as a new batch ---------------------

#: The deployment's default: an open batch is finalized by the sweeper 900 s past its expiry.
EXPIRY_GRACE = 900


def failing_engine() -> InProcessEngine:
    """ "hi 1" gets a 500 (transient), "hi 2" a 400 (rejected), every other a chat answer."""

    def respond(path, body, seen):
        text = content(body)
        if text == "hi 1":
            return 500, {"error": {"message": "engine overloaded", "type": "server_error", "param": None, "code": 500}}
        if text == "hi 2":
            return 400, REJECTED
        return 200, chat_answer(body)

    return InProcessEngine(respond)


def expired_with_failures(client, stores, deployed, clock, monkeypatch, metadata=None):
    """A batch of 6 requests in two chunks: the first runs (req-0 ok, req-1 a 500, req-2 a 400), the
    second never does and the batch expires (req-3..5 batch_expired). Its workflow never starts, so
    the sweeper ends it (as in test_sweeper.py)."""
    from functions.sweeper import handler as sweeper_handler
    from infra.local.lambda_context import LocalLambdaContext

    monkeypatch.setattr(stores.workflows, "start", lambda name, payload: None)
    rows = [line(i) for i in range(6)]
    batch = submit(client, ("\n".join(rows) + "\n").encode(), window="30s", metadata=metadata)
    run_ingest()
    first, _second = take_work(deployed)
    assert run_one_chunk(stores, first, engine=failing_engine()).outcome.counted
    clock.now = batch.expires_at + EXPIRY_GRACE
    assert sweeper_handler.handler({"source": "aws.events"}, LocalLambdaContext("sweeper"))["actions"] == {"expired": 1}
    done = client.batches.retrieve(batch.id)
    assert done.status == "expired" and done.error_file_id
    codes = [
        (l["custom_id"], (l["error"] or {}).get("code"), (l["response"] or {}).get("status_code"))
        for l in map(json.loads, client.files.content(done.error_file_id).text.splitlines())
    ]
    assert codes == [
        ("req-1", None, 500),
        ("req-2", None, 400),
        ("req-3", "batch_expired", None),
        ("req-4", "batch_expired", None),
        ("req-5", "batch_expired", None),
    ]
    return done, rows


def retried(client, out: str):
    new = client.batches.retrieve(out.strip())
    return new, client.files.content(new.input_file_id).text.splitlines()


@pytest.mark.settings(chunk_max_lines=3)
def test_retry_resubmits_the_failed_and_expired_requests_in_input_order(client, stores, deployed, clock, monkeypatch):
    done, rows = expired_with_failures(client, stores, deployed, clock, monkeypatch, metadata={"team": "nlp"})
    code, out, err = run(client, "batches", "retry", done.id)
    assert code == 0, err
    new, sent = retried(client, out)
    # the default (retryable): the 500 and the three that never ran, not the 400; lines unchanged
    assert sent == [rows[1], rows[3], rows[4], rows[5]]
    assert new.endpoint == "/v1/chat/completions" and new.completion_window == "30s"
    assert new.metadata == {"team": "nlp", "retry_of": done.id} and new.id != done.id
    assert "retrying 4 of the 5 error lines" in err and "status 400 x1" in err
    # --only all adds the engine's rejection; --only never-ran keeps the expired ones only
    assert retried(client, run(client, "batches", "retry", done.id, "--only", "all")[1])[1] == rows[1:]
    assert retried(client, run(client, "batches", "retry", done.id, "--only", "never-ran")[1])[1] == rows[3:]


@pytest.mark.settings(chunk_max_lines=3)
def test_retry_with_full_metadata_keeps_the_pairs_and_warns(client, stores, deployed, clock, monkeypatch):
    full = {f"k{i}": str(i) for i in range(16)}  # the API's limit: 16 pairs
    done, rows = expired_with_failures(client, stores, deployed, clock, monkeypatch, metadata=full)
    code, out, err = run(client, "batches", "retry", done.id)
    new, sent = retried(client, out)
    assert code == 0 and sent == [rows[1], rows[3], rows[4], rows[5]]
    assert new.metadata == full and "retry_of is not recorded" in err


def test_retry_refuses_a_batch_that_failed_validation(client, tmp_path):
    bad = submit(client, (line(0) + "\n" + line(0) + "\n").encode())  # a duplicate custom_id
    run_ingest()
    failed = client.batches.retrieve(bad.id)
    assert failed.status == "failed" and failed.error_file_id is None and failed.errors
    code, out, err = run(client, "batches", "retry", bad.id)
    assert code == 1 and out == ""
    assert "failed validation" in err and "duplicate_custom_id" in err
    assert [b.id for b in client.batches.list().data] == [bad.id]  # nothing created


def test_retry_refuses_a_batch_still_running(client):
    batch = submit(client, (line(0) + "\n").encode())
    code, out, err = run(client, "batches", "retry", batch.id)
    assert code == 1 and out == "" and "still validating" in err and f"batches wait {batch.id}" in err
