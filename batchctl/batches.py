"""batchctl's user commands: files and batches through the official openai SDK.

    batchctl files upload PATH [--purpose batch]
    batchctl batches create (--input PATH | --input-file-id ID) --endpoint URL [--window 24h] [--metadata k=v ...]
    batchctl batches get ID | list [--limit N] | cancel ID
    batchctl batches wait ID [--timeout S]          progress bar on request_counts until terminal
    batchctl batches download ID [-o OUT] [--errors ERR]

The API is the local deployment's (its state file) unless ``--base-url``/``BATCHAPI_BASE_URL`` or
``--aws`` (the stack's ApiUrl output) says otherwise; the key is ``--api-key``, else
``BATCHAPI_API_KEY`` or ``OPENAI_API_KEY`` (``CliSettings``), else the local key. Objects print as
JSON lines.
"""

import argparse
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TextIO

from openai import OpenAI

from functions.core import limits
from functions.core.models import TERMINAL_STATUSES
from infra import names

from .settings import CliSettings

#: Files larger than this go through the Uploads API in parts of this size (a Lambda request's limit).
PART_BYTES = limits.MAX_UPLOAD_PART_BYTES


def add_parsers(commands: argparse._SubParsersAction) -> None:
    api = argparse.ArgumentParser(add_help=False)
    api.add_argument("--base-url", help="API base URL, e.g. https://…/prod/v1 (default: the running make up, or --aws)")
    api.add_argument("--api-key", help="API key (default: $BATCHAPI_API_KEY, $OPENAI_API_KEY, or sk-local locally)")

    files = commands.add_parser("files", help="files (openai SDK)").add_subparsers(dest="action", required=True)
    upload = files.add_parser("upload", parents=[api], help="upload a file (large ones through the Uploads API)")
    upload.add_argument("path", type=Path)
    upload.add_argument("--purpose", default="batch")

    batches = commands.add_parser("batches", help="batches (openai SDK)").add_subparsers(dest="action", required=True)
    create = batches.add_parser("create", parents=[api], help="create a batch")
    source = create.add_mutually_exclusive_group(required=True)
    source.add_argument("--input", type=Path, help="a local JSONL file to upload first")
    source.add_argument("--input-file-id", help="an uploaded file with purpose batch")
    create.add_argument("--endpoint", default="/v1/chat/completions")
    create.add_argument("--window", default="24h", help="completion window")
    create.add_argument("--metadata", nargs="*", default=[], metavar="KEY=VALUE")
    for action in ("get", "cancel"):
        batches.add_parser(action, parents=[api], help=f"{action} a batch").add_argument("batch_id")
    listing = batches.add_parser("list", parents=[api], help="list batches, newest first")
    listing.add_argument("--limit", type=int, default=20)
    wait = batches.add_parser("wait", parents=[api], help="wait for a batch to end, with a progress bar")
    wait.add_argument("batch_id")
    wait.add_argument("--timeout", type=float, default=0, help="seconds (0: no limit)")
    wait.add_argument("--interval", type=float, default=2.0)
    download = batches.add_parser("download", parents=[api], help="download a batch's output and error files")
    download.add_argument("batch_id")
    download.add_argument("-o", "--output", type=Path, help="default: <batch_id>_output.jsonl")
    download.add_argument("--errors", type=Path, help="default: <batch_id>_error.jsonl")


def upload_file(client: OpenAI, path: Path, purpose: str):
    size = path.stat().st_size
    if size <= PART_BYTES:
        return client.files.create(file=(path.name, path.read_bytes()), purpose=purpose)
    upload = client.uploads.upload_file_chunked(
        file=path, mime_type="application/jsonl", purpose=purpose, bytes=size, part_size=PART_BYTES
    )
    return upload.file


def progress_line(batch) -> str:
    counts = batch.request_counts
    done = counts.completed + counts.failed if counts else 0
    total = counts.total if counts and counts.total else 0
    width = 30
    filled = int(width * done / total) if total else 0
    return f"{batch.status:<11} [{'#' * filled:<{width}}] {done}/{total or '?'} (failed {counts.failed if counts else 0})"


def wait_for(client: OpenAI, batch_id: str, *, timeout: float, interval: float, err: TextIO,
             sleep: Callable[[float], None] = time.sleep, clock: Callable[[], float] = time.monotonic):
    deadline = clock() + timeout if timeout else None
    while True:
        batch = client.batches.retrieve(batch_id)
        print(f"\r{progress_line(batch)}", end="", file=err, flush=True)
        if batch.status in TERMINAL_STATUSES:
            print(file=err)
            return batch
        if deadline is not None and clock() >= deadline:
            print(file=err)
            raise TimeoutError(f"batch {batch_id} is still {batch.status} after {timeout}s")
        sleep(interval)


def run(args: argparse.Namespace, client: OpenAI, *, out: TextIO, err: TextIO) -> int:
    if args.command == "files":
        print(upload_file(client, args.path, args.purpose).model_dump_json(), file=out)
        return 0
    action = args.action
    if action == "create":
        file_id = args.input_file_id or upload_file(client, args.input, "batch").id
        metadata = dict(item.split("=", 1) for item in args.metadata) or None
        batch = client.batches.create(
            input_file_id=file_id, endpoint=args.endpoint, completion_window=args.window, metadata=metadata
        )
    elif action == "get":
        batch = client.batches.retrieve(args.batch_id)
    elif action == "cancel":
        batch = client.batches.cancel(args.batch_id)
    elif action == "list":
        for item in client.batches.list(limit=args.limit).data:
            print(item.model_dump_json(), file=out)
        return 0
    elif action == "wait":
        batch = wait_for(client, args.batch_id, timeout=args.timeout, interval=args.interval, err=err)
        print(batch.model_dump_json(), file=out)
        return 0 if batch.status == "completed" else 1
    else:  # download
        batch = client.batches.retrieve(args.batch_id)
        wrote = 0
        for file_id, path in (
            (batch.output_file_id, args.output or Path(f"{batch.id}_output.jsonl")),
            (batch.error_file_id, args.errors or Path(f"{batch.id}_error.jsonl")),
        ):
            if file_id:
                client.files.content(file_id).write_to_file(path)
                print(f"{path}", file=out)
                wrote += 1
        if not wrote:
            print(f"batchctl: batch {batch.id} ({batch.status}) has no output or error file yet", file=err)
            return 1
        return 0
    print(batch.model_dump_json(), file=out)
    return 0


def api_client(args: argparse.Namespace, settings: CliSettings, *, local_base_url: str | None,
               aws_base_url: Callable[[], str]) -> OpenAI:
    """The SDK client for the chosen deployment."""
    base_url = args.base_url or settings.base_url
    key = args.api_key or settings.api_key
    if not base_url:
        if args.target != "aws" and local_base_url:
            base_url, key = local_base_url, key or names.LOCAL_KEY
        else:
            base_url = aws_base_url()
    if not key:
        raise ValueError("an API key is needed: --api-key, or BATCHAPI_API_KEY / OPENAI_API_KEY")
    return OpenAI(base_url=base_url, api_key=key)


def main_user(args: argparse.Namespace, settings: CliSettings, *, local_base_url: str | None,
              aws_base_url: Callable[[], str], out: TextIO, err: TextIO) -> int:
    try:
        client = api_client(args, settings, local_base_url=local_base_url, aws_base_url=aws_base_url)
        return run(args, client, out=out, err=err)
    except Exception as exc:  # noqa: BLE001 - a CLI: one line, exit 1
        print(f"batchctl: {exc}", file=err or sys.stderr)
        return 1
