"""Uploads API logic: a large file arrives in parts (each small enough for a Lambda request) and is
assembled into one S3 object, then becomes a normal File.

No API request moves more than a bounded number of bytes (docs/uploads.md): a part request stores
one part (at most ``max_upload_part_bytes``); ``complete`` assembles an upload of at most
``limits.UPLOAD_INLINE_ASSEMBLY_BYTES`` itself and hands a larger one to the upload assembler
(``functions/assembler``, one SQS message): it records the part order in a manifest, creates the
File as ``uploaded`` and answers at once; ``assemble`` then streams the parts in order into one S3
multipart upload, computing the md5 on the way (md5 cannot be combined from per-part digests, so
every byte is read once, in order), and marks the File ``processed`` (or ``error``)."""

import hashlib
import json
from collections import deque
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import cast

from functions.core import ids, limits, schema
from functions.core.errors import ConditionFailed, Conflict, InvalidRequest, PayloadTooLarge, not_found
from functions.core.ports import Stores
from functions.core.records import FileRecord, UploadPartRecord, UploadRecord
from functions.core.settings import Settings
from functions.core.wire import FilePurpose, Upload, UploadPart

from .common import check_size, check_storage, file_expiry, release_storage, within_quota
from .protocol import CompleteUploadBody, CreateUploadBody


def create_upload(stores: Stores, settings: Settings, tenant: str, body: CreateUploadBody, *, now: int) -> Upload:
    check_size(
        body.purpose,
        body.bytes,
        # OpenAI: an Upload accepts at most 8 GB (files.create's 512 MB per file does not apply)
        max_batch_bytes=settings.max_batch_file_bytes,
        max_bytes=limits.UPLOAD_MAX_BYTES,
        param="bytes",
    )
    record = UploadRecord(
        tenant=tenant,
        id=ids.new_id(ids.UPLOAD),
        filename=body.filename,
        purpose=cast(FilePurpose, body.purpose),  # one of UPLOAD_PURPOSES (the body's validator)
        bytes=body.bytes,
        mime_type=body.mime_type,
        created_at=now,
        expires_at=now + limits.UPLOAD_EXPIRY_SECONDS,
        file_expires_after=file_expiry(body.purpose, body.expires_after),
    )
    # The declared bytes are reserved with the upload (the File it becomes takes the reservation over).
    quota = check_storage(stores, tenant, record.bytes)
    with within_quota(stores, tenant, quota, record.bytes):
        stores.uploads.create(record, max_stored_bytes=quota)
    return record.to_wire(now)


def _get(stores: Stores, tenant: str, upload_id: str) -> UploadRecord:
    record = stores.uploads.get(tenant, upload_id) if ids.is_valid(upload_id, ids.UPLOAD) else None
    if record is None:
        raise not_found("Upload", upload_id, param="upload_id")
    return record


def pending_upload(stores: Stores, tenant: str, upload_id: str, now: int) -> UploadRecord:
    record = _get(stores, tenant, upload_id)
    status = record.effective_status(now)
    if status != "pending":
        raise InvalidRequest(
            f"Upload {upload_id} is {status}; it no longer accepts this operation.",
            param="upload_id",
            code="upload_not_pending",
        )
    return record


def add_part(stores: Stores, settings: Settings, tenant: str, upload_id: str, *, data: bytes, now: int) -> UploadPart:
    record = pending_upload(stores, tenant, upload_id, now)
    check_part(len(data), settings.max_upload_part_bytes, hint=True)
    part_id = ids.new_id(ids.PART)
    stores.objects.put(schema.upload_part_key(tenant, upload_id, part_id), data)
    return register_part(stores, record, part_id, size=len(data), now=now)


def check_part(size: int, limit: int, *, hint: bool = False) -> None:
    """A part's size rules: not empty, at most ``limit`` (with ``hint``, the 413 names the SDK call
    that cuts parts small enough for a Lambda request)."""
    if size <= 0:
        raise InvalidRequest("The part is empty.", param="data", code="empty_file")
    if size > limit:
        advice = (
            (
                " (a Lambda request carries about 6 MB after base64): use "
                f"client.uploads.upload_file_chunked(..., part_size={limit})"
            )
            if hint
            else ""
        )
        raise PayloadTooLarge(f"The part is {size} bytes; parts may be at most {limit} bytes{advice}.", param="data")


def register_part(stores: Stores, upload: UploadRecord, part_id: str, *, size: int, now: int) -> UploadPart:
    """Record the part whose bytes are already stored at its key."""
    part = UploadPartRecord(
        tenant=upload.tenant,
        upload_id=upload.id,
        id=part_id,
        created_at=now,
        bytes=size,
        s3_key=schema.upload_part_key(upload.tenant, upload.id, part_id),
        expires_at=upload.expires_at,
    )
    stores.uploads.add_part(part)
    return part.to_wire()


