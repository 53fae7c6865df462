"""One line, and one chunk, through the engine: the code path shared by the SQS worker and the
offline ``batchctl run-batch``.

A line becomes exactly one result line: the engine's answer (2xx to the output part, any other
status to the error part, with the engine's status code and body), or an error when the engine
never answered or the line is not a valid request. Results keep input order.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import heapq
import itertools
import json
import logging
import math
import secrets
import time
from collections import Counter, deque
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any, TypeVar

from functions.core import accounting, limits, results, tenants
from functions.core.accounting import ChunkOutcome
from functions.core.lines import LineError, RawLine, check_request, iter_lines, parse_request
from functions.core.messages import WorkMessage
from functions.core.models import BatchOutputLine
from functions.core.ports import Engine, Stores
from functions.core.records import ChunkRunRecord

from .budget import BudgetWatch
from .engine import EngineDown, Reply
from .policy_checks import IN_PROCESS, Checks, LineChecks

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

    @classmethod
    def written(cls, line: BatchOutputLine) -> LineResult:
        """A result read back from a checkpoint (its usage is in its body, as when it ran)."""
        return cls(line, results.usage_of(line))


async def run_line(engine: Engine, raw: RawLine, *, endpoint: str | None, endpoints: Iterable[str] = (),
                   guard: LineChecks | None = None) -> LineResult:
    """One input line -> one result line. ``endpoint`` is the batch's (every line must use it);
    None (offline mode) accepts a line's own ``url`` if it is one of ``endpoints``. ``guard``: the
    checks of the tenant's prompt and output policy (the work message's snapshot, bound to the
    worker's check processes; None: none): a refused prompt never reaches the engine, a redacted
    one is what is sent, a blocked result is not written."""
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
    body, violation = await guard.check_prompt(obj["body"]) if guard is not None else (obj["body"], None)
    if violation is not None:
        return LineResult(results.error_line(custom_id, violation.code, violation.message))
    reply = await engine.post(endpoint, body)
    if reply.status is None:
        return LineResult(results.error_line(custom_id, reply.error_code, reply.error_message))
    line = results.response_line(custom_id, reply.status, reply.body, reply.request_id)
    usage = reply.body.get("usage") if results.succeeded(line) and isinstance(reply.body, dict) else None
    if guard is not None and results.succeeded(line) and (violation := await guard.check_output(reply.body)) is not None:
        return LineResult(results.error_line(custom_id, violation.code, violation.message))  # no usage: an error line
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


class EngineGate:
    """Shared by the chunks of one worker: normal lines go to the engine together (``shared``);
    a careful chunk's line goes alone (``exclusive``: it waits until no other line is in the
    engine and holds new ones back), so when it crashes the engine no innocent line is in flight
    with it. Waiting exclusive holders go first (no starvation).

    ``down``: a line met ``EngineDown`` since the engine was last healthy (the loop clears it). A
    line that enters the engine while it is down and meets ``EngineDown`` never ran on a live
    engine: that is a benign end of its chunk's attempt, not a real failure."""

    def __init__(self) -> None:
        self.down = False
        self._cond = asyncio.Condition()
        self._shared = 0
        self._exclusive = False
        self._waiting = 0

    @asynccontextmanager
    async def shared(self) -> AsyncIterator[None]:
        async with self._cond:
            await self._cond.wait_for(lambda: not self._exclusive and not self._waiting)
            self._shared += 1
        try:
            yield
        finally:
            async with self._cond:
                self._shared -= 1
                self._cond.notify_all()

    @asynccontextmanager
    async def exclusive(self) -> AsyncIterator[None]:
        async with self._cond:
            self._waiting += 1
            try:
                await self._cond.wait_for(lambda: not self._exclusive and not self._shared)
            finally:
                self._waiting -= 1
            self._exclusive = True
        try:
            yield
        finally:
            async with self._cond:
                self._exclusive = False
                self._cond.notify_all()


#: The worker's orders of admission into the engine (``WorkerConfig.order``).
ORDER_FILE, ORDER_SMART = "file", "smart"
#: How much of a prompt's text names its prefix group when it is one string (completions,
#: responses, embeddings); chat uses its whole first message.
PREFIX_CHARS = 512
#: Expected output of a line that sets no output limit: it runs until the context ends.
UNBOUNDED_OUTPUT = math.inf
#: The body fields that cap a line's output tokens, by endpoint (the first present wins).
OUTPUT_LIMIT_FIELDS = ("max_completion_tokens", "max_tokens", "max_output_tokens")


