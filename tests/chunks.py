"""One chunk through the worker's chunk path (``gpu_worker.chunk.ChunkRunner``) with a runner of
its own, for the chunk-level tests and benchmarks: the runner's fields and ``process``'s
arguments as keywords. The worker builds one runner for all its chunks (``loop.Worker``)."""

from collections.abc import Callable
from typing import Any

from functions.core.messages import WorkMessage
from functions.core.ports import Engine, Stores
from gpu_worker.chunk import ChunkReport, ChunkRunner


async def process_chunk(
    stores: Stores,
    message: WorkMessage,
    engine: Engine,
    *,
    owner: object = None,
    attempt: str | None = None,
    on_dispatch: Callable[[], None] = lambda: None,
    on_commit: Callable[[], None] = lambda: None,
    **runner: Any,
) -> ChunkReport:
    return await ChunkRunner(stores, engine, **runner).process(
        message,
        owner=owner,
        attempt=attempt,
        on_dispatch=on_dispatch,
        on_commit=on_commit,
    )
