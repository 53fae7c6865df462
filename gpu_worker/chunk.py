"""One chunk of a batch through the engine (the SQS worker): its attempt, checkpoints, careful
mode and commit. One line's path (``run_line``, shared with the offline ``batchctl run-batch``) is
``line_runner``'s.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from functions.core import accounting, limits, results
from functions.core.accounting import ChunkOutcome
from functions.core.lines import LineError, RawLine, iter_lines, parse_request
from functions.core.messages import WorkMessage
from functions.core.models import BatchOutputLine
from functions.core.ports import Engine, Stores
from functions.core.records import ChunkRunRecord

from .admission import Admission
from .budget import BudgetWatch
from .engine import EngineDown
from .engine_gate import EngineGate
from .gated_engine import GatedEngine
from .line_runner import LineResult, run_line, run_ordered

log = logging.getLogger("gpu_worker.chunk")

#: Runs a blocking store call off the event loop (the worker's single store thread).
Io = Callable[..., Awaitable[Any]]


@dataclass(frozen=True)
class ChunkReport:
    """What processing a chunk did. ``skipped``: the batch no longer takes work (or the chunk
    was already counted); nothing was run. ``reused``: lines whose checkpointed results an
    earlier attempt wrote (not sent again); ``crashed``: lines failed as ``engine_crashed``."""

    skipped: bool = False
    completed: int = 0
    failed: int = 0
    usage: accounting.Usage | None = None
    outcome: ChunkOutcome | None = None
    seconds: float = 0.0
    careful: bool = False
    reused: int = 0
    crashed: int = 0
    #: When the chunk's first line entered the engine and its last answer came, and when its
    #: parts were written and it was counted and signalled (clock seconds; its audit receipt may
    #: come later; None if no line was sent): the fixed overhead around
    #: the engine (docs/benchmarks.md, "Fixed overhead").
    first_sent_at: float | None = None
    last_answer_at: float | None = None
    committed_at: float | None = None


@dataclass(frozen=True)
class RunPolicy:
    """Checkpoints and the poison budget (docs/reliability.md, "Poison isolation"). A checkpoint
    is written once ``checkpoint_lines`` results wait, or ``checkpoint_seconds`` after the last
    one; never for the chunk's last lines (the commit writes them); after every group in careful
    mode. 0 turns a trigger off. Careful mode sends ``careful_group_lines`` lines at a time alone
    on the engine (a suspect line, one that was in a group that died, goes by itself)."""

    checkpoint_lines: int = 25
    checkpoint_seconds: float = 5.0
    careful_group_lines: int = 8
    max_strikes: int = limits.CHUNK_MAX_STRIKES
    max_failures: int = limits.CHUNK_MAX_FAILURES


def read_chunk(stores: Stores, message: WorkMessage, *, max_line_bytes: int) -> list[RawLine]:
    """The chunk's lines (blank ones included: they keep line numbers), one ranged GET."""
    data = stores.objects.iter_range(message.input_key, message.byte_start, message.byte_end)
    return list(iter_lines(data, max_line_bytes=max_line_bytes, start=message.byte_start, first_number=message.first_line))


def already_counted(stores: Stores, message: WorkMessage) -> bool:
    """True if this chunk's marker exists (a redelivery after a worker recorded it but died
    before deleting the message): running it again would only waste the engine's time."""
    return stores.batches.counted_chunk(message.tenant, message.batch_id, message.chunk) is not None


def _custom_id(raw: RawLine) -> str:
    try:
        return results.custom_id_of(parse_request(raw), raw)
    except LineError:
        return results.custom_id_of(None, raw)


def _checkpoint(stores: Stores, message: WorkMessage, attempt: str, start: int, lines: list[BatchOutputLine],
                current: ChunkRunRecord | None) -> ChunkRunRecord:
    """Write a checkpoint, then record it on the run record with its lines' outcomes, the live
    progress (a crash between the two only leaves an object nobody reads: its lines run again,
    and were never shown as done)."""
    segment = results.write_checkpoint(stores.objects, message, start, lines)
    outcomes = "".join("1" if results.succeeded(line) else "0" for line in lines)
    return accounting.add_segment(stores, message, attempt, segment, current, outcomes)


class _Run:
    """One attempt at a chunk: its results so far (in input order) and its run record."""

    def __init__(self, stores: Stores, message: WorkMessage, attempt: str, record: ChunkRunRecord | None, *, io: Io,
                 now: Callable[[], float], policy: RunPolicy):
        self.stores, self.message, self.attempt, self.record = stores, message, attempt, record
        self.io, self.now, self.policy = io, now, policy
        self.done: list[LineResult] = []
        self.saved = 0  # of self.done, how many are checkpointed
        self.flushed_at = now()

    async def add(self, result: LineResult, *, remaining: int, force: bool = False) -> None:
        self.done.append(result)
        waiting = len(self.done) - self.saved
        due = force or (self.policy.checkpoint_lines and waiting >= self.policy.checkpoint_lines) or (
            self.policy.checkpoint_seconds and self.now() - self.flushed_at >= self.policy.checkpoint_seconds
        )
        if due and (remaining > 0 or force):
            await self.flush()

    async def flush(self) -> None:
        lines = [r.line for r in self.done[self.saved:]]
        if not lines:
            return
        self.record = await self.io(_checkpoint, self.stores, self.message, self.attempt, self.saved, lines, self.record)
        self.saved += len(lines)
        self.flushed_at = self.now()