def expected_output(body: dict[str, Any]) -> float:
    """The most output tokens a line may produce (its own limit; unbounded without one)."""
    for name in OUTPUT_LIMIT_FIELDS:
        value = body.get(name)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return float(value)
    return UNBOUNDED_OUTPUT


def length_class(tokens: float) -> float:
    """Output limits within a factor of two are one class (so prefix groups are not split by
    small differences); larger classes go first."""
    return tokens if tokens == UNBOUNDED_OUTPUT else float(int(math.log2(max(1.0, tokens))))


def prefix_of(body: dict[str, Any]) -> str | None:
    """The text a line's prompt starts with, as far as lines sharing it share the engine's
    prefix cache: chat's first message, else the first ``PREFIX_CHARS`` of the prompt/input."""
    messages = body.get("messages")
    if isinstance(messages, list) and messages:
        return json.dumps(messages[0], sort_keys=True, separators=(",", ":"))
    for name in ("prompt", "input"):
        value = body.get(name)
        if isinstance(value, list) and value:
            value = value[0]
        if isinstance(value, str):
            return value[:PREFIX_CHARS]
        if value is not None:
            return json.dumps(value, sort_keys=True, separators=(",", ":"))[:PREFIX_CHARS]
    return None


class Admission:
    """Which waiting line enters the engine next, across every chunk the worker has open: at
    most ``capacity`` lines in flight (the engine client's cap, so its own semaphore never
    queues), the rest wait here.

    ``file`` order: first come, first in (the chunks' input order, as they arrived).
    ``smart`` order (docs/reliability.md, "Order of lines in the engine"): the longest expected
    output first (``expected_output``, by ``length_class``), so the batch's tail is short; within
    a class, a line whose prefix (``prefix_of``) an earlier line had enters right behind that
    line's group, so lines sharing a system prompt are in the engine together and hit vLLM's
    prefix cache; otherwise arrival order. Results are unaffected: each chunk still writes its
    lines in input order (``run_ordered``). ``waiting_for(owner)``: lines of one chunk waiting."""

    #: Prefix groups remembered (their first line's arrival number); forgotten all at once beyond.
    MAX_GROUPS = 65_536

    def __init__(self, capacity: int, order: str = ORDER_FILE):
        if order not in (ORDER_FILE, ORDER_SMART):
            raise ValueError(f"order must be {ORDER_FILE!r} or {ORDER_SMART!r}, not {order!r}")
        self.capacity, self.order = max(1, capacity), order
        self.in_flight = 0
        self._heap: list[tuple[tuple[float, ...], asyncio.Future[None]]] = []
        self._arrivals = itertools.count()
        self._groups: dict[bytes, int] = {}
        self._waiting: Counter[object] = Counter()
        #: Lines each group (tenant) holds here, waiting or in the engine (``fair_slot``).
        self._held: dict[object, int] = {}

    @property
    def waiting(self) -> int:
        return sum(self._waiting.values())

    def waiting_for(self, owner: object) -> int:
        return self._waiting.get(owner, 0)

    def key(self, body: dict[str, Any]) -> tuple[float, ...]:
        """The line's place in the order (smaller enters first); unique (its arrival last)."""
        arrival = next(self._arrivals)
        if self.order == ORDER_FILE:
            return (arrival,)
        group = arrival
        prefix = prefix_of(body)
        if prefix is not None:
            digest = hashlib.blake2b(prefix.encode(), digest_size=8).digest()
            if len(self._groups) >= self.MAX_GROUPS:
                self._groups.clear()
            group = self._groups.setdefault(digest, arrival)
        return (-length_class(expected_output(body)), group, arrival)

    @asynccontextmanager
    async def slot(self, body: dict[str, Any], owner: object = None, rank: int = 0) -> AsyncIterator[None]:
        key = (rank, *self.key(body))
        if self.in_flight < self.capacity and not self._heap:
            self.in_flight += 1
        else:
            ticket: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            heapq.heappush(self._heap, (key, ticket))
            self._waiting[owner] += 1
            try:
                await ticket  # set by _release: the slot it freed is ours
            except asyncio.CancelledError:
                if ticket.done() and not ticket.cancelled():
                    self._release()  # handed a slot we will not use: hand it on
                raise
            finally:
                self._waiting[owner] -= 1
                if not self._waiting[owner]:
                    del self._waiting[owner]
        try:
            yield
        finally:
            self._release()

    @asynccontextmanager
    async def fair_slot(self, body: dict[str, Any], owner: object = None, group: object = None) -> AsyncIterator[None]:
        """``slot`` with fair share across groups (tenants; docs/governance.md "Fair share"): a
        line of a group that holds (waiting or in the engine) fewer lines than another group
        enters before the waiting lines of groups that held the most when they came; within each
        of the two ranks the order is ``slot``'s. So a small tenant's lines never wait behind the
        lines a giant batch already has waiting in this worker; one tenant alone keeps its order."""
        held = self._held.setdefault(group, 0)
        others = max((n for g, n in self._held.items() if g != group), default=0)
        rank = 0 if held < others else 1
        self._held[group] = held + 1
        try:
            async with self.slot(body, owner, rank=rank):
                yield
        finally:
            self._held[group] -= 1
            if not self._held[group]:
                del self._held[group]

    def resize(self, capacity: int) -> None:
        """A new capacity (``capacity.CapacityWatch``: what the engine runs, plus a headroom). Raised:
        waiting lines enter at once; lowered: lines in flight finish, and their slots are handed on
        only once in flight is under the new capacity."""
        self.capacity = max(1, capacity)
        while self.in_flight < self.capacity and self._hand_on():
            self.in_flight += 1

    def _hand_on(self) -> bool:
        """Give a slot to the first waiting line; False if none waits."""
        while self._heap:
            _, ticket = heapq.heappop(self._heap)
            if not ticket.done():  # a cancelled waiter's ticket is done
                ticket.set_result(None)
                return True
        return False

    def _release(self) -> None:
        if self.in_flight > self.capacity or not self._hand_on():
            self.in_flight -= 1


