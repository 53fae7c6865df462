"""What the reaper does, without the Lambda around it: delete the bytes of removed file records.

The stream Lambda (``handler.py``) and the local deployment's TTL sweeper (``infra/local/ttl.py``)
both call ``purge_removed``; neither needs the other's runtime."""

from collections.abc import Iterable
from typing import Any

from functions.core.ports import Objects
from functions.core.records import FileRecord


def purge_removed(objects: Objects, old_items: Iterable[dict[str, Any]]) -> list[str]:
    """Delete the S3 bytes of every removed file item; returns the keys deleted. Idempotent
    (deleting a missing key is a no-op)."""
    keys = [item["s3_key"] for item in old_items if str(item.get("sk", "")).startswith(FileRecord.sort_key(""))]
    if keys:
        objects.delete_many(keys)
    return keys