async def process_chunk(
    stores: Stores,
    message: WorkMessage,
    engine: Engine,
    *,
    io: Io,
    max_line_bytes: int,
    now: Callable[[], float] = time.time,
    on_dispatch: Callable[[], None] = lambda: None,
    on_commit: Callable[[], None] = lambda: None,
    commits: set[asyncio.Future[Any]] | None = None,
    gate: EngineGate | None = None,
    policy: RunPolicy = RunPolicy(),
    attempt: str | None = None,
    admission: Admission | None = None,
    owner: object = None,
    budget: BudgetWatch | None = None,
    background: Io | None = None,
) -> ChunkReport:
    """Skip the chunk if its batch stopped, or if it is already counted (then only re-signal the
    workflow if every chunk is counted); else open an attempt on its run record, run the lines
    no earlier attempt checkpointed (all together; or, if the chunk failed for real before, in
    small groups alone on the engine, see ``_group``), checkpoint results as they come, write its
    parts, count it (the last chunk signals the workflow). ``io`` runs blocking store calls off the loop;
    ``on_dispatch`` is called once the lines are handed to the engine client, ``on_commit`` as its
    parts start being written (from then on the chunk is never abandoned); a commit that
    outlives a cancelled caller stays in ``commits`` until it is done (the loop awaits them).

    An attempt that ends without commit records a benign end (not spending the poison budget)
    when it was cancelled (shutdown), hit a store error, or met ``EngineDown`` only with lines
    sent after the engine was known down (``EngineGate.down``). Anything else (the engine died
    with its lines in flight, the worker was killed) is a real failure, found by the next
    attempt. ``gate`` is the worker's (shared by its chunks; default: this chunk's own), as is
    ``admission`` (the order lines enter the engine in; default: as they come); ``owner`` names
    this chunk's waiting lines there. ``budget`` (the worker's ``BudgetWatch``): under a tenant's
    ``stop`` budget, a line that would enter the engine once the budget is used up is written as
    ``budget_exceeded`` instead (gpu_worker/budget.py). ``background`` runs the store calls that
    may wait behind other chunks' urgent ones (checkpoints, the audit receipt; default: ``io``)."""
    started = now()
    # Side by side (each on a store thread): none depends on another's answer. The read is wasted
    # only for a chunk that is skipped; the run record is opened (begin_run) only after both
    # checks said go.
    opened, counted, raws = await asyncio.gather(
        io(accounting.start_chunk, stores, message), io(already_counted, stores, message),
        io(read_chunk, stores, message, max_line_bytes=max_line_bytes), return_exceptions=True,
    )
    for answer in (opened, counted):  # the checks' errors first, as when they ran first
        if isinstance(answer, BaseException):
            raise answer
    if opened is None:
        return ChunkReport(skipped=True)  # a read error of a skipped chunk does not matter
    if counted:
        await io(accounting.signal_if_all_counted, stores, message)
        return ChunkReport(skipped=True)
    if isinstance(raws, BaseException):
        raise raws
    requests = [r for r in raws if not r.blank]
    if len(requests) != message.line_count:
        log.warning("chunk %s/%d has %d lines, the message says %d", message.batch_id, message.chunk, len(requests), message.line_count)
    attempt = attempt or secrets.token_hex(6)
    background = background or io
    run = _Run(stores, message, attempt, None, io=background, now=now, policy=policy)
    crashed = 0
    gate = gate or EngineGate()
    stop = (lambda: budget.stop_reason(message)) if budget is not None and message.budget_stop is not None else None
    alone = GatedEngine(engine, gate, held=True, now=now, stop=stop)
    together = GatedEngine(engine, gate, held=False, admission=admission, owner=owner, now=now, group=message.tenant, stop=stop)
    try:
        start = await io(accounting.begin_run, stores, message, attempt, max_strikes=policy.max_strikes,
                         max_failures=policy.max_failures)
        run.record = start.record
        if start.record.segments:
            for line in await io(results.read_checkpoints, stores.objects, message, start.record.cover()):
                run.done.append(LineResult.written(line))
        run.saved = reused = len(run.done)
        on_dispatch()
        if start.exhausted:
            text = results.chunk_failed_message(start.record.failures)
            for index in range(reused, len(requests)):
                code, why = (results.ENGINE_CRASHED, results.ENGINE_CRASHED_MESSAGE) if index in start.record.blamed else (
                    results.CHUNK_FAILED, text)
                crashed += code == results.ENGINE_CRASHED
                run.done.append(LineResult(results.error_line(_custom_id(requests[index]), code, why)))
        elif start.record.careful:
            record, index = start.record, reused
            while index < len(requests):
                end = _group(record, index, len(requests), policy.careful_group_lines)
                if index in record.blamed:
                    crashed += 1
                    run.done.append(LineResult(results.error_line(
                        _custom_id(requests[index]), results.ENGINE_CRASHED, results.ENGINE_CRASHED_MESSAGE)))
                else:
                    run.record = await io(accounting.mark_in_flight, stores, message, attempt, (index, end), run.record)
                    group = requests[index:end]
                    async with gate.exclusive():  # no other chunk's line is in the engine with these
                        async for result in run_ordered(
                            group, lambda raw: run_line(alone, raw, endpoint=message.endpoint, guard=message.guard), window=len(group)
                        ):
                            run.done.append(result)
                await run.flush()  # every group, the last too: a written line is never blamed
                index = end
        else:
            todo = requests[reused:]
            position = 0
            async for result in run_ordered(
                todo, lambda raw: run_line(together, raw, endpoint=message.endpoint, guard=message.guard), window=max(1, len(todo))
            ):
                position += 1
                await run.add(result, remaining=len(todo) - position)
    except asyncio.CancelledError:
        await asyncio.shield(_end_benignly(stores, message, run, io=io, why="cancelled"))
        raise
    except EngineDown:
        if not (alone.died_in_flight or together.died_in_flight):
            await _end_benignly(stores, message, run, io=io, why="engine already down")
        else:
            log.warning("chunk %s/%d: the engine died with its lines in flight (a real failure)", message.batch_id, message.chunk)
        raise
    except Exception:
        await _end_benignly(stores, message, run, io=io, why="store error")
        raise
    outputs = run.done
    usage = accounting.Usage()
    for r in outputs:
        usage.add_response(r.usage)
    # Once the parts are being written the chunk is committed: a SIGTERM (task cancellation) must
    # not interrupt between the parts and the count, or a redelivery would rewrite counted parts.
    on_commit()
    commit = asyncio.ensure_future(_commit(stores, message, [r.line for r in outputs], usage, io=io, now=now,
                                           background=background))
    if commits is not None:
        commits.add(commit)
        commit.add_done_callback(commits.discard)
    try:
        completed, failed, outcome, counted_at = await asyncio.shield(commit)
    except asyncio.CancelledError:
        raise  # the commit goes on (shielded; the worker's drain awaits it)
    except Exception:
        # A store error while committing (a part's PUT, the counting transaction) is benign too:
        # keep what ran as a checkpoint, so the next attempt neither reruns it nor counts a failure.
        try:
            await run.flush()
        except Exception:  # noqa: BLE001 - the store is failing: those lines run again
            log.exception("chunk %s/%d: could not checkpoint before releasing", message.batch_id, message.chunk)
        await _end_benignly(stores, message, run, io=io, why="store error while committing")
        raise
    sent = [t for t in (alone.first_sent_at, together.first_sent_at) if t is not None]
    answered = [t for t in (alone.last_answer_at, together.last_answer_at) if t is not None]
    return ChunkReport(
        False, completed, failed, usage, outcome, now() - started, start.record.careful, reused, crashed,
        first_sent_at=min(sent, default=None), last_answer_at=max(answered, default=None), committed_at=counted_at,
    )