def _completed_again(stores: Stores, settings: Settings, record: UploadRecord, file_id: str, now: int) -> Upload:
    """A retried complete: answer as the first one did (and hand a File still being assembled to
    the assembler again: the first message may have been lost with a crash)."""
    file = stores.files.get(record.tenant, file_id, now)
    if file is not None and file.status == "uploaded":
        _dispatch(stores, settings, record.tenant, record.id)
    return record.to_wire(now, file.to_wire() if file else None)


def _listed_parts(stores: Stores, record: UploadRecord, part_ids: list[str]) -> tuple[dict[str, UploadPartRecord], int]:
    """The parts ``part_ids`` lists (each once, all of this upload) and their total bytes, which
    must be the upload's."""
    if not part_ids:
        raise InvalidRequest(
            "Invalid value for 'part_ids': at least one part is required.", param="part_ids", code="invalid_value"
        )
    if len(set(part_ids)) != len(part_ids):
        raise InvalidRequest(
            "Invalid value for 'part_ids': a part is listed twice.", param="part_ids", code="invalid_value"
        )
    if len(part_ids) > limits.S3_MAX_PARTS:
        raise InvalidRequest(
            f"Invalid value for 'part_ids': at most {limits.S3_MAX_PARTS} parts.",
            param="part_ids",
            code="invalid_value",
        )
    parts = stores.uploads.parts(record.tenant, record.id, part_ids)
    missing = [p for p in part_ids if p not in parts]
    if missing:
        raise InvalidRequest(
            f"Part {missing[0]} does not belong to upload {record.id}.", param="part_ids", code="invalid_value"
        )
    total = sum(parts[p].bytes for p in part_ids)
    if total != record.bytes:
        raise InvalidRequest(
            f"The parts add up to {total} bytes, but the upload was created with bytes={record.bytes}.",
            param="part_ids",
            code="bytes_mismatch",
        )
    return parts, total


def complete_upload(
    stores: Stores, settings: Settings, tenant: str, upload_id: str, body: CompleteUploadBody, *, now: int
) -> Upload:
    part_ids, md5 = body.part_ids, body.md5
    record = _get(stores, tenant, upload_id)
    if record.status == "completed" and record.file_id:
        return _completed_again(stores, settings, record, record.file_id, now)
    record = pending_upload(stores, tenant, upload_id, now)
    parts, total = _listed_parts(stores, record, part_ids)
    # The destination key is derived from the upload, so a retry after a crash overwrites the same
    # object instead of leaving an orphan; the File record only appears in the transaction below.
    dest = schema.file_key(tenant, upload_id)
    sources = [(parts[p].s3_key, parts[p].bytes) for p in part_ids]
    inline = total <= limits.UPLOAD_INLINE_ASSEMBLY_BYTES
    if inline:
        digest = assemble_parts(stores, dest, sources)
        if md5 is not None and digest != md5.lower():
            stores.objects.delete(dest)
            raise InvalidRequest(_md5_message(digest, md5), param="md5", code="md5_mismatch")
    elif not settings.assembly_queue_url:
        raise RuntimeError("uploads larger than UPLOAD_INLINE_ASSEMBLY_BYTES need assembly_queue_url (the assembler)")
    ttl = record.file_expires_after
    file = FileRecord(
        tenant=tenant,
        id=ids.new_id(ids.FILE),
        filename=record.filename,
        purpose=record.purpose,
        bytes=total,
        created_at=now,
        expires_at=now + ttl if ttl is not None else None,
        s3_key=dest,
        status="processed" if inline else "uploaded",
    )
    if not inline:
        # The order and the md5 to check, for the assembler (at most S3_MAX_PARTS entries: the
        # part ids, not the bytes). Written before the File exists, so the assembler always finds it.
        manifest = Manifest(file_id=file.id, md5=md5.lower() if md5 else None, parts=sources)
        stores.objects.put(manifest_key(tenant, upload_id), manifest.dump(), "application/json")
    try:
        stores.uploads.complete(record, file)
    except ConditionFailed:
        raise Conflict(f"Upload {upload_id} was completed or cancelled concurrently.", param="upload_id") from None
    if inline:
        stores.objects.delete_many(key for key, _ in sources)
    else:
        _dispatch(stores, settings, tenant, upload_id)
    completed = record.model_copy(update={"status": "completed", "file_id": file.id})
    return completed.to_wire(now, file.to_wire())


def _md5_message(digest: str, expected: str) -> str:
    return f"The md5 of the assembled file is {digest}, not {expected}."


# --- Assembly -----------------------------------------------------------------------------------
#: Parts fetched ahead of the one being written (memory: this many parts + one S3 part buffer).
PREFETCH_PARTS = 4


