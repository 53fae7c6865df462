"""Rules the Files and Uploads logic share (value rules live in ``protocol``)."""

from functions.core import limits
from functions.core.errors import InvalidRequest

from .protocol import ExpiresAfter


def file_expiry(purpose: str, expires_after: ExpiresAfter | None) -> int | None:
    """Seconds after creation at which a file expires (None: never): ``expires_after`` if given,
    else 30 days for purpose=batch files and never for the others."""
    if expires_after is not None:
        return expires_after.seconds
    return limits.BATCH_FILE_DEFAULT_EXPIRY_SECONDS if purpose == "batch" else None


def check_size(purpose: str, filename: str, size: int, *, max_batch_bytes: int, max_bytes: int, param: str) -> None:
    """The rules every stored file obeys, whether it comes whole or through the Uploads API."""
    if purpose == "batch" and not filename.lower().endswith(".jsonl"):
        raise InvalidRequest("Invalid file format for Batch API. Must be .jsonl", param=param, code="invalid_file_format")
    if size <= 0:
        raise InvalidRequest("The file is empty.", param=param, code="empty_file")
    limit = max_batch_bytes if purpose == "batch" else max_bytes
    if size > limit:
        raise InvalidRequest(
            f"The file is {size} bytes; files with purpose {purpose!r} may be at most {limit} bytes.",
            param=param, code="file_too_large",
        )
