"""One attempt at a chunk (docs/reliability.md, "Poison isolation"): open it on the chunk's run
record, take the results earlier attempts checkpointed, run the other lines (all together; in
small groups alone on the engine once the chunk failed for real; none once its budget is spent),
checkpoint results as they come, and record a benign end when the attempt stops for a reason that
is not the chunk's.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from functions.core import chunk_lifecycle, limits, results
from functions.core.lines import LineError, RawLine, parse_request
from functions.core.messages import WorkMessage
from functions.core.ports import Stores
from functions.core.records import ChunkRunRecord
from functions.core.wire import BatchOutputLine
from functions.core.work import Spend

from .engine_client import EngineDown
from .gated_engine import ChunkEngines, GatedEngine
from .line_runner import LineResult, run_line, run_ordered
from .media import DATA_URLS_ONLY, MediaPolicy
from .policy_checks import LineChecks
from .store_pool import Io

log = logging.getLogger("gpu_worker.chunk")


@dataclass(frozen=True)
class RunPolicy:
    """Checkpoints and the poison budget (docs/reliability.md, "Poison isolation"). A checkpoint
    is written once ``checkpoint_lines`` results wait (and ``checkpoint_min_seconds`` passed since
    the last one), or ``checkpoint_seconds`` after the last one; never for the chunk's last lines
    (the commit writes them); after every group in careful mode. 0 turns a trigger off. Careful
    mode sends ``careful_group_lines`` lines at a time alone on the engine (a suspect line, one
    that was in a group that died, goes by itself)."""

    checkpoint_lines: int = 25
    checkpoint_seconds: float = 5.0
    #: The line trigger waits this long after the last checkpoint (or the attempt's start): lines
    #: that finish in milliseconds (short embeddings) are checkpointed by time, not every
    #: ``checkpoint_lines``, so checkpoints scale with the chunk's run time, not its lines.
    checkpoint_min_seconds: float = 1.0
    careful_group_lines: int = 8
    max_strikes: int = limits.CHUNK_MAX_STRIKES
    max_failures: int = limits.CHUNK_MAX_FAILURES
    #: Where an audio line's ``file_url`` may be fetched from (``Settings.allowed_media_domains``;
    #: a message's ``allowed_media_domains`` narrows it for its chunk).
    media: MediaPolicy = DATA_URLS_ONLY


class Attempt:
    """One attempt at a chunk: its results so far (in input order), how many of them are
    checkpointed (``saved``), and its run record. ``io`` runs the attempt's urgent store calls
    (its run record, the checkpoints it reads back, its benign end); ``background`` its
    checkpoints (live progress, which may wait behind other chunks' urgent calls).

    ``run`` ends without an exception once every line has a result. It records a benign end (not
    spending the poison budget) when it is cancelled (shutdown), hits a store error, or meets
    ``EngineDown`` only with lines sent after the engine was known down (``EngineGate.down``).
    Anything else (the engine died with its lines in flight, the worker was killed) is a real
    failure, found by the next attempt."""

    def __init__(
        self,
        stores: Stores,
        message: WorkMessage,
        attempt: str,
        engines: ChunkEngines,
        *,
        io: Io,
        background: Io,
        now: Callable[[], float],
        policy: RunPolicy,
        prepare: Callable[[dict[str, Any]], dict[str, Any]] | None = None,
        guard: LineChecks | None = None,
    ):
        self.stores, self.message, self.attempt, self.engines = stores, message, attempt, engines
        self.io, self.background, self.now, self.policy = io, background, now, policy
        self.record: ChunkRunRecord | None = None
        self.done: list[LineResult] = []
        self.saved = 0  # of self.done, how many are checkpointed
        self.flushed_at = now()
        #: Whether the run record put this attempt in careful mode; results read back from
        #: checkpoints; lines failed as ``engine_crashed``.
        self.careful = False
        self.reused = 0
        self.crashed = 0
        #: What the engine spent on this attempt's lines, and how much of it the run record holds.
        self.spent = Spend()
        self.spent_recorded = Spend()
        self.prepare = prepare
        #: The message's prompt and output policy, bound to the worker's check processes.
        self.guard = guard
        #: Where its audio lines may be fetched from: the worker's hosts, narrowed by the
        #: tenant's as ingest snapshotted them into the message.
        self.media = policy.media.narrowed(message.allowed_media_domains)

    async def run(
        self, requests: list[RawLine], start: chunk_lifecycle.RunStart, *, on_dispatch: Callable[[], None]
    ) -> None:
        """Give every request line of the chunk a result, in the attempt ``start`` opened
        (``chunk_lifecycle.begin_run``; ``on_dispatch``: called once the lines that run are about
        to be handed to the engine)."""
        self.record = start.record
        try:
            await self._run(requests, start, on_dispatch)
        except asyncio.CancelledError:
            await asyncio.shield(self.end_benignly("cancelled"))
            raise
        except EngineDown:
            if not self.engines.died_in_flight:
                await self.end_benignly("engine already down")
            else:
                log.warning(
                    "chunk %s/%d: the engine died with its lines in flight (a real failure)",
                    self.message.batch_id,
                    self.message.chunk,
                )
            raise
        except Exception:
            await self.end_benignly("store error")
            raise

    async def _run(
        self, requests: list[RawLine], start: chunk_lifecycle.RunStart, on_dispatch: Callable[[], None]
    ) -> None:
        self.careful = start.record.careful
        if start.record.segments:
            for line in await self.io(
                results.read_checkpoints, self.stores.objects, self.message, start.record.cover()
            ):
                self.done.append(LineResult.written(line))
        self.saved = self.reused = len(self.done)
        on_dispatch()
        if start.exhausted:
            self._fail_unwritten(requests, start.record)
        elif start.record.careful:
            await self._run_careful(requests, start.record)
        else:
            await self._run_together(requests[self.reused :])

    def _fail_unwritten(self, requests: list[RawLine], record: ChunkRunRecord) -> None:
        """The poison budget is spent: every line no attempt wrote fails, a blamed one as
        ``engine_crashed``, the others as ``chunk_failed``."""
        text = results.chunk_failed_message(record.failures)
        for index in range(self.reused, len(requests)):
            code, why = (
                (results.ENGINE_CRASHED, results.ENGINE_CRASHED_MESSAGE)
                if index in record.blamed
                else (results.CHUNK_FAILED, text)
            )
            self.crashed += code == results.ENGINE_CRASHED
            self.done.append(LineResult(results.error_line(_custom_id(requests[index]), code, why)))

    async def _run_careful(self, requests: list[RawLine], record: ChunkRunRecord) -> None:
        """Careful mode: groups (``careful_group_end``) recorded in flight, then sent alone on the
        engine; a blamed line is never sent again; a checkpoint after every group."""
        index = self.reused
        while index < len(requests):
            end = careful_group_end(record, index, len(requests), self.policy.careful_group_lines)
            if index in record.blamed:
                self.crashed += 1
                self.done.append(
                    LineResult(
                        results.error_line(
                            _custom_id(requests[index]), results.ENGINE_CRASHED, results.ENGINE_CRASHED_MESSAGE
                        )
                    )
                )
            else:
                self.record = await self.io(
                    chunk_lifecycle.mark_in_flight, self.stores, self.message, self.attempt, (index, end), self.record
                )
                await self._run_alone(requests[index:end])
            await self.flush()  # every group, the last too: a written line is never blamed
            index = end

    async def _run_alone(self, group: list[RawLine]) -> None:
        alone = self.engines.alone
        async with self.engines.exclusive():  # no other chunk's line is in the engine with these
            async for result in run_ordered(group, lambda raw: self._line(alone, raw), window=len(group)):
                self.spent += result.spent
                self.done.append(result)

    async def _run_together(self, todo: list[RawLine]) -> None:
        together = self.engines.together
        position = 0
        async for result in run_ordered(todo, lambda raw: self._line(together, raw), window=max(1, len(todo))):
            self.spent += result.spent
            position += 1
            await self.add(result, remaining=len(todo) - position)

    def _line(self, engine: GatedEngine, raw: RawLine) -> Awaitable[LineResult]:
        return run_line(
            engine,
            raw,
            endpoint=self.message.endpoint,
            guard=self.guard,
            prepare=self.prepare,
            media=self.media,
        )

    def unrecorded_spend(self) -> Spend:
        """What the engine spent on this attempt's lines that the run record does not hold yet."""
        return self.spent - self.spent_recorded

    def total_spend(self) -> Spend:
        """What the engine spent on the chunk: every attempt's record, and this one's unrecorded part."""
        return (self.record.spend() if self.record is not None else Spend()) + self.unrecorded_spend()

    async def add(self, result: LineResult, *, remaining: int, force: bool = False) -> None:
        self.done.append(result)
        waiting = len(self.done) - self.saved
        policy, since = self.policy, self.now() - self.flushed_at
        due = (
            force
            or (
                policy.checkpoint_lines
                and waiting >= policy.checkpoint_lines
                and since >= policy.checkpoint_min_seconds
            )
            or (policy.checkpoint_seconds and since >= policy.checkpoint_seconds)
        )
        if due and (remaining > 0 or force):
            await self.flush()

    async def flush(self) -> None:
        lines = [r.line for r in self.done[self.saved :]]
        if not lines:
            return
        spent = self.unrecorded_spend()
        self.record = await self.background(
            _checkpoint, self.stores, self.message, self.attempt, self.saved, lines, self.record, spent
        )
        self.spent_recorded += spent
        self.saved += len(lines)
        self.flushed_at = self.now()

    async def end_benignly(self, why: str) -> None:
        try:
            await self.io(
                chunk_lifecycle.end_run, self.stores, self.message, self.attempt, self.record, self.unrecorded_spend()
            )
        except Exception:  # then the next attempt counts this one as failed: a careful run, no line lost
            log.exception(
                "chunk %s/%d: could not record a benign end (%s)", self.message.batch_id, self.message.chunk, why
            )


def careful_group_end(record: ChunkRunRecord, index: int, count: int, size: int) -> int:
    """The end of the careful group starting at request ``index``: up to ``size`` lines, but a
    blamed or suspect line (one that was in a group that died) always goes by itself."""
    end = index + 1
    if index in record.suspects or index in record.blamed:
        return end
    while end < count and end - index < size and end not in record.suspects and end not in record.blamed:
        end += 1
    return end


def _custom_id(raw: RawLine) -> str:
    try:
        return results.custom_id_of(parse_request(raw), raw)
    except LineError:
        return results.custom_id_of(None, raw)


def _checkpoint(
    stores: Stores,
    message: WorkMessage,
    attempt: str,
    start: int,
    lines: list[BatchOutputLine],
    current: ChunkRunRecord | None,
    spent: Spend = Spend(),
) -> ChunkRunRecord:
    """Write a checkpoint, then record it on the run record with its lines' outcomes, the live
    progress (a crash between the two only leaves an object nobody reads: its lines run again,
    and were never shown as done)."""
    segment = results.write_checkpoint(stores.objects, message, start, lines)
    outcomes = "".join("1" if results.succeeded(line) else "0" for line in lines)
    return chunk_lifecycle.add_segment(stores, message, attempt, segment, current, outcomes, spent)