@dataclass(frozen=True)
class Manifest:
    """What ``complete`` hands the assembler: the File to fill, the md5 to check, the parts in order."""

    file_id: str
    md5: str | None
    parts: list[tuple[str, int]]

    def dump(self) -> bytes:
        return json.dumps({"file_id": self.file_id, "md5": self.md5, "parts": self.parts}).encode()

    @classmethod
    def load(cls, raw: bytes) -> "Manifest":
        data = json.loads(raw)
        return cls(file_id=data["file_id"], md5=data["md5"], parts=[(k, int(n)) for k, n in data["parts"]])


def manifest_key(tenant: str, upload_id: str) -> str:
    return f"{schema.upload_prefix(tenant, upload_id)}manifest.json"


def assembly_message(tenant: str, upload_id: str) -> str:
    return json.dumps({"tenant": tenant, "upload_id": upload_id})


def _dispatch(stores: Stores, settings: Settings, tenant: str, upload_id: str) -> None:
    stores.queues.queue(settings.assembly_queue_url).send([assembly_message(tenant, upload_id)])


def _fetched(stores: Stores, sources: list[tuple[str, int]]) -> Iterator[bytes]:
    """The parts' bytes in order, up to PREFETCH_PARTS fetched ahead (S3 latency overlaps the
    writes; memory stays bounded by the window, never the file)."""
    with ThreadPoolExecutor(max_workers=PREFETCH_PARTS) as pool:
        window: deque[Future[bytes]] = deque()
        pending = iter(sources)
        for key, _ in pending:
            window.append(pool.submit(stores.objects.get, key))
            if len(window) >= PREFETCH_PARTS:
                break
        while window:
            data = window.popleft().result()
            for key, _ in pending:
                window.append(pool.submit(stores.objects.get, key))
                break
            yield data


def assemble_parts(stores: Stores, dest: str, sources: list[tuple[str, int]]) -> str:
    """Write the parts' concatenation to ``dest`` (one S3 multipart upload, parts of
    ``MultipartWriter.PART_BYTES``) and return its md5: every byte is read once and written once."""
    digest = hashlib.md5(usedforsecurity=False)
    with stores.objects.writer(dest) as writer:
        for (key, size), data in zip(sources, _fetched(stores, sources), strict=True):
            if len(data) != size:
                raise RuntimeError(f"part {key} holds {len(data)} bytes, not {size}")
            digest.update(data)
            writer.write(data)
    return digest.hexdigest()


@dataclass(frozen=True)
class Assembled:
    """What one assembly did: ``processed``, ``error`` (md5 mismatch / gave up) or ``skipped``."""

    outcome: str
    file_id: str | None = None
    bytes: int = 0


def assemble(stores: Stores, tenant: str, upload_id: str, *, now: int) -> Assembled:
    """The assembler's work for one completed Upload (idempotent: a redelivery of a File already
    settled only removes what is left of the parts)."""
    record = stores.uploads.get(tenant, upload_id)
    if record is None or record.status != "completed" or not record.file_id:
        return Assembled("skipped")
    file = stores.files.get(tenant, record.file_id, now)
    prefix_keys = stores.objects.list_keys(schema.upload_prefix(tenant, upload_id))
    if file is None or file.status != "uploaded":
        stores.objects.delete_many(prefix_keys)  # settled (or deleted) before: only leftovers go
        return Assembled("skipped", record.file_id)
    manifest = Manifest.load(stores.objects.get(manifest_key(tenant, upload_id)))
    digest = assemble_parts(stores, file.s3_key, manifest.parts)
    if manifest.md5 is not None and digest != manifest.md5:
        stores.objects.delete(file.s3_key)
        stores.files.settle(tenant, file.id, "error", _md5_message(digest, manifest.md5))
        outcome = "error"
    else:
        outcome = "processed" if stores.files.settle(tenant, file.id, "processed") else "skipped"
    stores.objects.delete_many(prefix_keys)
    return Assembled(outcome, file.id, file.bytes)


def give_up(stores: Stores, tenant: str, upload_id: str, reason: str, *, now: int) -> None:
    """The assembler's last delivery failed: the File says so (``error``) instead of staying
    ``uploaded`` forever; the parts go with the bucket's lifecycle rule on uploads/."""
    record = stores.uploads.get(tenant, upload_id)
    if record is not None and record.file_id:
        stores.files.settle(tenant, record.file_id, "error", f"The upload could not be assembled: {reason[:200]}")


def cancel_upload(stores: Stores, tenant: str, upload_id: str, *, now: int) -> Upload:
    record = pending_upload(stores, tenant, upload_id, now)
    try:
        record = stores.uploads.transition(record, "cancelled")
    except ConditionFailed:
        raise Conflict(f"Upload {upload_id} was completed or cancelled concurrently.", param="upload_id") from None
    # Part bytes go here; the bucket's lifecycle rule on uploads/ removes any a crash leaves. Its
    # reservation is released here too (if this call dies first: when the record's TTL removes it).
    stores.objects.delete_many(stores.objects.list_keys(schema.upload_prefix(tenant, upload_id)))
    release_storage(stores, record)
    return record.to_wire(now)
