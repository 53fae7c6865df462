"""The worker's one thread for blocking store calls (S3, DynamoDB: boto3 resources are not
thread-safe, and a chunk makes only a handful of calls), with two priorities: a chunk's path to
the engine and its commit (start, ranged GET, run record, parts, the count and the signal) go
before background calls (checkpoints, which are live progress; audit receipts, which follow a
count already made). When several chunks end together, the last one's count and signal no longer
wait behind the others' receipts and checkpoints (docs/benchmarks.md, "Fixed overhead"). Within
a priority, calls run in the order they came."""

from __future__ import annotations

import asyncio
import itertools
import queue
import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

URGENT, BACKGROUND = 0, 1


class StoreThread:
    def __init__(self, name: str = "worker-stores"):
        self._queue: queue.PriorityQueue[tuple[int, int, Any]] = queue.PriorityQueue()
        self._order = itertools.count()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()
        self.calls = {URGENT: 0, BACKGROUND: 0}

    def submit(self, priority: int, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Future[Any]:
        future: Future[Any] = Future()
        self._queue.put((priority, next(self._order), (future, fn, args, kwargs)))
        return future

    async def call(self, priority: int, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        return await asyncio.wrap_future(self.submit(priority, fn, *args, **kwargs))

    def _run(self) -> None:
        while True:
            priority, _, item = self._queue.get()
            if item is None:
                return
            future, fn, args, kwargs = item
            if not future.set_running_or_notify_cancel():
                continue
            self.calls[priority] += 1
            try:
                future.set_result(fn(*args, **kwargs))
            except BaseException as exc:  # noqa: BLE001 - handed to the awaiting caller
                future.set_exception(exc)

    def shutdown(self, wait: bool = True) -> None:
        """Run what was submitted, then stop."""
        self._queue.put((BACKGROUND + 1, next(self._order), None))
        if wait:
            self._thread.join()
