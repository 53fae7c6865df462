"""Stands in for DynamoDB's TTL process and its stream on moto: deletes items past their TTL and
hands their old images to the same reaper logic the stream Lambda runs."""

import logging
import threading
from collections.abc import Callable
from typing import Any

from boto3.dynamodb.conditions import Attr

from functions.core import schema
from functions.core.ports import Objects, StoredBytes
from functions.reaper.logic import purge_removed, release_removed

log = logging.getLogger("infra.local.ttl")


def expire_once(table: Any, objects: Objects, now: int, stored: StoredBytes | None = None) -> int:
    """Delete every item whose TTL has passed; returns how many were removed. With ``stored``,
    what the removed files and uploads held is released, as the stream's reaper does."""
    kwargs: dict[str, Any] = {"FilterExpression": Attr(schema.TTL).lte(now)}
    removed: list[dict[str, Any]] = []
    while True:
        page = table.scan(**kwargs)
        for item in page["Items"]:
            old = table.delete_item(
                Key={schema.PK: item[schema.PK], schema.SK: item[schema.SK]}, ReturnValues="ALL_OLD"
            ).get("Attributes")
            if old:
                removed.append(old)
        if "LastEvaluatedKey" not in page:
            break
        kwargs["ExclusiveStartKey"] = page["LastEvaluatedKey"]
    purge_removed(objects, removed)
    if stored is not None:
        release_removed(stored, removed)
    return len(removed)


def start_sweeper(
    table: Any,
    objects: Objects,
    clock: Callable[[], int],
    stop: threading.Event,
    every: float = 30.0,
    stored: StoredBytes | None = None,
) -> threading.Thread:
    def run() -> None:
        while not stop.wait(every):
            try:
                expire_once(table, objects, clock(), stored)
            except Exception:  # a moto hiccup must not end the sweeper for the rest of the run
                log.exception("TTL sweep failed; retrying in %ss", every)

    thread = threading.Thread(target=run, name="ttl-sweeper", daemon=True)
    thread.start()
    return thread
