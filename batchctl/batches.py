"""batchctl's user commands: files and batches through the official openai SDK.

    batchctl files upload PATH [--purpose batch]
    batchctl batches create (--input PATH | --input-file-id ID) --endpoint URL [--window 24h] [--metadata k=v ...]
    batchctl batches get ID | list [--limit N] | cancel ID
    batchctl batches wait ID [--timeout S] [--interval S]   progress bar until the batch ends
    batchctl batches retry ID [--only retryable|never-ran|all]   a new batch of the failed requests
    batchctl batches download ID [-o OUT] [--errors ERR]

``wait`` polls the batch every ``--interval`` seconds. On a terminal it redraws one line in place:
status, a bar of completed+failed out of total, the percentage, the failed count, the rate (lines
per second since wait started watching) and the ETA at that rate; elsewhere (a pipe, a log) it
prints that line only when something changed, or at least every ``PLAIN_EVERY_SECONDS``. It prints
the final batch as JSON on stdout and exits 0 if the batch completed, 1 if it ended otherwise
(failed, expired, cancelled) or a call failed, and ``EXIT_TIMEOUT`` (3) if ``--timeout`` passed
first (the batch still runs).

``retry`` builds a new batch from a finished batch's error file: the lines ``--only`` selects (see
``retry_class``), their original request lines taken from the batch's input file (same custom_id,
input order, bytes unchanged), uploaded as a new file and submitted with the same endpoint,
completion window and metadata plus ``retry_of: <batch id>``; it prints the new batch's id. Classes:
``never_ran`` (batch_expired, batch_cancelled, batch_failed, batch_incomplete: never reached the
engine), ``transient`` (no engine answer: engine_crashed, chunk_failed, server_error, engine
timeouts and connection errors, any unknown code; or an engine answer 408, 429 or 5xx),
``rejected`` (the engine answered another 4xx, e.g. a context-length error, or the answer was over
the size limit, response_too_large: the same request would most likely fail again) and
``invalid`` (the request line itself is invalid: never retried). ``--only never-ran`` takes
never_ran, ``retryable`` (the default) never_ran and transient, ``all`` every class but invalid.
A batch still running, a batch with no error file, and a batch that failed validation (status
failed with ``errors``: none of its requests ran; fix the input and create a new batch) are
refused with exit 1, as is an error file of which ``--only`` selects nothing. Metadata keeps the
original pairs; ``retry_of`` replaces an earlier one (it names the batch retried, the parent), and
is left out, with a warning, if the original already has the 16 pairs a batch may carry.

The API is the local deployment's (its state file) unless ``--base-url``/``BATCHAPI_BASE_URL`` or
``--aws`` (the stack's ApiUrl output) says otherwise; the key is ``--api-key``, else
``BATCHAPI_API_KEY`` or ``OPENAI_API_KEY`` (``CliSettings``), else the local key. Objects print as
JSON lines.
"""

import argparse
import json
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO, cast

from openai import OpenAI
from openai.types import Batch, FilePurpose

from functions.core import guard, limits
from functions.core.wire import TERMINAL_STATUSES
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
    retry = batches.add_parser(
        "retry", parents=[api], help="a new batch of a finished batch's failed, expired or cancelled requests"
    )
    retry.add_argument("batch_id")
    retry.add_argument(
        "--only",
        choices=tuple(RETRY_SELECTIONS),
        default="retryable",
        help="never-ran: expired/cancelled/batch failure only; retryable (default): also transient "
        "failures (no engine answer, 408/429/5xx); all: also other engine rejections (4xx)",
    )
    download = batches.add_parser("download", parents=[api], help="download a batch's output and error files")
    download.add_argument("batch_id")
    download.add_argument("-o", "--output", type=Path, help="default: <batch_id>_output.jsonl")
    download.add_argument("--errors", type=Path, help="default: <batch_id>_error.jsonl")


def upload_file(client: OpenAI, path: Path, purpose: FilePurpose):
    size = path.stat().st_size
    if size <= PART_BYTES:
        return client.files.create(file=(path.name, path.read_bytes()), purpose=purpose)
    upload = client.uploads.upload_file_chunked(
        file=path, mime_type="application/jsonl", purpose=purpose, bytes=size, part_size=PART_BYTES
    )
    return upload.file


#: Exit code of ``wait`` when ``--timeout`` passed before the batch ended (2 is argparse's usage error).
EXIT_TIMEOUT = 3
#: Off a terminal, ``wait`` prints a line when the status or counts change, or after this long.
PLAIN_EVERY_SECONDS = 60.0
BAR_WIDTH = 30


