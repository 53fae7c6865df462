"""What the reaper does, without the Lambda around it: delete the bytes of removed file records,
and release what removed files and uploads held on their tenant's stored-bytes ledger.

The stream Lambda (``handler.py``) and the local deployment's TTL sweeper (``infra/local/ttl.py``)
both call ``purge_removed`` and ``release_removed``; neither needs the other's runtime."""

from collections.abc import Iterable
from typing import Any

from functions.core.ports import Objects, StoredBytes
from functions.core.records import FileRecord, UploadRecord


def purge_removed(objects: Objects, old_items: Iterable[dict[str, Any]]) -> list[str]:
    """Delete the S3 bytes of every removed file item; returns the keys deleted. Idempotent
    (deleting a missing key is a no-op)."""
    keys = [item["s3_key"] for item in old_items if str(item.get("sk", "")).startswith(FileRecord.sort_key(""))]
    if keys:
        objects.delete_many(keys)
    return keys


def holder(item: dict[str, Any]) -> str | None:
    """The ledger holder a removed item was (its sort key), if it held stored bytes: a file or an
    upload whose image says ``holds_storage`` (an upload's parts never do)."""
    sk = str(item.get("sk", ""))
    if not item.get("holds_storage"):
        return None
    return sk if sk.startswith((FileRecord.sort_key(""), UploadRecord.sort_key(""))) else None


def release_removed(stored: StoredBytes, old_items: Iterable[dict[str, Any]]) -> int:
    """Release the bytes every removed holder held (a file deleted or expired, an upload expired
    or cancelled); returns how many this call released. Idempotent: a release already made (by
    the API's delete, an earlier delivery of the same stream record) finds no marker."""
    released = 0
    for item in old_items:
        name = holder(item)
        if name is not None and stored.release(str(item["tenant"]), name, int(item["bytes"])):
            released += 1
    return released
