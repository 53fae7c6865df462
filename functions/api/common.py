"""Rules the Files and Uploads logic share (value rules live in ``protocol``), and their
stored-bytes quota (docs/governance.md, "Stored-bytes quota"): whatever path brings a file's or
an upload's bytes, the logic here decides, and the stores reserve with the record."""

from collections.abc import Iterator
from contextlib import contextmanager

from functions.core import limits, tenants
from functions.core.errors import ConditionFailed, InvalidRequest, StorageQuotaExceeded, Throttled
from functions.core.ports import Stores
from functions.core.records import FileRecord, UploadRecord

from .protocol import ExpiresAfter


def file_expiry(purpose: str, expires_after: ExpiresAfter | None) -> int | None:
    """Seconds after creation at which a file expires (None: never): ``expires_after`` if given,
    else 30 days for purpose=batch files and never for the others."""
    if expires_after is not None:
        return expires_after.seconds
    return limits.BATCH_FILE_DEFAULT_EXPIRY_SECONDS if purpose == "batch" else None


def check_size(purpose: str, size: int, *, max_batch_bytes: int, max_bytes: int, param: str) -> None:
    """The rules every stored file obeys, whether it comes whole or through the Uploads API. A
    batch file is judged by its content, never by its name or declared type (clients upload bytes
    named ``upload``): batches.create's validation reads every line (docs/adr/0060)."""
    if size <= 0:
        raise InvalidRequest("The file is empty.", param=param, code="empty_file")
    limit = max_batch_bytes if purpose == "batch" else max_bytes
    if size > limit:
        raise InvalidRequest(
            f"The file is {size} bytes; files with purpose {purpose!r} may be at most {limit} bytes.",
            param=param,
            code="file_too_large",
        )


def check_storage(stores: Stores, tenant: str, size: int) -> int | None:
    """The tenant's ``max_stored_bytes`` (None: no quota), after refusing at once a file or
    upload of ``size`` that cannot fit (one GetItem of the ledger, only under a quota): the
    reservation written with the record decides, this spares the bytes' upload."""
    quota = tenants.storage_quota(stores.tenants, tenant)
    if quota is not None and stores.stored.used(tenant) + size > quota:
        raise storage_full(stores, tenant, quota, size)
    return quota


@contextmanager
def within_quota(stores: Stores, tenant: str, quota: int | None, size: int) -> Iterator[None]:
    """Around a create that reserves ``size`` bytes under ``quota``: its ``ConditionFailed`` (the
    record's id is new, so under a quota it is the ledger's condition) is the quota's refusal."""
    try:
        yield
    except ConditionFailed:
        if quota is None:
            raise
        raise storage_full(stores, tenant, quota, size) from None


def storage_full(stores: Stores, tenant: str, quota: int, size: int) -> StorageQuotaExceeded:
    """The refusal of a record of ``size`` bytes that does not fit under ``quota``."""
    return tenants.storage_quota_exceeded(quota, stores.stored.used(tenant), size)


def release_storage(stores: Stores, record: FileRecord | UploadRecord) -> None:
    """Release what a removed (or cancelled) record held, once. The removal is done whatever this
    answers: a store that stays busy leaves the release to the stream's reaper, which makes it
    when the record's item goes (at once for a deleted file, at its TTL for a cancelled upload)."""
    if record.holds_storage:
        kind = FileRecord if isinstance(record, FileRecord) else UploadRecord
        try:
            stores.stored.release(record.tenant, kind.sort_key(record.id), record.bytes)
        except Throttled:
            pass
