"""Test builders: the records, messages, manifests and stored state tests set up, in one place.

Each builder has the defaults of an ordinary case (tenant ``acme``, batch ``batch_1``, chat
completions, a 24h window) and takes any field as a keyword override, so a test states only the
fields it is about. ``set_batch`` writes a stored batch directly (no lifecycle rule)."""

import json
from collections.abc import Sequence
from typing import Any

from functions.core import schema
from functions.core.lifecycle import Change
from functions.core.messages import Chunk, ChunkManifest, WorkMessage
from functions.core.ports import Stores
from functions.core.records import BatchRecord, FileRecord, UploadRecord

TENANT = "acme"
BATCH_ID = "batch_1"
CHAT = "/v1/chat/completions"
#: The completion window ("24h"), in seconds.
WINDOW = 86_400
#: When a built record was created, unless a test says otherwise.
CREATED = 100


# --- batches --------------------------------------------------------------------------------------
def batch_record(*, tenant: str = TENANT, id: str = BATCH_ID, created_at: int = CREATED, **fields: Any) -> BatchRecord:
    """A batch as the API creates it: ``validating``, of input file ``file-1`` snapshotted under
    ``schema.batch_input_key``, on chat completions, expiring a 24h window after ``created_at``."""
    values: dict[str, Any] = {
        "input_file_id": "file-1",
        "endpoint": CHAT,
        "completion_window": "24h",
        "expires_at": created_at + WINDOW,
        "input_key": schema.batch_input_key(tenant, id),
    }
    return BatchRecord(tenant=tenant, id=id, created_at=created_at, **{**values, **fields})


def running_batch(*, chunk_count: int = 1, **fields: Any) -> BatchRecord:
    """A batch ingest moved on (``batch_record`` otherwise): ``in_progress``, accepting chunks,
    its ``chunk_count`` work messages enqueued."""
    values: dict[str, Any] = {"status": "in_progress", "accepting": True, "enqueued": True}
    return batch_record(chunk_count=chunk_count, **{**values, **fields})


def set_batch(stores: Stores, tenant: str, batch_id: str, **values: Any) -> BatchRecord:
    """Set attributes of a stored batch as they are, with no lifecycle rule and no condition (an
    operator's direct write): on the in-memory fake without counting a call, on AWS as one write."""
    setter = getattr(stores.batches, "set", None)
    if setter is not None:
        return setter(tenant, batch_id, **values)
    return stores.batches.transition(tenant, batch_id, Change(values=values))


# --- files and uploads ----------------------------------------------------------------------------
def file_record(*, tenant: str = TENANT, id: str = "file-1", **fields: Any) -> FileRecord:
    """A processed batch-purpose file of ``bytes`` (default 0) under its ``schema.file_key``."""
    values: dict[str, Any] = {
        "filename": "input.jsonl",
        "purpose": "batch",
        "bytes": 0,
        "created_at": CREATED,
        "s3_key": schema.file_key(tenant, id),
    }
    return FileRecord(tenant=tenant, id=id, **{**values, **fields})


def upload_record(*, tenant: str = TENANT, id: str = "upload_1", **fields: Any) -> UploadRecord:
    """A pending batch-purpose upload, open for an hour from its creation."""
    created = fields.pop("created_at", CREATED)
    values: dict[str, Any] = {
        "filename": "input.jsonl",
        "purpose": "batch",
        "bytes": 0,
        "mime_type": "text/jsonl",
        "expires_at": created + 3600,
    }
    return UploadRecord(tenant=tenant, id=id, created_at=created, **{**values, **fields})


# --- work messages and manifests -------------------------------------------------------------------
def work_message(batch: BatchRecord | None = None, **fields: Any) -> WorkMessage:
    """A chunk's work message: chunk 0 from line 1, of ``batch`` if given (its tenant, id, input,
    endpoint, model and expiry), else of ``batch_record()``'s on model ``test-chat``."""
    batch = batch or batch_record(model="test-chat")
    values: dict[str, Any] = {
        "batch_id": batch.id,
        "tenant": batch.tenant,
        "chunk": 0,
        "input_key": batch.input_key,
        "byte_start": 0,
        "byte_end": 0,
        "first_line": 1,
        "line_count": 1,
        "endpoint": batch.endpoint,
        "model": batch.model or "test-chat",
        "expires_at": batch.expires_at,
    }
    return WorkMessage(**{**values, **fields})


def delivered(message: WorkMessage) -> WorkMessage:
    """``message`` as SQS delivers it: its JSON body (None fields left out), parsed again."""
    return WorkMessage.model_validate_json(message.model_dump_json(exclude_none=True))


def cut(lines: Sequence[bytes], counts: Sequence[int] | int) -> list[Chunk]:
    """The chunks of ``lines`` (each with its newline) taken ``counts[i]`` lines at a time, in
    order (an int: that many at a time, the last chunk the rest), as ingest would record them
    (byte ranges, first line numbered from 1)."""
    if isinstance(counts, int):
        counts = [min(counts, len(lines) - first) for first in range(0, len(lines), counts)]
    assert sum(counts) == len(lines), (counts, len(lines))
    chunks, offset, first = [], 0, 0
    for number, count in enumerate(counts):
        size = sum(len(line) for line in lines[first : first + count])
        chunks.append(
            Chunk(chunk=number, byte_start=offset, byte_end=offset + size, first_line=first + 1, line_count=count)
        )
        offset, first = offset + size, first + count
    return chunks


def manifest(chunks: Sequence[Chunk], **fields: Any) -> ChunkManifest:
    return ChunkManifest(chunks=list(chunks), **fields)


def put_manifest(
    stores: Stores, chunks: Sequence[Chunk], *, tenant: str = TENANT, batch_id: str = BATCH_ID, **fields: Any
) -> ChunkManifest:
    """Store the chunk manifest of a batch where ingest writes it (``schema.batch_manifest_key``)."""
    written = manifest(chunks, **fields)
    stores.objects.put(schema.batch_manifest_key(tenant, batch_id), written.model_dump_json().encode())
    return written


# --- batch input ----------------------------------------------------------------------------------
def chat_line(n: int, *, model: str = "test-chat", custom_id: str | None = None, **body: Any) -> bytes:
    """Request line ``n`` of a chat batch input (``req-<n>``), with its newline; ``body`` adds or
    overrides body fields."""
    request = {
        "custom_id": custom_id or f"req-{n}",
        "method": "POST",
        "url": CHAT,
        "body": {"model": model, "messages": [{"role": "user", "content": f"hi {n}"}], **body},
    }
    return (json.dumps(request) + "\n").encode()


# --- assertions -----------------------------------------------------------------------------------
def assert_fields(actual: Any, **expected: Any) -> None:
    """``actual`` (a record, message or dict) has each ``expected`` field's value; on a mismatch
    the message lists every field that differs, as ``field: actual != expected``."""
    got = actual if isinstance(actual, dict) else {k: getattr(actual, k) for k in expected}
    wrong = {k: (got.get(k), v) for k, v in expected.items() if got.get(k) != v}
    assert not wrong, "; ".join(f"{k}: {a!r} != {e!r}" for k, (a, e) in wrong.items())
