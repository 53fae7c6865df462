"""Uploads API logic: a large file arrives in parts (each small enough for a Lambda request) and is
assembled into one S3 object with multipart copy/coalescing, then becomes a normal File."""

import hashlib

from functions.core import ids, limits, schema
from functions.core.errors import ConditionFailed, Conflict, InvalidRequest, PayloadTooLarge, not_found
from functions.core.models import Upload, UploadPart
from functions.core.records import FileRecord, UploadPartRecord, UploadRecord
from functions.core.settings import Settings
from functions.core.ports import Stores

from .common import check_size, file_expiry
from .protocol import CompleteUploadBody, CreateUploadBody


def create_upload(stores: Stores, settings: Settings, tenant: str, body: CreateUploadBody, *, now: int) -> Upload:
    check_size(
        body.purpose, body.filename, body.bytes,
        max_batch_bytes=settings.max_batch_file_bytes, max_bytes=min(settings.max_file_bytes, limits.UPLOAD_MAX_BYTES),
        param="bytes",
    )
    record = UploadRecord(
        tenant=tenant,
        id=ids.new_id(ids.UPLOAD),
        filename=body.filename,
        purpose=body.purpose,
        bytes=body.bytes,
        mime_type=body.mime_type,
        created_at=now,
        expires_at=now + limits.UPLOAD_EXPIRY_SECONDS,
        file_expires_after=file_expiry(body.purpose, body.expires_after),
    )
    stores.uploads.create(record)
    return record.to_wire(now)


def _get(stores: Stores, tenant: str, upload_id: str) -> UploadRecord:
    record = stores.uploads.get(tenant, upload_id) if ids.is_valid(upload_id, ids.UPLOAD) else None
    if record is None:
        raise not_found("Upload", upload_id, param="upload_id")
    return record


def _pending(stores: Stores, tenant: str, upload_id: str, now: int) -> UploadRecord:
    record = _get(stores, tenant, upload_id)
    status = record.effective_status(now)
    if status != "pending":
        raise InvalidRequest(
            f"Upload {upload_id} is {status}; it no longer accepts this operation.", param="upload_id", code="upload_not_pending"
        )
    return record


def add_part(stores: Stores, settings: Settings, tenant: str, upload_id: str, *, data: bytes, now: int) -> UploadPart:
    record = _pending(stores, tenant, upload_id, now)
    if not data:
        raise InvalidRequest("The part is empty.", param="data", code="empty_file")
    if len(data) > settings.max_upload_part_bytes:
        raise PayloadTooLarge(
            f"The part is {len(data)} bytes; parts may be at most {settings.max_upload_part_bytes} bytes "
            "(use a smaller part_size).",
            param="data",
        )
    part_id = ids.new_id(ids.PART)
    part = UploadPartRecord(
        tenant=tenant,
        upload_id=upload_id,
        id=part_id,
        created_at=now,
        bytes=len(data),
        s3_key=schema.upload_part_key(tenant, upload_id, part_id),
        expires_at=record.expires_at,
    )
    stores.objects.put(part.s3_key, data)
    stores.uploads.add_part(part)
    return part.to_wire()


def complete_upload(stores: Stores, tenant: str, upload_id: str, body: CompleteUploadBody, *, now: int) -> Upload:
    part_ids, md5 = body.part_ids, body.md5
    record = _get(stores, tenant, upload_id)
    if record.status == "completed" and record.file_id:
        # A retried complete: answer as the first one did.
        file = stores.files.get(tenant, record.file_id, now)
        return record.to_wire(now, file.to_wire() if file else None)
    record = _pending(stores, tenant, upload_id, now)
    if not part_ids:
        raise InvalidRequest("Invalid value for 'part_ids': at least one part is required.", param="part_ids", code="invalid_value")
    if len(set(part_ids)) != len(part_ids):
        raise InvalidRequest("Invalid value for 'part_ids': a part is listed twice.", param="part_ids", code="invalid_value")
    if len(part_ids) > limits.S3_MAX_PARTS:
        raise InvalidRequest(f"Invalid value for 'part_ids': at most {limits.S3_MAX_PARTS} parts.", param="part_ids", code="invalid_value")
    parts = stores.uploads.parts(tenant, upload_id, part_ids)
    missing = [p for p in part_ids if p not in parts]
    if missing:
        raise InvalidRequest(f"Part {missing[0]} does not belong to upload {upload_id}.", param="part_ids", code="invalid_value")
    total = sum(parts[p].bytes for p in part_ids)
    if total != record.bytes:
        raise InvalidRequest(
            f"The parts add up to {total} bytes, but the upload was created with bytes={record.bytes}.",
            param="part_ids", code="bytes_mismatch",
        )
    # The destination key is derived from the upload, so a retry after a crash overwrites the same
    # object instead of leaving an orphan; the File record only appears in the transaction below.
    dest = schema.file_key(tenant, upload_id)
    stores.objects.concatenate(dest, [(parts[p].s3_key, parts[p].bytes) for p in part_ids])
    if md5 is not None:
        digest = hashlib.md5(usedforsecurity=False)
        for chunk in stores.objects.iter_bytes(dest):
            digest.update(chunk)
        if digest.hexdigest() != md5.lower():
            stores.objects.delete(dest)
            raise InvalidRequest(
                f"The md5 of the assembled file is {digest.hexdigest()}, not {md5}.", param="md5", code="md5_mismatch"
            )
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
    )
    try:
        stores.uploads.complete(record, file)
    except ConditionFailed:
        raise Conflict(f"Upload {upload_id} was completed or cancelled concurrently.", param="upload_id") from None
    stores.objects.delete_many(parts[p].s3_key for p in part_ids)
    completed = record.model_copy(update={"status": "completed", "file_id": file.id})
    return completed.to_wire(now, file.to_wire())


def cancel_upload(stores: Stores, tenant: str, upload_id: str, *, now: int) -> Upload:
    record = _pending(stores, tenant, upload_id, now)
    try:
        record = stores.uploads.transition(record, "cancelled")
    except ConditionFailed:
        raise Conflict(f"Upload {upload_id} was completed or cancelled concurrently.", param="upload_id") from None
    # Part bytes go now; the bucket's lifecycle rule on uploads/ removes any a crash leaves.
    stores.objects.delete_many(stores.objects.list_keys(schema.upload_prefix(tenant, upload_id)))
    return record.to_wire(now)
