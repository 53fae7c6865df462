"""One line, and one chunk, through the engine: the code path shared by the SQS worker and the
offline ``batchctl run-batch``.

A line becomes exactly one result line: the engine's answer (2xx to the output part, any other
status to the error part, with the engine's status code and body), or an error when the engine
never answered or the line is not a valid request. Results keep input order.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import Any, TypeVar

from functions.core import accounting, results
from functions.core.lines import LineError, RawLine, check_request, iter_lines, parse_request
from functions.core.messages import WorkMessage
from functions.core.models import BatchOutputLine
from functions.core.accounting import ChunkOutcome
from functions.core.ports import Engine, Stores

log = logging.getLogger("gpu_worker.chunk")
T = TypeVar("T")

#: Runs a blocking store call off the event loop (the worker's single store thread).
Io = Callable[..., Awaitable[Any]]


@dataclass(frozen=True)
class LineResult:
    line: BatchOutputLine
    #: The engine's ``usage`` of a 2xx answer (None otherwise).
    usage: dict[str, Any] | None = None

    @property
    def succeeded(self) -> bool:
        return results.succeeded(self.line)


async def run_line(engine: Engine, raw: RawLine, *, endpoint: str | None, endpoints: Iterable[str] = ()) -> LineResult:
    """One input line -> one result line. ``endpoint`` is the batch's (every line must use it);
    None (offline mode) accepts a line's own ``url`` if it is one of ``endpoints``."""
    custom_id = results.custom_id_of(None, raw)
    try:
        obj = parse_request(raw)
        custom_id = results.custom_id_of(obj, raw)
        url = obj.get("url")
        if endpoint is None:
            if url not in set(endpoints):
                raise LineError("invalid_url", f"The url {url!r} is not one of {sorted(endpoints)}.", "url")
            endpoint = url
        check_request(obj, endpoint=endpoint)
    except LineError as exc:
        return LineResult(results.error_line(custom_id, exc.code, exc.message))
    reply = await engine.post(endpoint, obj["body"])
    if reply.status is None:
        return LineResult(results.error_line(custom_id, reply.error_code, reply.error_message))
    line = results.response_line(custom_id, reply.status, reply.body, reply.request_id)
    usage = reply.body.get("usage") if results.succeeded(line) and isinstance(reply.body, dict) else None
    return LineResult(line, usage)


async def run_ordered(
    lines: Iterable[RawLine], run: Callable[[RawLine], Awaitable[T]], *, window: int
) -> AsyncIterator[T]:
    """Run ``run`` on each non-blank line, at most ``window`` started ahead of the oldest
    unfinished one, and yield the results in input order (memory bounded by ``window``)."""
    pending: deque[asyncio.Task[T]] = deque()
    try:
        for raw in lines:
            if raw.blank:
                continue
            pending.append(asyncio.ensure_future(run(raw)))
            if len(pending) >= window:
                yield await pending.popleft()
        while pending:
            yield await pending.popleft()
    finally:
        for task in pending:
            task.cancel()
        if pending:
            await asyncio.gather(*pending, return_exceptions=True)


# --- one chunk of a batch (the SQS worker) ----------------------------------------------------
@dataclass(frozen=True)
class ChunkReport:
    """What processing a chunk did. ``skipped``: the batch no longer takes work (or the chunk
    was already counted); nothing was run."""

    skipped: bool = False
    completed: int = 0
    failed: int = 0
    usage: accounting.Usage | None = None
    outcome: ChunkOutcome | None = None
    seconds: float = 0.0


def read_chunk(stores: Stores, message: WorkMessage, *, max_line_bytes: int) -> list[RawLine]:
    """The chunk's lines (blank ones included: they keep line numbers), one ranged GET."""
    data = stores.objects.iter_range(message.input_key, message.byte_start, message.byte_end)
    return list(iter_lines(data, max_line_bytes=max_line_bytes, start=message.byte_start, first_number=message.first_line))


def already_counted(stores: Stores, message: WorkMessage) -> bool:
    """True if this chunk's marker exists (a redelivery after a worker recorded it but died
    before deleting the message): running it again would only waste the engine's time."""
    return stores.batches.counted_chunk(message.tenant, message.batch_id, message.chunk) is not None


async def process_chunk(
    stores: Stores,
    message: WorkMessage,
    engine: Engine,
    *,
    io: Io,
    max_line_bytes: int,
    now: Callable[[], float] = time.time,
    on_dispatch: Callable[[], None] = lambda: None,
    commits: set[asyncio.Future[Any]] | None = None,
) -> ChunkReport:
    """Skip the chunk if its batch stopped, or if it is already counted (then only re-signal the
    workflow if every chunk is counted); else run its lines, write its parts, count it (the last
    chunk signals the workflow). ``io`` runs blocking store calls off the loop;
    ``on_dispatch`` is called once the lines are handed to the engine client; a commit that
    outlives a cancelled caller stays in ``commits`` until it is done (the loop awaits them)."""
    started = now()
    if await io(accounting.start_chunk, stores, message) is None:
        return ChunkReport(skipped=True)
    if await io(already_counted, stores, message):
        await io(accounting.signal_if_all_counted, stores, message)
        return ChunkReport(skipped=True)
    raws = await io(read_chunk, stores, message, max_line_bytes=max_line_bytes)
    requests = [r for r in raws if not r.blank]
    if len(requests) != message.line_count:
        log.warning("chunk %s/%d has %d lines, the message says %d", message.batch_id, message.chunk, len(requests), message.line_count)
    on_dispatch()
    outputs = [
        r async for r in run_ordered(
            requests, lambda raw: run_line(engine, raw, endpoint=message.endpoint), window=max(1, len(requests))
        )
    ]
    usage = accounting.Usage()
    for r in outputs:
        usage.add_response(r.usage)
    # Once the parts are being written the chunk is committed: a SIGTERM (task cancellation) must
    # not interrupt between the parts and the count, or a redelivery would rewrite counted parts.
    commit = asyncio.ensure_future(_commit(stores, message, [r.line for r in outputs], usage, io=io, now=now))
    if commits is not None:
        commits.add(commit)
        commit.add_done_callback(commits.discard)
    completed, failed, outcome = await asyncio.shield(commit)
    return ChunkReport(False, completed, failed, usage, outcome, now() - started)


async def _commit(
    stores: Stores, message: WorkMessage, lines: list[BatchOutputLine], usage: accounting.Usage, *, io: Io, now: Callable[[], float]
) -> tuple[int, int, ChunkOutcome]:
    parts = await io(results.write_parts, stores.objects, message, lines)
    outcome = await io(accounting.record_chunk, stores, message, parts=parts, usage=usage, now=int(now()))
    return parts.completed, parts.failed, outcome
