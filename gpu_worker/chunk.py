"""One chunk of a batch through the engine, for the SQS worker: open an attempt at it (skipped if
its batch takes no more work or it is already counted), run the attempt's lines (``attempt``: its
run record, checkpoints, careful mode), commit it (``commit``: parts, count, receipt). What every chunk
of one worker runs with is one ``ChunkRunner``, built once (``loop.Worker``). One line's path,
shared with the offline ``batchctl run-batch``, is ``line_runner``'s.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from functions.core import chunk_lifecycle
from functions.core.chunk_lifecycle import ChunkOutcome
from functions.core.lines import RawLine, iter_lines
from functions.core.messages import WorkMessage
from functions.core.ports import Engine, Stores
from functions.core.records import ChunkRecord, ChunkRunRecord

from .admission import Admission
from .attempt import Attempt, RunPolicy
from .budget import BudgetWatch
from .commit import commit
from .engine_gate import EngineGate
from .gated_engine import ChunkEngines
from .policy_checks import IN_PROCESS, Checks
from .shaping import CacheSalts, preparer
from .store_pool import Io

log = logging.getLogger("gpu_worker.chunk")


@dataclass(frozen=True)
class ChunkReport:
    """What processing a chunk did. ``skipped``: the batch no longer takes work (or the chunk
    was already counted); nothing was run. ``reused``: lines whose checkpointed results an
    earlier attempt wrote (not sent again); ``crashed``: lines failed as ``engine_crashed``."""

    skipped: bool = False
    completed: int = 0
    failed: int = 0
    usage: chunk_lifecycle.Usage | None = None
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


def read_chunk(stores: Stores, message: WorkMessage, *, max_line_bytes: int) -> list[RawLine]:
    """The chunk's lines (blank ones included: they keep line numbers), one ranged GET."""
    data = stores.objects.iter_range(message.input_key, message.byte_start, message.byte_end)
    return list(
        iter_lines(data, max_line_bytes=max_line_bytes, start=message.byte_start, first_number=message.first_line)
    )


def chunk_state(stores: Stores, message: WorkMessage) -> tuple[ChunkRecord | None, ChunkRunRecord | None]:
    """The chunk's count marker (present for a redelivery after a worker counted it but died
    before deleting the message: running it again would only waste the engine's time) and its run
    record (what earlier attempts left, opened again by this one), in one read."""
    return stores.batches.chunk_state(message.tenant, message.batch_id, message.chunk, message.shards)


def _nothing() -> None:
    pass


