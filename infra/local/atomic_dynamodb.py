"""DynamoDB requests one at a time in the local deployment's moto (which serves each request on its
own thread and takes no lock: two requests on the same items interleave freely, and a
``TransactWriteItems`` that fails restores a copy of every table taken before it ran, undoing any
write another thread made in between).

What AWS documents: every single-item write is atomic, a conditional write's condition is checked
against the item as it is when the write is applied ("Condition expressions", "Atomic counters":
https://docs.aws.amazon.com/amazondynamodb/latest/developerguide/WorkingWithItems.html), and a
transaction is all-or-nothing and isolated from every other transaction and write
("Isolation levels for DynamoDB transactions":
https://docs.aws.amazon.com/amazondynamodb/latest/developerguide/transaction-apis.html#transaction-isolation).
Holding one lock over each request gives that (serializable, more than AWS's per-item isolation,
never less), at the cost of DynamoDB calls not overlapping each other in moto, whose calls are short
and in-memory. The lock covers the request's answer too, not only its backend call: moto answers a
``GetItem`` or a ``Query`` from its stored items themselves, not copies, so an answer serialized
after the backend call could read an item while another thread's ``UpdateItem`` changes it (a torn
read AWS never gives; in Python, "dictionary changed size during iteration"). The GPU worker
commits chunks from several threads at once (``WorkerConfig.store_threads``), so without this its
count transactions could undo each other.

And a cheaper rollback: moto backs up a ``TransactWriteItems`` by deep-copying every table it names
before it runs, so each transaction costs time in proportion to the whole table (measured here:
9 ms at 100 items, 88 ms at 2,000, against 1.6 ms for an ``UpdateItem``), and a local deployment
that has run a few batches spends most of its commits copying. Under the lock nothing else writes
while a transaction runs, so a copy of just the items it names is the same backup: moto's
table-wide copy is skipped (``_NoTableCopy``) and, when the transaction fails, those items are put
back as they were (``_restore``), a new one removed.
"""

from __future__ import annotations

import copy
import functools
import threading
from collections.abc import Callable
from typing import Any

from moto.dynamodb import models as dynamodb_models
from moto.dynamodb.models import DynamoDBBackend
from moto.dynamodb.models.dynamo_type import DynamoType
from moto.dynamodb.models.table import Table
from moto.dynamodb.responses import DynamoHandler

_LOCK = threading.RLock()
_installed = False


def _atomic(fn: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(fn)
    def call(*args: Any, **kwargs: Any) -> Any:
        with _LOCK:
            return fn(*args, **kwargs)

    call.__wrapped_atomic__ = True  # type: ignore[attr-defined]  # a marker on the wrapper: installed once
    return call


class _NoTableCopy:
    """``copy`` as moto's DynamoDB backend module sees it: a ``Table`` "copied" is the table itself
    (its transaction backup; ``_transact_write_items`` keeps the items instead), anything else is
    deep-copied by ``copy.deepcopy``."""

    def __getattr__(self, name: str) -> Any:
        return getattr(copy, name)

    @staticmethod
    def deepcopy(value: Any, memo: Any = None) -> Any:
        return value if isinstance(value, Table) else copy.deepcopy(value, memo)


def _touched(backend: Any, transact_items: list[dict[str, Any]]) -> list[tuple[Any, Any, Any, Any]]:
    """(table, hash key, range key, a copy of the item as it is now or None) for each item named."""
    out = []
    for entry in transact_items:
        for op_type, op in entry.items():
            table = backend.tables.get(op.get("TableName")) if isinstance(op, dict) else None
            attrs = (op.get("Item") if op_type == "Put" else op.get("Key")) if table is not None else None
            if table is None or not isinstance(attrs, dict):
                continue
            try:
                hash_key = DynamoType(attrs[table.hash_key_attr])
                range_key = DynamoType(attrs[table.range_key_attr]) if table.range_key_attr else None
                current = table.get_item(hash_key, range_key)
            except Exception:  # noqa: BLE001 - a malformed key: moto's own validation answers it
                continue
            out.append((table, hash_key, range_key, copy.deepcopy(current)))
    return out


def _restore(touched: list[tuple[Any, Any, Any, Any]]) -> None:
    for table, hash_key, range_key, item in reversed(touched):
        if range_key is None:
            if item is None:
                table.items.pop(hash_key, None)
            else:
                table.items[hash_key] = item
        elif item is None:
            table.items.get(hash_key, {}).pop(range_key, None)
        else:
            table.items[hash_key][range_key] = item


def _transact_write_items(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def transact_write_items(self: Any, transact_items: list[dict[str, Any]]) -> Any:
        touched = _touched(self, transact_items)
        try:
            return original(self, transact_items)
        except BaseException:
            _restore(touched)
            raise

    return transact_write_items


def install() -> None:
    """Every DynamoDB request to moto in this process under one lock, from its backend call through
    its answer (the handler's ``call_action``, and every public method of the backend for callers
    that reach it directly), and its transactions backed up item by item; idempotent."""
    global _installed
    if _installed:
        return
    _installed = True
    for name, value in list(vars(DynamoDBBackend).items()):
        if not name.startswith("_") and callable(value) and not isinstance(value, (staticmethod, classmethod, type)):
            wrapped = _transact_write_items(value) if name == "transact_write_items" else value
            setattr(DynamoDBBackend, name, _atomic(wrapped))
    DynamoHandler.call_action = _atomic(DynamoHandler.call_action)  # type: ignore[method-assign]
    dynamodb_models.copy = _NoTableCopy()  # type: ignore[assignment]  # replaces moto's module: the backup is _touched's


def lock() -> threading.RLock:
    """The lock every DynamoDB request holds (tests hold it to see a call wait)."""
    return _LOCK
