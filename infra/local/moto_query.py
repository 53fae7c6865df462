"""moto answers every DynamoDB Query by listing the whole table, sorted by key
(``Table.all_items``), and then keeping the items of the queried partition: a Query's cost grows with
every item of every batch the deployment holds, not with the partition it reads. A 50,000-line
batch's retrieves, chunk reads and the audit appender's queries then take more of the engines'
cores the longer the batch runs (docs/benchmarks.md, "A 50,000-line embeddings batch"), each under
the one lock DynamoDB calls hold (``atomic_dynamodb``).

While a Query runs (``install``), the table lists for it only what that Query can return: on the
base table, the queried partition's items; on an index, every item unsorted (moto sorts what the
index keeps itself). Everything moto does after that (key conditions, order, paging, the 1 MB page,
filters, projections) is its own, so a Query answers exactly as before. Scans and every other
caller still get moto's sorted listing.
"""

from __future__ import annotations

import functools
import inspect
import threading
from typing import Any

from moto.dynamodb.models.table import Table

_installed = False
_querying = threading.local()
_all_items = Table.all_items
_query = Table.query
_signature = inspect.signature(_query)


def _listed(table: Table) -> list[Any]:
    """What ``table.all_items()`` answers: the items a Query running on this thread may return,
    else moto's own sorted listing."""
    query = getattr(_querying, "query", None)
    if query is None or query[0] is not table:
        return _all_items(table)
    _, hash_key, index_name = query
    if not table.range_key_attr:  # a table of hash keys only: moto keeps each item bare
        return list(table.items.values()) if index_name else [i for k, i in table.items.items() if k == hash_key]
    if index_name:
        return [item for partition in table.items.values() for item in partition.values()]
    return list(table.items.get(hash_key, {}).values())


def _partitioned(table: Table, hash_key: Any, *args: Any, **kwargs: Any) -> Any:
    bound = _signature.bind(table, hash_key, *args, **kwargs)
    outer = getattr(_querying, "query", None)
    _querying.query = (table, hash_key, bound.arguments.get("index_name"))
    try:
        return _query(table, hash_key, *args, **kwargs)
    finally:
        _querying.query = outer


def install() -> None:
    """Queries of moto's DynamoDB (in this process) list only what they may return (idempotent)."""
    global _installed
    if _installed:
        return
    Table.all_items = functools.wraps(_all_items)(_listed)  # type: ignore[method-assign,assignment]  # moto's, for the local deployment and tests
    Table.query = functools.wraps(_query)(_partitioned)  # type: ignore[method-assign,assignment]
    _installed = True