@dataclass(frozen=True)
class ChunkRunner:
    """What every chunk of one worker runs with.

    ``io`` runs blocking store calls off the event loop (a chunk's start, its run record, its
    parts and count); ``background`` the ones that may wait behind other chunks' urgent calls
    (checkpoints, the audit receipt; None: ``io``). ``gate`` is shared by the worker's chunks (a
    careful chunk's lines go alone on the engine), as are ``admission`` (the order lines enter the
    engine in; None: as they come) and ``budget`` (the worker's ``BudgetWatch``: under a tenant's
    ``stop`` budget, a line that would enter the engine once the budget is used up is written as
    ``budget_exceeded`` instead; gpu_worker/budget.py). ``policy``: checkpoints and the poison
    budget. A commit that outlives its cancelled caller stays in ``commits`` until it is done (the
    loop's drain awaits them). Every line sent is ``shaping.preparer``'s: its tenant's cache salt
    and the batch's output bound."""

    stores: Stores
    engine: Engine
    io: Io
    max_line_bytes: int
    background: Io | None = None
    now: Callable[[], float] = time.time
    gate: EngineGate = field(default_factory=EngineGate)
    admission: Admission | None = None
    budget: BudgetWatch | None = None
    policy: RunPolicy = RunPolicy()
    commits: set[asyncio.Future[Any]] | None = None
    #: Each tenant's prefix-cache salt (``shaping.CacheSalts``): every line sent carries its own.
    salts: CacheSalts | None = None
    #: Runs the messages' policy checks (the worker's ``PolicyChecks``; default: in this thread).
    checks: Checks = IN_PROCESS

    async def process(
        self,
        message: WorkMessage,
        *,
        io: Io | None = None,
        owner: object = None,
        attempt: str | None = None,
        on_dispatch: Callable[[], None] = _nothing,
        on_commit: Callable[[], None] = _nothing,
    ) -> ChunkReport:
        """Start the chunk, run an attempt at the lines no earlier attempt checkpointed, commit it.
        ``io``: this chunk's urgent store calls (None: the runner's); ``owner`` names its lines
        waiting in the admission; ``attempt``: the attempt's id (None: a new one).
        ``on_dispatch`` is called once its lines are handed to the engine client, ``on_commit``
        as its parts start being written (from then on the chunk is never abandoned)."""
        io = io or self.io
        started = self.now()
        attempt = attempt or secrets.token_hex(6)
        begun = await self._start(message, attempt, io)
        if begun is None:
            return ChunkReport(skipped=True)
        requests, start = begun
        run = Attempt(
            self.stores,
            message,
            attempt,
            self._engines(message, owner),
            io=io,
            background=self.background or io,
            now=self.now,
            policy=self.policy,
            prepare=preparer(message, self.salts),
            guard=self.checks.bind(message.tenant, message.guard),
        )
        await run.run(requests, start, on_dispatch=on_dispatch)
        done = await commit(run, on_commit=on_commit, commits=self.commits)
        return ChunkReport(
            False,
            done.completed,
            done.failed,
            done.usage,
            done.outcome,
            self.now() - started,
            run.careful,
            run.reused,
            run.crashed,
            first_sent_at=run.engines.first_sent_at,
            last_answer_at=run.engines.last_answer_at,
            committed_at=done.counted_at,
        )

    async def _start(
        self, message: WorkMessage, attempt: str, io: Io
    ) -> tuple[list[RawLine], chunk_lifecycle.RunStart] | None:
        """The chunk's request lines and its attempt, opened on its run record; None if it is
        skipped: the chunk is already counted (then the workflow is signalled again if every
        chunk is), or its batch takes no more work.

        The marker and run record read and the input read go side by side (each on a store
        thread): neither depends on the other's answer, and the input read is wasted only for a
        chunk that is skipped. The attempt is opened from the record read here, only while the
        batch takes new chunks (one transaction: ``begin_run``)."""
        state, raws = await asyncio.gather(
            io(chunk_state, self.stores, message),
            io(read_chunk, self.stores, message, max_line_bytes=self.max_line_bytes),
            return_exceptions=True,
        )
        if isinstance(state, BaseException):  # first: it decides whether the read matters
            raise state
        marker, record = state
        if marker is not None:
            await io(chunk_lifecycle.signal_if_all_counted, self.stores, message)
            return None
        policy = self.policy
        start = await io(
            chunk_lifecycle.begin_run,
            self.stores,
            message,
            attempt,
            max_strikes=policy.max_strikes,
            max_failures=policy.max_failures,
            stored=record,
            read=True,
        )
        if start is None:
            return None  # a read error of a skipped chunk does not matter
        if isinstance(raws, BaseException):
            await io(chunk_lifecycle.end_run, self.stores, message, attempt, start.record)
            raise raws
        requests = [r for r in raws if not r.blank]
        if len(requests) != message.line_count:
            log.warning(
                "chunk %s/%d has %d lines, the message says %d",
                message.batch_id,
                message.chunk,
                len(requests),
                message.line_count,
            )
        return requests, start

    def _engines(self, message: WorkMessage, owner: object) -> ChunkEngines:
        budget = self.budget
        stop = (lambda: budget.stop_reason(message)) if budget is not None and message.budget_stop is not None else None
        return ChunkEngines(
            self.engine,
            self.gate,
            admission=self.admission,
            owner=owner,
            tenant=message.tenant,
            now=self.now,
            stop=stop,
        )