class _Gated:
    """An ``Engine`` whose posts pass the gate: shared, or (``held``) under the exclusive hold
    its caller took for a careful group. ``died_in_flight``: a line of this chunk was in the
    engine, while it was up, when it died. Shared posts enter the engine through ``admission``
    (the worker's order); a careful group's lines are alone in the engine and go straight in.
    ``first_sent_at``/``last_answer_at``: when this chunk's first line entered the engine and
    its last answer came (clock seconds; None before). ``stop``: why a line must not enter the
    engine now (None: it may), asked once the line has its slot (``BudgetWatch``); such a line is
    answered with that reason as a ``budget_exceeded`` error, never sent."""

    def __init__(self, engine: Engine, gate: EngineGate, *, held: bool, admission: Admission | None = None,
                 owner: object = None, now: Callable[[], float] = time.time, group: object = None,
                 stop: Callable[[], Awaitable[str | None]] | None = None):
        self._engine, self._gate, self._held = engine, gate, held
        self._admission, self._owner, self._now = admission, owner, now
        self._group = group  # the tenant (Admission's fair share)
        self._stop = stop
        self.died_in_flight = False
        self.first_sent_at: float | None = None
        self.last_answer_at: float | None = None

    @asynccontextmanager
    async def _admitted(self, body: dict[str, Any]) -> AsyncIterator[None]:
        if self._held or self._admission is None:
            yield
        else:
            async with self._admission.fair_slot(body, self._owner, self._group):
                yield

    async def healthy(self) -> bool:
        return await self._engine.healthy()

    async def wait_healthy(self, timeout: float, interval: float = 1.0) -> float:
        return await self._engine.wait_healthy(timeout, interval)

    async def post(self, path: str, body: dict[str, Any]) -> Any:
        async with contextlib.nullcontext() if self._held else self._gate.shared(), self._admitted(body):
            if self._stop is not None and (why := await self._stop()) is not None:
                return Reply(None, None, "", 0, tenants.BUDGET_EXCEEDED, why)
            entered_down = self._gate.down
            if self.first_sent_at is None:
                self.first_sent_at = self._now()
            try:
                reply = await self._engine.post(path, body)
            except EngineDown:
                self._gate.down = True  # before the gate lets the next line in
                self.died_in_flight |= not entered_down
                raise
            self.last_answer_at = self._now()
            return reply


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
    checks: Checks = IN_PROCESS,
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
    may wait behind other chunks' urgent ones (checkpoints, the audit receipt; default: ``io``).
    ``checks`` runs the message's policy checks (the worker's ``PolicyChecks``; default: in this
    thread)."""
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
    alone = _Gated(engine, gate, held=True, now=now, stop=stop)
    together = _Gated(engine, gate, held=False, admission=admission, owner=owner, now=now, group=message.tenant, stop=stop)
    guard = checks.bind(message.tenant, message.guard)
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
                            group, lambda raw: run_line(alone, raw, endpoint=message.endpoint, guard=guard), window=len(group)
                        ):
                            run.done.append(result)
                await run.flush()  # every group, the last too: a written line is never blamed
                index = end
        else:
            todo = requests[reused:]
            position = 0
            async for result in run_ordered(
                todo, lambda raw: run_line(together, raw, endpoint=message.endpoint, guard=guard), window=max(1, len(todo))
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
