"""Parameter checks shared by the Files and Uploads logic."""

from functions.core import limits
from functions.core.errors import InvalidRequest


def check_purpose(purpose: str) -> str:
    if purpose not in limits.UPLOAD_PURPOSES:
        raise InvalidRequest(
            f"Invalid value for 'purpose': {purpose!r}. Supported values are: "
            + ", ".join(repr(p) for p in limits.UPLOAD_PURPOSES) + ".",
            param="purpose",
            code="invalid_value",
        )
    return purpose


def expiry_seconds(purpose: str, anchor: str | None, seconds: int | None) -> int | None:
    """Seconds after creation at which a file expires (None: never), from ``expires_after``."""
    if anchor is None and seconds is None:
        return limits.BATCH_FILE_DEFAULT_EXPIRY_SECONDS if purpose == "batch" else None
    if anchor is None:
        raise InvalidRequest("Missing required parameter: 'expires_after.anchor'.", param="expires_after.anchor", code="missing_required_parameter")
    if seconds is None:
        raise InvalidRequest("Missing required parameter: 'expires_after.seconds'.", param="expires_after.seconds", code="missing_required_parameter")
    if anchor != "created_at":
        raise InvalidRequest(
            f"Invalid value for 'expires_after.anchor': {anchor!r}. Supported values are: 'created_at'.",
            param="expires_after.anchor", code="invalid_value",
        )
    if not limits.EXPIRES_AFTER_MIN_SECONDS <= seconds <= limits.EXPIRES_AFTER_MAX_SECONDS:
        raise InvalidRequest(
            f"Invalid value for 'expires_after.seconds': {seconds}. It must be between "
            f"{limits.EXPIRES_AFTER_MIN_SECONDS} and {limits.EXPIRES_AFTER_MAX_SECONDS}.",
            param="expires_after.seconds", code="invalid_value",
        )
    return seconds


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
