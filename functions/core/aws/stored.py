"""The ``StoredBytes`` port on the deployment's table, and the transaction items that hold and
charge stored bytes (docs/governance.md, "Stored-bytes quota").

A tenant's ledger is its ``schema.stored_pk`` partition: one counter item (``bytes``) and one
marker per holder (a file or an upload, ``schema.stored_marker_sk``). A reservation writes the
holder's record, its marker and the counter's ADD in one transaction; a release deletes the marker
(only if it is there) and subtracts in one transaction, so a release attempted twice (an API delete
and the stream's reaper, a redelivered stream record) subtracts once."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from boto3.dynamodb.conditions import Attr

from .. import schema
from ..errors import ConditionFailed
from .dynamodb import Delete, Put, Table

#: The counter's attribute.
BYTES = "bytes"


@dataclass(frozen=True)
class Charge:
    """A transactional ADD of ``size`` to the tenant's counter (creating it), only while the
    counter stays at most ``limit`` after it (None: always)."""

    tenant: str
    size: int
    limit: int | None = None

    def render(self, table: str) -> dict[str, Any]:
        body: dict[str, Any] = {
            "TableName": table,
            "Key": {schema.PK: schema.stored_pk(self.tenant), schema.SK: schema.STORED_USAGE_SK},
            "UpdateExpression": "ADD #b :n",
            "ExpressionAttributeNames": {"#b": BYTES},
            "ExpressionAttributeValues": {":n": self.size},
        }
        if self.limit is not None:
            body["ConditionExpression"] = "attribute_not_exists(#b) OR #b <= :room"
            body["ExpressionAttributeValues"][":room"] = self.limit - self.size
        return {"Update": body}


def marker(tenant: str, holder: str, size: int) -> dict[str, Any]:
    return {schema.PK: schema.stored_pk(tenant), schema.SK: schema.stored_marker_sk(holder), BYTES: size}


def hold(tenant: str, holder: str, size: int, limit: int | None) -> list[Any]:
    """The items that reserve ``size`` bytes for ``holder`` (with its record's Put in the same
    transaction): its marker (a new one) and the counter's conditional ADD. ConditionFailed at once
    when ``size`` alone exceeds ``limit``."""
    if limit is not None and size > limit:
        raise ConditionFailed("the holder alone exceeds the stored-bytes quota")
    return [Put(marker(tenant, holder, size), if_absent=True), Charge(tenant, size, limit)]


def charge(tenant: str, holders: list[tuple[str, int]]) -> list[Any]:
    """The items that add the bytes of ``holders`` ((holder, size) pairs) without any condition
    (a batch's output files: a batch always ends): their markers and one ADD of the sum."""
    if not holders:
        return []
    return [*(Put(marker(tenant, h, size)) for h, size in holders), Charge(tenant, sum(size for _, size in holders))]


class StoredBytesRepo:
    def __init__(self, table: Table):
        self._table = table

    def used(self, tenant: str) -> int:
        item = self._table.get(schema.stored_pk(tenant), schema.STORED_USAGE_SK) or {}
        return int(item.get(BYTES, 0))

    def release(self, tenant: str, holder: str, size: int) -> bool:
        try:
            self._table.transact(
                [
                    Delete(
                        schema.stored_pk(tenant), schema.stored_marker_sk(holder), condition=Attr(schema.PK).exists()
                    ),
                    Charge(tenant, -size),
                ]
            )
        except ConditionFailed:  # released before (or never held)
            return False
        return True
