"""The worker's pool of threads for blocking store calls (S3, DynamoDB), with two priorities: a
chunk's path to the engine and its commit (start, ranged GET, run record, parts, the count and the
signal) go before background calls (checkpoints, which are live progress; audit receipts, which
follow a count already made). When several chunks end together, the last one's count and signal
do not wait behind the others' receipts and checkpoints (docs/benchmarks.md, "Fixed overhead").
Calls are taken in priority order, then in the order they came; at most one background call runs
at a time.

``threads`` calls run at once (``WorkerConfig.store_threads``), so chunks that end together commit
side by side instead of one after another (docs/worker.md, "Concurrency"). Only stores that say
they may be called from several threads at once (``Stores.concurrent``: the worker's AWS set,
whose DynamoDB table is a boto3 resource per thread, boto3 clients being thread-safe) get more
than one; the worker gives any other store set (the in-memory fakes) one thread."""

from __future__ import annotations

import asyncio
import heapq
import itertools
import threading
from collections import Counter, deque
from collections.abc import Awaitable, Callable
from concurrent.futures import Future
from typing import Any

URGENT, BACKGROUND = 0, 1

#: Runs one blocking store call off the event loop and returns its answer: a ``StorePool`` call
#: with its priority (and rank) bound, or any coroutine function of that shape (the tests' direct
#: call).
Io = Callable[..., Awaitable[Any]]


class StorePool:
    """``threads`` threads taking calls urgent first (by rank: the worker ranks a chunk's calls by
    the order its message came, so the first chunk of a batch reaches the engine after its own
    few calls, not after every chunk's), then in the order they came; at most one background call
    runs at a time, so the other threads stay free for urgent ones (a chunk's commit never waits
    behind several receipts at once)."""

    #: Background calls that may run at once.
    BACKGROUND_AT_ONCE = 1

    def __init__(self, name: str = "worker-stores", threads: int = 1, on_start: Callable[[], Any] | None = None):
        """``on_start``: run by each thread before its first call (its own clients made there, not
        on a chunk's way to the engine); an error there is left to the first call to meet."""
        if threads < 1:
            raise ValueError("threads must be at least 1")
        self._on_start = on_start
        self._urgent: list[tuple[int, int, Any]] = []  # a heap: (rank, order, call)
        self._background: deque[Any] = deque()
        self._order = itertools.count()
        self._cond = threading.Condition()
        self._background_running = 0
        self._stopping = False
        self.calls: Counter[int] = Counter({URGENT: 0, BACKGROUND: 0})
        self._threads = [threading.Thread(target=self._run, name=f"{name}-{i}", daemon=True) for i in range(threads)]
        for thread in self._threads:
            thread.start()

    @property
    def threads(self) -> int:
        return len(self._threads)

    def submit(self, priority: int, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Future[Any]:
        return self.submit_ranked(priority, 0, fn, *args, **kwargs)

    def submit_ranked(self, priority: int, rank: int, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Future[Any]:
        """``submit``; an urgent call of a lower ``rank`` is taken before any of a higher one."""
        future: Future[Any] = Future()
        call = (future, fn, args, kwargs)
        with self._cond:
            if self._stopping:
                raise RuntimeError("the store threads are stopping")
            if priority == URGENT:
                heapq.heappush(self._urgent, (rank, next(self._order), call))
            else:
                self._background.append(call)
            self._cond.notify()
        return future

    async def call(self, priority: int, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        return await self.call_ranked(priority, 0, fn, *args, **kwargs)

    async def call_ranked(self, priority: int, rank: int, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        return await asyncio.wrap_future(self.submit_ranked(priority, rank, fn, *args, **kwargs))

    def _next(self) -> tuple[int, Any] | None:
        """The next call to run (urgent first; background while fewer than BACKGROUND_AT_ONCE run),
        waiting for one; None once stopping and nothing is left."""
        with self._cond:
            while True:
                if self._urgent:
                    return URGENT, heapq.heappop(self._urgent)[2]
                if self._background and self._background_running < self.BACKGROUND_AT_ONCE:
                    self._background_running += 1
                    return BACKGROUND, self._background.popleft()
                if self._stopping and not self._background:
                    return None
                self._cond.wait()

    def _run(self) -> None:
        if self._on_start is not None:
            try:
                self._on_start()
            except Exception:  # noqa: BLE001 - the first real call meets it again, with its caller
                pass
        while (taken := self._next()) is not None:
            priority, (future, fn, args, kwargs) = taken
            try:
                if future.set_running_or_notify_cancel():
                    with self._cond:
                        self.calls[priority] += 1
                    try:
                        future.set_result(fn(*args, **kwargs))
                    except BaseException as exc:  # noqa: BLE001 - handed to the awaiting caller
                        future.set_exception(exc)
            finally:
                if priority == BACKGROUND:
                    with self._cond:
                        self._background_running -= 1
                        self._cond.notify_all()

    def shutdown(self, wait: bool = True) -> None:
        """Run what was submitted, then stop."""
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        if wait:
            for thread in self._threads:
                thread.join()
