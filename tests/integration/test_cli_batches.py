"""batchctl's user commands (files, batches) through the openai SDK against the in-process API."""

import argparse
import io
import json
import os

import pytest
from openai.types import Batch, FileObject

from batchctl import batches as cli_batches
from batchctl.settings import CliSettings
from tests.integration.batch_helpers import line, run_ingest


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
        cli_batches.wait_for(client, batch.id, timeout=3, interval=1, err=err, sleep=lambda _: None, clock=lambda: next(ticks))
    assert "validating" in err.getvalue() and "0/?" in err.getvalue()


def test_api_client_resolution():
    args = parse("batches", "list")
    args.base_url = args.api_key = None
    local = cli_batches.api_client(args, CliSettings.from_env({}), local_base_url="http://127.0.0.1:8080/v1", aws_base_url=lambda: "x")
    assert str(local.base_url).startswith("http://127.0.0.1:8080/v1") and local.api_key == "sk-local"
    aws = cli_batches.api_client(args, CliSettings.from_env({"OPENAI_API_KEY": "sk-x"}), local_base_url=None, aws_base_url=lambda: "https://api.example/prod/v1")
    assert str(aws.base_url).startswith("https://api.example/prod/v1") and aws.api_key == "sk-x"
    with pytest.raises(ValueError, match="API key"):
        cli_batches.api_client(args, CliSettings.from_env({}), local_base_url=None, aws_base_url=lambda: "https://api.example/prod/v1")
