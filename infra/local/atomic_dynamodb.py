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
Holding one lock over each backend call gives that (serializable, more than AWS's per-item
isolation, never less), at the cost of DynamoDB calls not overlapping each other in moto, whose
calls are short and in-memory. The GPU worker commits chunks from several threads at once
(``WorkerConfig.store_threads``), so without this its count transactions could undo each other.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable
from typing import Any

from moto.dynamodb.models import DynamoDBBackend

_LOCK = threading.RLock()
_ORIGINALS: dict[str, Callable[..., Any]] = {}


def _atomic(fn: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(fn)
    def call(*args: Any, **kwargs: Any) -> Any:
        with _LOCK:
            return fn(*args, **kwargs)
    call.__wrapped_atomic__ = True  # type: ignore[attr-defined]
    return call


def install() -> None:
    """Every public method of moto's DynamoDB backend (in this process) under one lock; idempotent."""
    if _ORIGINALS:
        return
    for name, value in vars(DynamoDBBackend).items():
        if not name.startswith("_") and callable(value) and not isinstance(value, (staticmethod, classmethod, type)):
            _ORIGINALS[name] = value
            setattr(DynamoDBBackend, name, _atomic(value))


def installed() -> bool:
    return bool(_ORIGINALS)


def lock() -> threading.RLock:
    """The lock every DynamoDB backend call holds (tests hold it to see a call wait)."""
    return _LOCK
