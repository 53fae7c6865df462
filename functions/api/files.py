"""Files API logic: takes its stores as arguments, never reads the environment."""

from dataclasses import dataclass
from typing import cast

from functions.core import ids, schema
from functions.core.errors import InvalidRequest, not_found
from functions.core.ports import Stores
from functions.core.records import FileRecord
from functions.core.settings import Settings
from functions.core.wire import FileDeleted, FileObject, FilePurpose, ListPage

from .common import check_size, check_storage, file_expiry, release_storage, within_quota
from .protocol import ExpiresAfter, FileListQuery, filename_problem


def create_file(
    stores: Stores,
    settings: Settings,
    tenant: str,
    *,
    filename: str,
    content: bytes,
    purpose: str,
    expires_after: ExpiresAfter | None,
    now: int,
) -> FileObject:
    check_file(settings, filename, purpose, len(content), expires_after)
    quota = check_storage(stores, tenant, len(content))
    file_id = ids.new_id(ids.FILE)
    # Bytes first, then the record that makes them visible (with its stored-bytes reservation): a
    # crash in between leaves only unreferenced bytes, never a File without content.
    stores.objects.put(schema.file_key(tenant, file_id), content)
    return register_file(
        stores,
        tenant,
        file_id,
        filename=filename,
        purpose=purpose,
        size=len(content),
        expires_after=expires_after,
        quota=quota,
        now=now,
    )


def check_file(settings: Settings, filename: str, purpose: str, size: int, expires_after: ExpiresAfter | None) -> None:
    """The rules a new File's name, size and expiry obey, however its bytes arrive."""
    file_expiry(purpose, expires_after)
    problem = filename_problem(filename)
    if problem is not None:
        raise InvalidRequest(f"Invalid value for 'filename': {problem}.", param="filename", code="invalid_value")
    check_size(
        purpose, size, max_batch_bytes=settings.max_batch_file_bytes, max_bytes=settings.max_file_bytes, param="file"
    )


def register_file(
    stores: Stores,
    tenant: str,
    file_id: str,
    *,
    filename: str,
    purpose: str,
    size: int,
    expires_after: ExpiresAfter | None,
    quota: int | None,
    now: int,
) -> FileObject:
    """Make the bytes already stored at ``file_id``'s key a File (its record, with the stored-bytes
    reservation); on any failure the bytes are deleted, so nothing half-made stays."""
    key = schema.file_key(tenant, file_id)
    try:
        ttl = file_expiry(purpose, expires_after)
        record = FileRecord(
            tenant=tenant,
            id=file_id,
            filename=filename,
            purpose=cast(FilePurpose, purpose),  # one of FILE_PURPOSES (the callers' validators)
            bytes=size,
            created_at=now,
            expires_at=now + ttl if ttl is not None else None,
            s3_key=key,
        )
        with within_quota(stores, tenant, quota, record.bytes):
            stores.files.create(record, max_stored_bytes=quota)
    except BaseException:
        stores.objects.delete(key)
        raise
    return record.to_wire()


def list_files(stores: Stores, tenant: str, query: FileListQuery, *, now: int) -> ListPage[FileObject]:
    records, has_more = stores.files.list(
        tenant, purpose=query.purpose, after=query.after, ascending=query.ascending, limit=query.limit, now=now
    )
    return ListPage[FileObject].of([r.to_wire() for r in records], has_more)


def _get(stores: Stores, tenant: str, file_id: str, now: int) -> FileRecord:
    record = stores.files.get(tenant, file_id, now) if ids.is_valid(file_id, ids.FILE) else None
    if record is None:
        raise not_found("File", file_id, param="file_id")
    return record


def get_file(stores: Stores, tenant: str, file_id: str, now: int) -> FileObject:
    return _get(stores, tenant, file_id, now).to_wire()


@dataclass(frozen=True)
class Content:
    """A file's content: inline bytes, or a presigned URL to redirect to."""

    filename: str
    body: bytes | None = None
    redirect: str | None = None


def ready(record: FileRecord, *, param: str = "file_id") -> FileRecord:
    """``record`` if its bytes are there; a File still being assembled from an Upload (status
    ``uploaded``, docs/uploads.md) or whose assembly failed (``error``) is a clear 400."""
    if record.status == "uploaded":
        raise InvalidRequest(
            f"File {record.id} is still being assembled from its upload (status 'uploaded'); retry once "
            "client.files.retrieve shows status 'processed'.",
            param=param,
            code="file_not_ready",
        )
    if record.status == "error":
        raise InvalidRequest(
            f"File {record.id} has no content: {record.status_details}", param=param, code="file_error"
        )
    return record


def stored_file(stores: Stores, tenant: str, file_id: str, now: int) -> FileRecord:
    """``tenant``'s File ``file_id`` whose bytes are there to read (404, or ``ready``'s 400s)."""
    return ready(_get(stores, tenant, file_id, now))


def get_file_content(stores: Stores, settings: Settings, tenant: str, file_id: str, now: int) -> Content:
    record = stored_file(stores, tenant, file_id, now)
    if record.bytes > settings.inline_content_limit:
        url = stores.objects.presigned_get(record.s3_key, seconds=settings.presign_seconds, filename=record.filename)
        return Content(filename=record.filename, redirect=url)
    return Content(filename=record.filename, body=stores.objects.get(record.s3_key))


def delete_file(stores: Stores, tenant: str, file_id: str, now: int) -> FileDeleted:
    _get(stores, tenant, file_id, now)
    old = stores.files.delete(tenant, file_id)
    if old is None:  # deleted concurrently
        raise not_found("File", file_id, param="file_id")
    # The table's stream also tells the reaper, so the bytes go (and their reservation is
    # released, once) even if this call dies here.
    stores.objects.delete(old.s3_key)
    release_storage(stores, old)
    return FileDeleted(id=file_id)