def duration(seconds: float) -> str:
    """``H:MM:SS`` (``M:SS`` under an hour), rounded up to the second."""
    total = int(-(-seconds // 1))
    hours, rest = divmod(total, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes}:{secs:02d}"


def render(status: str, done: int, failed: int, total: int, rate: float | None, *, width: int = BAR_WIDTH) -> str:
    """One progress line: status, bar, done/total, percentage, failed, rate and ETA. ``total`` 0 is
    unknown (validating); ``rate`` None is not measured yet (the ETA then shows ``?``)."""
    if not total:
        return f"{status:<11} [{' ' * width}] {done}/?"
    filled = min(width, width * done // total)
    line = f"{status:<11} [{'#' * filled:<{width}}] {done}/{total} {100 * done // total:3d}% failed {failed}"
    if rate is not None:
        line += f" {rate:.1f} lines/s"
    if done >= total:
        return line
    eta = duration((total - done) / rate) if rate else "?"
    return f"{line} ETA {eta}"


@dataclass
class Progress:
    """The rate seen by one ``wait``: lines done since its first observation of a known total,
    over the time since then (``now`` from the caller's monotonic clock)."""

    width: int = BAR_WIDTH
    _start: tuple[float, int] | None = field(default=None, repr=False)

    def line(self, status: str, done: int, failed: int, total: int, now: float) -> str:
        rate = None
        if total:
            if self._start is None:
                self._start = (now, done)
            elif now > self._start[0]:
                rate = (done - self._start[1]) / (now - self._start[0])
        return render(status, done, failed, total, rate, width=self.width)

    def batch_line(self, batch: Any, now: float) -> str:
        counts = batch.request_counts
        if counts is None:
            return self.line(batch.status, 0, 0, 0, now)
        return self.line(batch.status, counts.completed + counts.failed, counts.failed, counts.total or 0, now)


def progress_line(batch: Any) -> str:
    """A batch's progress with no rate (one observation)."""
    return Progress().batch_line(batch, 0.0)


def _state(batch: Any) -> tuple[Any, ...]:
    counts = batch.request_counts
    return (
        batch.status,
        counts.completed if counts else 0,
        counts.failed if counts else 0,
        counts.total if counts else 0,
    )


def wait_for(
    client: OpenAI,
    batch_id: str,
    *,
    timeout: float,
    interval: float,
    err: TextIO,
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.monotonic,
    tty: bool | None = None,
):
    """Poll ``batch_id`` until it is terminal (returned) or ``timeout`` seconds pass (TimeoutError;
    0: no limit). On a terminal (``tty``, default ``err.isatty()``) one line redrawn in place;
    otherwise a line per change, or per ``PLAIN_EVERY_SECONDS``."""
    tty = err.isatty() if tty is None else tty
    start = clock()
    deadline = start + timeout if timeout else None
    progress = Progress()
    printed: tuple[tuple[Any, ...], float] | None = None
    while True:
        batch = client.batches.retrieve(batch_id)
        now = clock()
        text = progress.batch_line(batch, now)
        terminal = batch.status in TERMINAL_STATUSES
        if tty:
            print(f"\r{text}\x1b[K", end="\n" if terminal else "", file=err, flush=True)
        elif printed is None or printed[0] != _state(batch) or now - printed[1] >= PLAIN_EVERY_SECONDS or terminal:
            print(text, file=err, flush=True)
            printed = (_state(batch), now)
        if terminal:
            return batch
        if deadline is not None and now >= deadline:
            if tty:
                print(file=err)
            raise TimeoutError(f"batch {batch_id} is still {batch.status} after {timeout:g}s")
        sleep(interval)


#: Why a request is in the error file, by class (``retry_class``), and what ``--only`` takes.
NEVER_RAN_CODES = frozenset({"batch_expired", "batch_cancelled", "batch_failed", "batch_incomplete"})
#: The request line itself is invalid (the line checks of functions/core/lines.py and ingest): the
#: same line fails the same way, so it is never retried.
INVALID_LINE_CODES = frozenset(
    {
        "invalid_json_line",
        "invalid_method",
        "invalid_url",
        "invalid_value",
        "line_too_large",
        "missing_required_parameter",
        "duplicate_custom_id",
        "model_not_found",
        "mismatched_model",
    }
)
#: No engine answer, but the same request would most likely fail again (under the same tenant
#: policy, a refused prompt or a blocked result, a check past its time or size bound:
#: functions/core/guard.py; a check whose process died is transient).
REJECTED_CODES = frozenset(
    {
        "response_too_large",
        guard.PROMPT_SECRET_DETECTED,
        guard.OUTPUT_BLOCKED,
        guard.POLICY_CHECK_TIMEOUT,
        guard.POLICY_CHECK_INPUT_TOO_LARGE,
    }
)
#: Engine answers worth another try: request timeout, rate limited, server errors.
TRANSIENT_STATUSES = frozenset({408, 429})
RETRY_SELECTIONS: dict[str, frozenset[str]] = {
    "never-ran": frozenset({"never_ran"}),
    "retryable": frozenset({"never_ran", "transient"}),
    "all": frozenset({"never_ran", "transient", "rejected"}),
}
RETRY_OF = "retry_of"


def retry_class(line: dict[str, Any]) -> str:
    """``never_ran``, ``transient``, ``rejected`` or ``invalid`` for one error-file line."""
    response = line.get("response")
    if isinstance(response, dict):
        status = response.get("status_code")
        if isinstance(status, int) and (status in TRANSIENT_STATUSES or status >= 500):
            return "transient"
        return "rejected"
    code = (line.get("error") or {}).get("code")
    if code in NEVER_RAN_CODES:
        return "never_ran"
    if code in INVALID_LINE_CODES:
        return "invalid"
    if code in REJECTED_CODES:
        return "rejected"
    return "transient"


def _reason(line: dict[str, Any]) -> str:
    response = line.get("response")
    if isinstance(response, dict):
        return f"status {response.get('status_code')}"
    return str((line.get("error") or {}).get("code"))


class RetryRefused(Exception):
    """The batch cannot be retried (the message says why)."""


def _lines(chunks: Iterable[bytes]) -> Iterator[bytes]:
    """Lines of a byte stream, without their line ending, blank ones skipped."""
    rest = b""
    for chunk in chunks:
        rest += chunk
        *whole, rest = rest.split(b"\n")
        for raw in whole:
            if raw.strip():
                yield raw.rstrip(b"\r")
    if rest.strip():
        yield rest.rstrip(b"\r")


def _custom_id(raw: bytes) -> str | None:
    try:
        obj = json.loads(raw)
    except ValueError:
        return None
    value = obj.get("custom_id") if isinstance(obj, dict) else None
    return value if isinstance(value, str) else None


def _stream(client: OpenAI, file_id: str) -> Iterator[bytes]:
    with client.files.with_streaming_response.content(file_id) as response:
        yield from response.iter_bytes()


@dataclass
class RetryPlan:
    custom_ids: list[str]
    skipped: Counter[str]
    total: int


def plan_retry(batch: Any, error_lines: Iterable[bytes], only: str) -> RetryPlan:
    """Which requests of ``batch`` to retry, from its error file's lines (refusals as RetryRefused)."""
    if batch.status not in TERMINAL_STATUSES:
        raise RetryRefused(
            f"batch {batch.id} is still {batch.status}: wait for it to end "
            f"(batchctl batches wait {batch.id}) before retrying it"
        )
    if not batch.error_file_id:
        if batch.status == "failed" and batch.errors and batch.errors.data:
            first = batch.errors.data[0]
            where = f" (line {first.line})" if first.line else ""
            raise RetryRefused(
                f"batch {batch.id} failed validation, so none of its requests ran: {first.code}: {first.message}{where}. "
                "Fix the input file and create a new batch; retry only re-runs requests that failed, expired or were cancelled"
            )
        raise RetryRefused(f"batch {batch.id} ({batch.status}) has no error file: nothing to retry")
    wanted = RETRY_SELECTIONS[only]
    picked: list[str] = []
    skipped: Counter[str] = Counter()
    total = 0
    for raw in error_lines:
        total += 1
        line = json.loads(raw)
        if retry_class(line) in wanted:
            picked.append(line["custom_id"])
        else:
            skipped[_reason(line)] += 1
    return RetryPlan(picked, skipped, total)


def select_lines(input_lines: Iterable[bytes], missing: set[str]) -> Iterator[bytes]:
    """The input lines whose custom_id is in ``missing``, in input order, bytes unchanged (the first
    line of each id); each one found is removed from ``missing`` (what is left was not found)."""
    for raw in input_lines:
        custom_id = _custom_id(raw)
        if custom_id in missing:
            missing.discard(custom_id)
            yield raw


def retry_metadata(metadata: dict[str, str] | None, batch_id: str) -> tuple[dict[str, str], bool]:
    """The retry's metadata: the original pairs plus ``retry_of``; False if there was no room."""
    out = dict(metadata or {})
    if RETRY_OF not in out and len(out) >= limits.METADATA_MAX_PAIRS:
        return out, False
    out[RETRY_OF] = batch_id
    return out, True


def retry(client: OpenAI, batch_id: str, *, only: str, err: TextIO):
    """Create the retry batch of ``batch_id`` (see the module docstring) and return it."""
    batch = client.batches.retrieve(batch_id)
    plan = plan_retry(batch, _lines(_stream(client, batch.error_file_id)) if batch.error_file_id else (), only)
    skipped = ", ".join(f"{reason} x{n}" for reason, n in sorted(plan.skipped.items()))
    if not plan.custom_ids:
        raise RetryRefused(
            f"nothing to retry: none of the {plan.total} error lines of {batch_id} is selected by "
            f"--only {only} (skipped: {skipped})"
        )
    missing = set(plan.custom_ids)
    with tempfile.TemporaryDirectory() as tmp:
        # streamed to a file: memory is one line plus the set of custom_ids
        path = Path(tmp) / f"{batch_id}_retry.jsonl"
        kept = 0
        with path.open("wb") as f:
            for raw in select_lines(_lines(_stream(client, batch.input_file_id)), missing):
                f.write(raw + b"\n")
                kept += 1
        if missing:
            print(
                f"batchctl: warning: {len(missing)} custom_id(s) of the error file are not in the input file "
                f"{batch.input_file_id}: {', '.join(sorted(missing)[:5])}",
                file=err,
            )
        if not kept:
            raise RetryRefused(f"nothing to retry: no line of input file {batch.input_file_id} matches the error file")
        metadata, recorded = retry_metadata(batch.metadata, batch_id)
        if not recorded:
            print(
                f"batchctl: warning: batch {batch_id} already has {limits.METADATA_MAX_PAIRS} metadata pairs: "
                f"{RETRY_OF} is not recorded on the new batch",
                file=err,
            )
        file = upload_file(client, path, "batch")
    # The batch's own endpoint and window (str in the SDK's Batch): the API took them once already.
    new = client.batches.create(
        input_file_id=file.id,
        endpoint=cast(Any, batch.endpoint),
        completion_window=cast(Any, batch.completion_window),
        metadata=metadata,
    )
    print(
        f"batchctl: retrying {kept} of the {plan.total} error lines of {batch_id} as {new.id}"
        + (f" (skipped: {skipped})" if skipped else ""),
        file=err,
    )
    return new


def run(args: argparse.Namespace, client: OpenAI, *, out: TextIO, err: TextIO) -> int:
    """One `files` or `batches` command: its exit status."""
    if args.command == "files":
        print(upload_file(client, args.path, args.purpose).model_dump_json(), file=out)
        return 0
    action = args.action
    if action in _SHOWN:
        print(_SHOWN[action](client, args).model_dump_json(), file=out)
        return 0
    return _ACTIONS[action](client, args, out, err)


def _create(client: OpenAI, args: argparse.Namespace) -> Batch:
    file_id = args.input_file_id or upload_file(client, args.input, "batch").id
    metadata = dict(item.split("=", 1) for item in args.metadata) or None
    return client.batches.create(
        input_file_id=file_id, endpoint=args.endpoint, completion_window=args.window, metadata=metadata
    )


def _list(client: OpenAI, args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    for item in client.batches.list(limit=args.limit).data:
        print(item.model_dump_json(), file=out)
    return 0


def _wait(client: OpenAI, args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    try:
        batch = wait_for(client, args.batch_id, timeout=args.timeout, interval=args.interval, err=err)
    except TimeoutError as exc:
        print(f"batchctl: {exc}", file=err)
        return EXIT_TIMEOUT
    print(batch.model_dump_json(), file=out)
    return 0 if batch.status == "completed" else 1


def _retry(client: OpenAI, args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    try:
        new = retry(client, args.batch_id, only=args.only, err=err)
    except RetryRefused as exc:
        print(f"batchctl: {exc}", file=err)
        return 1
    print(new.id, file=out)
    return 0


def _download(client: OpenAI, args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
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


#: The actions that print the batch they create, read or cancel.
_SHOWN: dict[str, Callable[[OpenAI, argparse.Namespace], Batch]] = {
    "create": _create,
    "get": lambda client, args: client.batches.retrieve(args.batch_id),
    "cancel": lambda client, args: client.batches.cancel(args.batch_id),
}
#: The other actions: their exit status.
_ACTIONS: dict[str, Callable[[OpenAI, argparse.Namespace, TextIO, TextIO], int]] = {
    "list": _list,
    "wait": _wait,
    "retry": _retry,
    "download": _download,
}


def api_client(
    args: argparse.Namespace, settings: CliSettings, *, local_base_url: str | None, aws_base_url: Callable[[], str]
) -> OpenAI:
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


def main_user(
    args: argparse.Namespace,
    settings: CliSettings,
    *,
    local_base_url: str | None,
    aws_base_url: Callable[[], str],
    out: TextIO,
    err: TextIO,
) -> int:
    try:
        client = api_client(args, settings, local_base_url=local_base_url, aws_base_url=aws_base_url)
        return run(args, client, out=out, err=err)
    except Exception as exc:  # noqa: BLE001 - a CLI: one line, exit 1
        print(f"batchctl: {exc}", file=err or sys.stderr)
        return 1
