"""One chunk through the worker's chunk path (``gpu_worker.chunk.ChunkRunner``) with a runner of
its own, for the chunk-level tests and benchmarks: the runner's fields and ``process``'s
arguments as keywords. The worker builds one runner for all its chunks (``loop.Worker``)."""

from collections.abc import Callable
from typing import Any

from functions.core import chunk_lifecycle, limits, schema
from functions.core.chunk_lifecycle import RunStart
from functions.core.messages import WorkMessage
from functions.core.ports import Engine, Objects, Stores
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


def part_bytes(objects: Objects, tenant: str, batch_id: str, chunk: int, attempt: str, kind: str) -> bytes:
    """One part ("out" or "err") of a counted attempt, as written; b"" for a part with no line,
    which is never written (``results.write_parts``)."""
    key = schema.chunk_part_key(tenant, batch_id, chunk, attempt, kind)
    return objects.get(key) if key in objects.list_keys(key) else b""


def open_attempt(stores: Stores, message: WorkMessage, attempt: str = "a1") -> RunStart | None:
    """A worker opens ``attempt`` at the chunk (only while its batch takes new chunks: None if
    not), with the worker's poison budget."""
    return chunk_lifecycle.begin_run(
        stores, message, attempt, max_strikes=limits.CHUNK_MAX_STRIKES, max_failures=limits.CHUNK_MAX_FAILURES
    )