def _group(record: ChunkRunRecord, index: int, count: int, size: int) -> int:
    """The end of the careful group starting at request ``index``: up to ``size`` lines, but a
    blamed or suspect line (one that was in a group that died) always goes by itself."""
    end = index + 1
    if index in record.suspects or index in record.blamed:
        return end
    while end < count and end - index < size and end not in record.suspects and end not in record.blamed:
        end += 1
    return end


async def _end_benignly(stores: Stores, message: WorkMessage, run: _Run, *, io: Io, why: str) -> None:
    try:
        await io(accounting.end_run, stores, message, run.attempt, run.record)
    except Exception:  # noqa: BLE001 - then the next attempt counts this one as failed: a careful run, no line lost
        log.exception("chunk %s/%d: could not record a benign end (%s)", message.batch_id, message.chunk, why)


async def _commit(
    stores: Stores, message: WorkMessage, lines: list[BatchOutputLine], usage: accounting.Usage, *, io: Io,
    now: Callable[[], float], background: Io,
) -> tuple[int, int, ChunkOutcome, float]:
    parts = await io(results.write_parts, stores.objects, message, lines)
    outcome = await io(accounting.record_chunk, stores, message, parts=parts, usage=usage, now=int(now()), receipt=False)
    counted_at = now()
    # The count and the signal are done: the receipt may wait behind other chunks' commits.
    await background(accounting.record_receipt, stores, message, outcome)
    return parts.completed, parts.failed, outcome, counted_at
