"""The commit of a chunk whose attempt gave every line a result: its parts written, the chunk
counted (the last chunk signals the workflow), then its audit receipt.

Once the parts are being written the chunk is committed: a SIGTERM (task cancellation) must not
interrupt between the parts and the count, or a redelivery would rewrite counted parts. So the
commit is shielded from its caller's cancellation and, while it runs, kept in the worker's
``commits`` (the loop's drain awaits them). A store error while committing (a part's PUT, the
counting transaction) is a benign end of the attempt, keeping what ran as a checkpoint, so the
next attempt neither runs it again nor counts a failure.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from functions.core import chunk_lifecycle, results
from functions.core.chunk_lifecycle import ChunkOutcome
from functions.core.messages import WorkMessage
from functions.core.ports import Stores
from functions.core.wire import BatchOutputLine
from functions.core.work import Spend

from .attempt import Attempt
from .store_pool import Io

log = logging.getLogger("gpu_worker.chunk")


@dataclass(frozen=True)
class Committed:
    """A counted chunk: its lines by part, its usage, the count's outcome, and when it was counted
    and signalled (clock seconds; its audit receipt may come later)."""

    completed: int
    failed: int
    usage: chunk_lifecycle.Usage
    outcome: ChunkOutcome
    counted_at: float


async def commit(
    attempt: Attempt, *, on_commit: Callable[[], None], commits: set[asyncio.Future[Any]] | None
) -> Committed:
    """Write the attempt's results as the chunk's parts and count it (``on_commit`` is called as
    the parts start being written: from then on the chunk is never abandoned)."""
    usage = chunk_lifecycle.Usage()
    for r in attempt.done:
        usage.add_response(r.usage)
    on_commit()
    task = asyncio.ensure_future(
        _write_and_count(
            attempt.stores,
            attempt.message,
            [r.line for r in attempt.done],
            usage,
            attempt.total_spend(),
            io=attempt.io,
            now=attempt.now,
            background=attempt.background,
        )
    )
    if commits is not None:
        commits.add(task)
        task.add_done_callback(commits.discard)
    try:
        completed, failed, outcome, counted_at = await asyncio.shield(task)
    except asyncio.CancelledError:
        raise  # the commit goes on (shielded; the worker's drain awaits it)
    except Exception:
        try:
            await attempt.flush()
        except Exception:
            log.exception(
                "chunk %s/%d: could not checkpoint before releasing", attempt.message.batch_id, attempt.message.chunk
            )
        await attempt.end_benignly("store error while committing")
        raise
    return Committed(completed, failed, usage, outcome, counted_at)


async def _write_and_count(
    stores: Stores,
    message: WorkMessage,
    lines: list[BatchOutputLine],
    usage: chunk_lifecycle.Usage,
    spent: Spend,
    *,
    io: Io,
    now: Callable[[], float],
    background: Io,
) -> tuple[int, int, ChunkOutcome, float]:
    parts = await io(results.write_parts, stores.objects, message, lines)
    outcome = await io(
        chunk_lifecycle.record_chunk,
        stores,
        message,
        parts=parts,
        usage=usage,
        now=int(now()),
        receipt=False,
        spent=spent,
    )
    counted_at = now()
    # The count and the signal are done: the receipt may wait behind other chunks' commits.
    await background(chunk_lifecycle.record_receipt, stores, message, outcome)
    return parts.completed, parts.failed, outcome, counted_at
