"""Batch result lines and the per-chunk result parts, shared by the worker, the DLQ handler and
finalize. A line whose request got a 2xx goes to the output part; anything else (an engine error
status, or no response at all) to the error part. Each attempt at a chunk writes its own parts;
the count marker records which attempt was counted, and finalize reads only that one."""

import hashlib
import secrets
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from . import ids, schema
from .lines import LineError, RawLine, iter_lines, parse_request, usable_custom_id
from .messages import WorkMessage
from .ports import Objects
from .wire import BatchLineError, BatchLineResponse, BatchOutputLine


def response_line(custom_id: str, status_code: int, body: Any, request_id: str) -> BatchOutputLine:
    if not isinstance(body, dict):
        body = {"error": {"message": str(body), "type": "server_error", "param": None, "code": None}}
    return BatchOutputLine(
        id=ids.new_id(ids.BATCH_REQUEST),
        custom_id=custom_id,
        response=BatchLineResponse(status_code=status_code, request_id=request_id, body=body),
        error=None,
    )


def error_line(custom_id: str, code: str, message: str) -> BatchOutputLine:
    return BatchOutputLine(
        id=ids.new_id(ids.BATCH_REQUEST),
        custom_id=custom_id,
        response=None,
        error=BatchLineError(code=code, message=message),
    )


def unrun_lines(objects: Objects, message: WorkMessage, code: str, text: str) -> Iterator[BatchOutputLine]:
    """An error line for every request line of a chunk that did not run (dead-lettered, or left
    when its batch was cancelled or expired), in input order: one ranged GET of the chunk."""
    raw = objects.iter_range(message.input_key, message.byte_start, message.byte_end)
    # A line never exceeds its chunk, so the chunk's size bounds the line reader.
    size = message.byte_end - message.byte_start
    for line in iter_lines(raw, max_line_bytes=size, start=message.byte_start, first_number=message.first_line):
        if not line.blank:
            try:
                request = parse_request(line)
            except LineError:
                request = None
            yield error_line(custom_id_of(request, line), code, text)


def custom_id_of(request: dict[str, Any] | None, line: RawLine) -> str:
    """A result line's custom_id: the request's, or ``line-<n>`` for a line without a usable one
    (missing, not a non-empty string, longer than MAX_CUSTOM_ID_CHARS, or not valid Unicode: a
    lone surrogate would make the result line impossible to write)."""
    value = request.get("custom_id") if request is not None else None
    return value if usable_custom_id(value) else f"line-{line.number}"


def succeeded(line: BatchOutputLine) -> bool:
    return line.response is not None and 200 <= line.response.status_code < 300


@dataclass(frozen=True)
class Parts:
    """The result parts one attempt at a chunk wrote."""

    attempt: str
    completed: int
    failed: int
    #: The sha256 of each part as written ({"out_sha256": ..., "err_sha256": ...}; None for a part
    #: not written; empty when not known): a chunk's audit receipt names them without reading the
    #: parts back.
    digests: dict[str, str | None] = field(default_factory=dict)


def write_parts(objects: Objects, message: WorkMessage, lines: list[BatchOutputLine]) -> Parts:
    """Write a chunk's output and error parts (lines in input order) under a new attempt id. A
    part with no line is not written (one PUT fewer for a chunk whose lines all succeeded): its
    count on the marker is 0, so finalize never reads it, and its receipt digest is null."""
    attempt = secrets.token_hex(6)
    out = [line for line in lines if succeeded(line)]
    err = [line for line in lines if not succeeded(line)]
    digests: dict[str, str | None] = {}
    for kind, part in (("out", out), ("err", err)):
        if not part:
            digests[f"{kind}_sha256"] = None
            continue
        body = b"".join(line.model_dump_json().encode() + b"\n" for line in part)
        key = schema.chunk_part_key(message.tenant, message.batch_id, message.chunk, attempt, kind)
        objects.put(key, body, "application/jsonl")
        digests[f"{kind}_sha256"] = hashlib.sha256(body).hexdigest()
    return Parts(attempt=attempt, completed=len(out), failed=len(err), digests=digests)


# --- checkpoints of a running chunk (docs/reliability.md, "Poison isolation") -------------------
#: A line that was being sent, alone, to the engine when its worker or engine died: not retried.
ENGINE_CRASHED = "engine_crashed"
ENGINE_CRASHED_MESSAGE = (
    "This request crashed the inference engine (or its worker) while it ran, so it was not retried. "
    "The other requests of the batch were not affected."
)
#: The lines a chunk had left when its poison budget ran out.
CHUNK_FAILED = "chunk_failed"


def chunk_failed_message(failures: int) -> str:
    return (
        f"The request was not processed: the GPU workers running it died {failures} times without "
        "making progress. Retry it in a new batch."
    )


def write_checkpoint(
    objects: Objects, message: WorkMessage, start: int, lines: list[BatchOutputLine]
) -> tuple[int, int]:
    """Write the results of request lines [start, start + len(lines)) of a running chunk (input
    order) under their segment's key; returns the segment."""
    end = start + len(lines)
    body = b"".join(line.model_dump_json().encode() + b"\n" for line in lines)
    objects.put(
        schema.chunk_checkpoint_key(message.tenant, message.batch_id, message.chunk, start, end),
        body,
        "application/jsonl",
    )
    return start, end


def read_checkpoints(objects: Objects, message: WorkMessage, cover: list[tuple[int, int]]) -> list[BatchOutputLine]:
    """The checkpointed result lines of a chunk's first request lines, one per line, in order:
    ``cover`` is ``ChunkRunRecord.cover()`` (segments that each add lines; overlaps are read once)."""
    out: list[BatchOutputLine] = []
    for start, end in cover:
        data = objects.get(schema.chunk_checkpoint_key(message.tenant, message.batch_id, message.chunk, start, end))
        lines = [BatchOutputLine.model_validate_json(raw) for raw in data.splitlines() if raw.strip()]
        if len(lines) != end - start:
            raise ValueError(f"checkpoint {start}-{end} of chunk {message.chunk} holds {len(lines)} lines")
        out.extend(lines[len(out) - start :])
    return out


def salvaged_lines(
    objects: Objects, message: WorkMessage, cover: list[tuple[int, int]], code: str, text: str
) -> list[BatchOutputLine]:
    """Every request line of a chunk that will not be counted by a worker (dead-lettered, or left
    when its batch closed), once each, in input order: the results its workers checkpointed for its
    first lines (``cover``: ``ChunkRunRecord.cover()``, [] for none), then an error line
    (``code``, ``text``) for each of the rest. The one code path of the DLQ consumer and finalize."""
    kept = read_checkpoints(objects, message, cover) if cover else []
    return kept + list(unrun_lines(objects, message, code, text))[len(kept) :]


def usage_of(line: BatchOutputLine) -> dict[str, Any] | None:
    """The engine's ``usage`` of a succeeded result line (what the chunk's usage adds)."""
    if not succeeded(line) or line.response is None or not isinstance(line.response.body, dict):
        return None
    usage = line.response.body.get("usage")
    return usage if isinstance(usage, dict) else None
