"""The queue loop: long-poll the model's work queue, run several chunks at once under one global
cap on engine requests, extend their visibility while they run, drain on SIGTERM.

Concurrency. Every line of every open chunk goes through one ``EngineClient`` whose semaphore
caps requests in flight (default: 2 x the engine's ``max_num_seqs``, so vLLM's waiting queue is
never empty when a sequence finishes). The loop takes another message only while the backlog
(lines not yet handed to the engine: waiting for a slot, or in chunks still being read) is below
that cap, and while fewer than ``max_open_chunks`` are open: the engine stays full across chunk
boundaries without holding more messages than it needs.

Blocking AWS calls run in threads: a pool for the stores (S3/DynamoDB, ``store_pool.StorePool``:
``WorkerConfig.store_threads`` threads when the stores may be called from several at once, else
one; a chunk's start and commit go before checkpoints and receipts), four for SQS (long polls and
visibility extensions must not wait behind a part upload).
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import time
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from typing import Any

from aws_lambda_powertools import Logger
from pydantic import ValidationError

from functions.core import limits
from functions.core.messages import WorkMessage
from functions.core.ports import Received, Stores, WorkQueue
from functions.core.wire import TERMINAL_STATUSES

from .admission import Admission, FairTags
from .attempt import RunPolicy
from .budget import BudgetWatch
from .capacity import SAMPLES, CapacityWatch, headroom
from .chunk import ChunkRunner
from .config import WorkerConfig
from .engine_client import EngineClient, EngineDown
from .engine_gate import EngineGate
from .media import MediaPolicy, Resolver, resolve
from .metrics import WorkerMetrics
from .policy_checks import PolicyChecks
from .shaping import CacheSalts
from .store_pool import BACKGROUND, URGENT, StorePool

#: With short polls (poll_wait_seconds 0), an empty receive waits this long before the next.
IDLE_POLL_SECONDS = 0.2


@dataclass
class _Open:
    received: Received
    lines: int = 0
    dispatched: bool = False
    received_at: float = 0.0
    #: The chunk's batch, once its message parsed (the heartbeat checks it is still open).
    message: WorkMessage | None = None
    #: The task running the chunk, and the terminal status that made the heartbeat abandon it.
    task: asyncio.Task[None] | None = None
    closed: str | None = None
    #: Its parts are being written and counted: never abandoned from then on.
    committing: bool = False


class Worker:
    def __init__(
        self,
        config: WorkerConfig,
        *,
        stores: Stores,
        queue: WorkQueue,
        engine: EngineClient,
        metrics: WorkerMetrics,
        logger: Logger,
        max_line_bytes: int,
        chunk_max_lines: int,
        allowed_media_domains: tuple[str, ...] = (),
        media_resolver: Resolver = resolve,
        clock: Callable[[], float] = time.time,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ):
        self.config, self.stores, self.queue, self._engine = config, stores, queue, engine
        self.metrics, self.log = metrics, logger
        self.max_line_bytes = max_line_bytes
        self.max_open = config.open_chunk_cap(chunk_max_lines)
        self.chunk_max_lines = max(1, chunk_max_lines)
        #: The lines a chunk about to be received is expected to have (``_take_work``): the last one
        #: received, at least chunk_max_lines; before any, a big batch's (ingest's MAX_CHUNK_LINES).
        self._chunk_estimate = max(self.chunk_max_lines, limits.MAX_CHUNK_LINES)
        self.clock = clock
        self._sleep = sleep  # the heartbeat's pause between extensions
        self._stopping = asyncio.Event()
        self._open: dict[str, _Open] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._commits: set[asyncio.Future[Any]] = set()
        self._engine_down = False
        #: Batch statuses the heartbeats read, by (tenant, batch id): (status, read at).
        self._statuses: dict[tuple[str, str], tuple[str, float]] = {}
        #: Careful chunks send each line alone (docs/reliability.md, "Poison isolation").
        self.gate = EngineGate()
        #: The order lines of all open chunks enter the engine in (``config.order``).
        cap = min(engine.max_in_flight, config.admission_cap())
        self.admission = Admission(
            cap,
            config.order,
            reserve=max(0, min(config.admission_reserve(), engine.max_in_flight - cap)),
            tags=FairTags() if config.engine_priority else None,
        )
        #: The admission follows what the engine runs (capacity.py); None: the configured cap.
        read = getattr(engine, "metrics_text", None)
        self.capacity = (
            CapacityWatch(
                functools.partial(read, SAMPLES),
                self.admission.resize,
                headroom=headroom(cap, config.engine_seqs()),
                cap=cap,
                max_num_seqs=config.engine_seqs(),
                every=config.capacity_read_seconds,
                needed=lambda: self.admission.waiting > 0,
            )
            if config.measure_capacity and read is not None
            else None
        )
        #: Audio lines fetch from ``allowed_media_domains`` (a message may narrow it), their hosts
        #: looked up by ``media_resolver`` (tests inject one).
        self.policy = RunPolicy(
            checkpoint_lines=config.checkpoint_lines,
            checkpoint_seconds=config.checkpoint_seconds,
            checkpoint_min_seconds=config.checkpoint_min_seconds,
            careful_group_lines=config.careful_group_lines,
            media=MediaPolicy(allowed_domains=allowed_media_domains, resolver=media_resolver),
        )
        #: Ranks of chunks' urgent store calls, by arrival (0: the worker's own calls, first).
        self._ranks = itertools.count(1)
        self._store_pool = StorePool(threads=config.store_threads if stores.concurrent else 1, on_start=stores.prepare)
        #: Tenants' ``stop`` budgets, read at most every few seconds for the whole worker.
        self.budget = BudgetWatch(stores, self._stores, now=clock)
        self._queue_pool = ThreadPoolExecutor(4, thread_name_prefix="worker-sqs")
        #: Tenants' prompt and output policy checks, in processes of their own (policy_checks.py).
        self.checks = PolicyChecks(config.policy_check_processes, seconds=config.policy_check_seconds)
        #: What every chunk runs with (each chunk's urgent store calls get their own rank, ``_handle``).
        self.chunks = ChunkRunner(
            stores,
            engine,
            io=self._stores,
            background=self._stores_later,
            max_line_bytes=max_line_bytes,
            now=clock,
            gate=self.gate,
            admission=self.admission,
            budget=self.budget,
            policy=self.policy,
            commits=self._commits,
            salts=CacheSalts(config.cache_salt_secret.get_secret_value() if config.cache_salt_secret else None),
            checks=self.checks,
        )

    @property
    def engine(self) -> EngineClient:
        """The engine client: the loop's health checks and counts, and every chunk's lines (set
        once for both)."""
        return self._engine

    @engine.setter
    def engine(self, engine: EngineClient) -> None:
        self._engine = engine
        self.chunks = replace(self.chunks, engine=engine)

    # --- control -----------------------------------------------------------------------------
    def stop(self) -> None:
        """Stop taking work, drain (SIGTERM / SIGINT handler; call from the loop's thread)."""
        if not self._stopping.is_set():
            self.log.info("stop requested: draining", extra={"open_chunks": len(self._open)})
        self._stopping.set()

    @property
    def stopping(self) -> bool:
        return self._stopping.is_set()

    @property
    def open_chunks(self) -> int:
        return len(self._open)

    def backlog(self) -> int:
        """Lines not yet sent to the engine: waiting for a slot, or in chunks not yet dispatched."""
        return (
            self.admission.waiting + self.engine.waiting + sum(o.lines for o in self._open.values() if not o.dispatched)
        )

    def filling(self) -> int:
        """Open chunks with lines not yet in the engine. A chunk's tail (its last lines running,
        or its commit) does not count: slow last lines never keep new lines out."""
        return sum(
            1 for o in self._open.values() if not o.dispatched or self.admission.waiting_for(o.received.message_id)
        )

    async def _stores(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        return await self._store_pool.call(URGENT, fn, *args, **kwargs)

    async def _stores_later(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """A store call that may wait behind every urgent one (checkpoints, receipts)."""
        return await self._store_pool.call(BACKGROUND, fn, *args, **kwargs)

    async def _sqs(self, fn: Callable[..., Any], *args: Any) -> Any:
        return await asyncio.get_running_loop().run_in_executor(self._queue_pool, functools.partial(fn, *args))

    # --- main --------------------------------------------------------------------------------
    async def run(self) -> None:
        """Wait for the engine, take work until stopped, drain. EngineDown if the engine never
        becomes (or stays) healthy."""
        reporter = asyncio.create_task(self._report_periodically())
        watch: asyncio.Task[None] | None = None
        try:
            if not await self._until_healthy():
                return
            if self.capacity is not None:
                watch = asyncio.create_task(self.capacity.run())
            self.log.info(
                "taking work",
                extra={
                    "queue_url": self.queue.url,
                    "in_flight_cap": self.engine.max_in_flight,
                    "max_open_chunks": self.max_open,
                },
            )
            await self._take_work()
        finally:
            await self._drain()
            reporter.cancel()
            if watch is not None:
                watch.cancel()
            self.report()
            await self.checks.close()
            self._store_pool.shutdown(wait=True)
            self._queue_pool.shutdown(wait=False, cancel_futures=True)

    async def _until_healthy(self) -> bool:
        """True once the engine is healthy; False if stopped first; EngineDown on timeout."""
        health = asyncio.create_task(self.engine.wait_healthy(self.config.health_timeout_seconds))
        stop = asyncio.create_task(self._stopping.wait())
        await asyncio.wait({health, stop}, return_when=asyncio.FIRST_COMPLETED)
        stop.cancel()
        if not health.done():
            health.cancel()
            return False
        self.log.info(
            "engine healthy", extra={"engine_url": self.engine.base_url, "waited_seconds": round(health.result(), 1)}
        )
        return True

    async def _take_work(self) -> None:
        stop = asyncio.create_task(self._stopping.wait())
        try:
            while not self.stopping:
                if self._engine_down:
                    self.log.warning("engine unhealthy: not taking work until /health answers")
                    if not await self._until_healthy():
                        return
                    self._engine_down = self.gate.down = False
                    continue
                if self.filling() >= self.max_open or self.backlog() >= self.engine.max_in_flight:
                    await asyncio.wait({stop}, timeout=0.05)
                    continue
                # Enough chunks to fill the cap (estimated at the size of the last one received, at
                # least chunk_max_lines: a big batch's chunks are bigger), at most 10.
                room = -(-(self.engine.max_in_flight - self.backlog()) // self._chunk_estimate)
                want = max(1, min(10, self.max_open - self.filling(), room))
                receive = asyncio.ensure_future(
                    self._sqs(self.queue.receive, want, self.config.poll_wait_seconds, self.config.visibility_seconds)
                )
                await asyncio.wait({receive, stop}, return_when=asyncio.FIRST_COMPLETED)
                received = await receive  # a long poll in progress returns within poll_wait_seconds
                if not received and self.config.poll_wait_seconds == 0:
                    await asyncio.wait({stop}, timeout=IDLE_POLL_SECONDS)  # short polls: do not spin
                for r in received:
                    if self.stopping:
                        await self._sqs(self.queue.release, r.receipt, 0)
                        self.log.info("released a message received while stopping", extra={"message_id": r.message_id})
                        continue
                    self._open[r.message_id] = state = _Open(r, lines=self._lines_of(r), received_at=self.clock())
                    self._chunk_estimate = max(self.chunk_max_lines, state.lines)
                    task = asyncio.create_task(self._handle(state))
                    self._tasks.add(task)
                    task.add_done_callback(self._tasks.discard)
        finally:
            stop.cancel()

    def _lines_of(self, r: Received) -> int:
        """A received chunk's lines, counted in the backlog from the moment it is received."""
        try:
            return WorkMessage.model_validate_json(r.body).line_count
        except ValidationError:
            return 0  # never run: released by _handle

    async def _drain(self) -> None:
        """Let in-flight chunks finish for up to drain_seconds, then release the rest."""
        if self._tasks:
            self.log.info(
                "draining", extra={"open_chunks": len(self._tasks), "drain_seconds": self.config.drain_seconds}
            )
            _, pending = await asyncio.wait(set(self._tasks), timeout=self.config.drain_seconds)
            for task in pending:
                task.cancel()
            if pending:
                await asyncio.gather(*pending, return_exceptions=True)
        if self._commits:
            await asyncio.gather(*set(self._commits), return_exceptions=True)

    # --- one message -------------------------------------------------------------------------
    async def _handle(self, state: _Open) -> None:
        r = state.received
        state.task = asyncio.current_task()
        heartbeat = asyncio.create_task(self._heartbeat(state))
        try:
            try:
                message = WorkMessage.model_validate_json(r.body)
            except ValidationError as exc:
                # Never succeeds: let it reach the DLQ after its receives, quickly.
                self.log.error("malformed work message", extra={"message_id": r.message_id, "error": str(exc)[:500]})
                self.metrics.chunk_failed()
                await self._sqs(self.queue.release, r.receipt, self.config.failure_retry_seconds)
                return
            if not message.bound():
                # Another tenant's input (forged or misrouted): read nothing; like a malformed message.
                self.log.error(
                    "work message not bound to its tenant",
                    extra={"message_id": r.message_id, "tenant": message.tenant, "batch_id": message.batch_id},
                )
                self.metrics.chunk_failed()
                await self._sqs(self.queue.release, r.receipt, self.config.failure_retry_seconds)
                return
            state.lines, state.message = message.line_count, message
            keys = {
                "batch_id": message.batch_id,
                "chunk": message.chunk,
                "message_id": r.message_id,
                "receive_count": r.receive_count,
            }
            if r.receive_count > 1:
                self.metrics.chunk_redelivered()
            # This chunk's urgent store calls rank by its arrival: an earlier chunk's go first.
            io = functools.partial(self._store_pool.call_ranked, URGENT, next(self._ranks))
            report = await self.chunks.process(
                message,
                io=io,
                owner=r.message_id,
                on_dispatch=lambda: setattr(state, "dispatched", True),
                on_commit=lambda: setattr(state, "committing", True),
            )
            await self._sqs(self.queue.delete, r.receipt)
            if report.skipped:
                self.metrics.chunk_skipped()
                self.log.info("chunk skipped", extra=keys)
                return
            usage = report.usage
            self.metrics.chunk_done(
                completed=report.completed,
                failed=report.failed,
                input_tokens=usage.input_tokens if usage else 0,
                output_tokens=usage.output_tokens if usage else 0,
                careful=report.careful,
                reused=report.reused,
                crashed=report.crashed,
            )
            outcome = report.outcome
            self.log.info(
                "chunk done",
                extra={
                    **keys,
                    "completed": report.completed,
                    "failed": report.failed,
                    "seconds": round(report.seconds, 3),
                    "output_tokens": usage.output_tokens if usage else 0,
                    "counted": bool(outcome and outcome.counted),
                    "last": bool(outcome and outcome.last),
                    "careful": report.careful,
                    "reused": report.reused,
                    "crashed": report.crashed,
                    # The fixed overhead around the engine (docs/benchmarks.md, "Fixed overhead").
                    "received_at": state.received_at,
                    "first_sent_at": report.first_sent_at,
                    "last_answer_at": report.last_answer_at,
                    "committed_at": report.committed_at,
                },
            )
        except asyncio.CancelledError:
            if state.closed is not None and not self.stopping:
                # Its batch ended (cancelled or expired past the drain, finalized): nothing of this
                # chunk can count any more. Its lines left the engine (the requests were cancelled:
                # vLLM aborts a request whose client goes away); the message goes.
                await asyncio.shield(self._sqs(self.queue.delete, r.receipt))
                self.metrics.chunk_skipped()
                self.log.info(
                    "chunk abandoned: its batch ended",
                    extra={
                        "batch_id": state.message.batch_id if state.message else None,
                        "status": state.closed,
                        "message_id": r.message_id,
                    },
                )
                return
            # Drain deadline passed (SIGTERM): hand the chunk to another worker at once.
            await asyncio.shield(self._release(r, 0, "released on shutdown"))
            raise
        except EngineDown as exc:
            self._engine_down = True
            await self._release(r, 0, f"released: {exc}")
        except Exception:
            self.log.exception("chunk failed; it will be retried", extra={"message_id": r.message_id})
            self.metrics.chunk_failed()
            await self._release(r, self.config.failure_retry_seconds, "released after a failure")
        finally:
            heartbeat.cancel()
            self._open.pop(r.message_id, None)

    async def _release(self, r: Received, after: int, why: str) -> None:
        try:
            await self._sqs(self.queue.release, r.receipt, after)
        except Exception:
            self.log.exception("could not release a message", extra={"message_id": r.message_id})
        self.metrics.chunk_released()
        self.log.info(why, extra={"message_id": r.message_id, "visible_after_seconds": after})

    async def _heartbeat(self, state: _Open) -> None:
        """Every beat: extend the message's visibility, and check that the chunk's batch is still
        open; once it is terminal (a cancel or an expiry finalized it) the chunk is abandoned at
        once instead of running its lines to their end for nothing (one GetItem a beat)."""
        r = state.received
        interval = self.config.heartbeat_interval()
        while True:
            await self._sleep(interval)
            try:
                ok = await self._sqs(self.queue.extend, r.receipt, self.config.visibility_seconds)
            except Exception:
                self.log.exception("visibility extension failed", extra={"message_id": r.message_id})
                continue
            if not ok:
                self.log.warning("lost the message (receipt no longer valid)", extra={"message_id": r.message_id})
                return
            message = state.message
            if message is None or state.task is None or state.committing:
                continue
            try:
                status = await self._batch_status(message, fresh_for=interval / 2)
            except Exception:
                self.log.exception("batch check failed", extra={"message_id": r.message_id})
                continue
            if (status == "gone" or status in TERMINAL_STATUSES) and not state.committing:
                state.closed = status
                state.task.cancel()
                return

    async def _batch_status(self, message: WorkMessage, *, fresh_for: float) -> str:
        """The chunk's batch status ("gone" without a record), read at most once per ``fresh_for``
        seconds per batch however many of its chunks beat (one GetItem for all of them)."""
        key = (message.tenant, message.batch_id)
        known = self._statuses.get(key)
        if known is not None and self.clock() - known[1] < fresh_for:
            return known[0]
        batch = await self._stores(self.stores.batches.get, message.tenant, message.batch_id)
        status = "gone" if batch is None else batch.status
        if len(self._statuses) > 1024:
            self._statuses.clear()
        self._statuses[key] = (status, self.clock())
        return status

    # --- metrics -----------------------------------------------------------------------------
    async def _report_periodically(self) -> None:
        while True:
            await asyncio.sleep(self.config.metrics_interval_seconds)
            self.report()

    def report(self) -> dict[str, Any]:
        return self.metrics.flush(
            self.engine.stats,
            in_flight=self.engine.in_flight,
            waiting=self.admission.waiting + self.engine.waiting,
            open_chunks=len(self._open),
            cap=self.admission.capacity,  # what the engine may hold now (capacity.py)
        )
