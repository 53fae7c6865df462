"""The worker's threads for blocking store calls (S3, DynamoDB), with two priorities: a chunk's
path to the engine and its commit (start, ranged GET, run record, parts, the count and the signal)
go before background calls (checkpoints, which are live progress; audit receipts, which follow a
count already made). When several chunks end together, the last one's count and signal no longer
wait behind the others' receipts and checkpoints (docs/benchmarks.md, "Fixed overhead"). Calls are
taken in priority order, then in the order they came.

``threads`` calls run at once (``WorkerConfig.store_threads``), so chunks that end together commit
side by side instead of one after another (docs/worker.md, "Concurrency"). Only stores that say
they may be called from several threads at once (``Stores.concurrent``: the worker's AWS set,
whose DynamoDB table is a boto3 resource per thread, boto3 clients being thread-safe) get more
than one; the worker gives any other store set (the in-memory fakes) one thread, as before."""

from __future__ import annotations

import asyncio
import itertools
import queue
import threading
from collections import Counter
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

URGENT, BACKGROUND = 0, 1


class StoreThread:
    def __init__(self, name: str = "worker-stores", threads: int = 1, on_start: Callable[[], Any] | None = None):
        """``on_start``: run by each thread before its first call (its own clients made there, not
        on a chunk's way to the engine); an error there is left to the first call to meet."""
        if threads < 1:
            raise ValueError("threads must be at least 1")
        self._on_start = on_start
        self._queue: queue.PriorityQueue[tuple[int, int, Any]] = queue.PriorityQueue()
        self._order = itertools.count()
        self._lock = threading.Lock()
        self._threads = [threading.Thread(target=self._run, name=f"{name}-{i}", daemon=True) for i in range(threads)]
        for thread in self._threads:
            thread.start()
        self.calls: Counter[int] = Counter({URGENT: 0, BACKGROUND: 0})

    @property
    def threads(self) -> int:
        return len(self._threads)

    def submit(self, priority: int, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Future[Any]:
        future: Future[Any] = Future()
        self._queue.put((priority, next(self._order), (future, fn, args, kwargs)))
        return future

    async def call(self, priority: int, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        return await asyncio.wrap_future(self.submit(priority, fn, *args, **kwargs))

    def _run(self) -> None:
        if self._on_start is not None:
            try:
                self._on_start()
            except Exception:  # noqa: BLE001 - the first real call meets it again, with its caller
                pass
        while True:
            priority, _, item = self._queue.get()
            if item is None:
                return
            future, fn, args, kwargs = item
            if not future.set_running_or_notify_cancel():
                continue
            with self._lock:
                self.calls[priority] += 1
            try:
                future.set_result(fn(*args, **kwargs))
            except BaseException as exc:  # noqa: BLE001 - handed to the awaiting caller
                future.set_exception(exc)

    def shutdown(self, wait: bool = True) -> None:
        """Run what was submitted, then stop."""
        for _ in self._threads:  # one end mark per thread, after every call
            self._queue.put((BACKGROUND + 1, next(self._order), None))
        if wait:
            for thread in self._threads:
                thread.join()
