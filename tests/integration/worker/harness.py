"""Running the real worker (``gpu_worker.loop.Worker``) in a background thread of the test process,
against moto (decorator mode works across threads) and an engine (fake or real); and one chunk
through the worker's real chunk path, synchronously (``run_one_chunk``)."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from typing import Any

from aws_lambda_powertools import Logger

from functions.core import chunk_lifecycle, clients, limits
from functions.core.aws.sqs import SqsQueue
from functions.core.messages import WorkMessage
from functions.core.ports import Stores
from functions.core.records import ChunkRunRecord
from functions.core.settings import Settings
from gpu_worker.attempt import RunPolicy
from gpu_worker.chunk import ChunkReport
from gpu_worker.config import WorkerConfig
from gpu_worker.engine_client import EngineClient
from gpu_worker.loop import Worker
from gpu_worker.metrics import WorkerMetrics
from tests.chunks import process_chunk
from tests.fakes.engine import InProcessEngine


def worker_config(settings: Settings, engine_url: str, model: str = "test-chat", **overrides: Any) -> WorkerConfig:
    """Test defaults: short polls, fast backoff, metrics flushed only at the end."""
    values: dict[str, Any] = {
        "model": model,
        "queue_url": settings.models[model].queue_url,
        "engine_url": engine_url,
        "max_in_flight": 8,
        "poll_wait_seconds": 0,
        "backoff_base_seconds": 0.01,
        "backoff_max_seconds": 0.2,
        "request_timeout_seconds": 30,
        "health_timeout_seconds": 30,
        "metrics_interval_seconds": 3600,
        "drain_seconds": 30,
        **overrides,
    }
    return WorkerConfig(**values)


#: Killed workers' loops, kept alive: a killed process runs no cleanup, and garbage-collecting
#: their abandoned coroutines would run it (and warn) later in the session.
_KILLED: list[asyncio.AbstractEventLoop] = []


class WorkerThread:
    """``start()`` runs the worker; ``stop()`` is SIGTERM (drain, clean exit); ``kill()`` is
    SIGKILL as far as AWS can tell: the loop just stops, nothing is released or deleted."""

    def __init__(self, config: WorkerConfig, settings: Settings, stores: Stores):
        self.config, self.settings, self.stores = config, settings, stores
        self.worker: Worker | None = None
        self.error: BaseException | None = None
        self.killed = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._ready = threading.Event()

    async def _main(self) -> None:
        logger = Logger(service="gpu-worker-test", level="WARNING")
        metrics = WorkerMetrics(namespace="Test", service="gpu-worker-test", logger=logger, model=self.config.model)
        async with EngineClient.from_config(self.config) as engine:
            self.worker = Worker(
                self.config,
                stores=self.stores,
                queue=SqsQueue(clients.client("sqs"), self.config.queue_url),
                engine=engine,
                metrics=metrics,
                logger=logger,
                max_line_bytes=self.settings.max_line_bytes,
                chunk_max_lines=self.settings.chunk_max_lines,
            )
            self._ready.set()
            await self.worker.run()

    def start(self) -> WorkerThread:
        def run() -> None:
            loop = asyncio.new_event_loop()
            self._loop = loop
            try:
                loop.run_until_complete(self._main())
            except RuntimeError as exc:
                if not self.killed:
                    self.error = exc
            except BaseException as exc:
                self.error = exc
            finally:
                self._ready.set()
                if not self.killed:
                    loop.close()

        self._thread = threading.Thread(target=run, name="worker", daemon=True)
        self._thread.start()
        assert self._ready.wait(10), "worker did not start"
        return self

    def stop(self, timeout: float = 60) -> None:
        """SIGTERM: stop taking work, drain, exit."""
        self.request_stop()
        self.join(timeout)

    def request_stop(self) -> None:
        """SIGTERM without waiting: the worker drains in its thread (``join`` waits for it)."""
        assert self._loop is not None and self.worker is not None
        worker = self.worker
        self._loop.call_soon_threadsafe(worker.stop)
        wait_until(lambda: worker.stopping, timeout=10, what="the worker to take the stop")

    def kill(self) -> None:
        assert self._loop is not None
        self.killed = True
        _KILLED.append(self._loop)
        self._loop.call_soon_threadsafe(self._loop.stop)
        assert self._thread is not None
        self._thread.join(10)

    def join(self, timeout: float = 60) -> None:
        assert self._thread is not None
        self._thread.join(timeout)
        assert not self._thread.is_alive(), "worker did not stop"
        if self.error:
            raise self.error


def run_one_chunk(
    stores: Stores,
    message: WorkMessage,
    *,
    engine: InProcessEngine | None = None,
    max_line_bytes: int = limits.DEFAULT_MAX_LINE_BYTES,
    during: Callable[[], None] | None = None,
    started: bool = False,
    policy: RunPolicy = RunPolicy(),
) -> ChunkReport:
    """One chunk through the worker's real path (``gpu_worker.chunk.ChunkRunner``: skip it if
    the batch stopped or the chunk is already counted, read it, every line through the engine,
    the parts and the count in one shielded commit; the last chunk signals the workflow),
    called synchronously. ``engine`` answers the lines in-process (default: every line a chat
    answer with usage 10 prompt + 3 completion tokens). ``during`` runs once the chunk has
    started and its lines are handed to the engine (e.g. cancel the batch while it runs).
    ``started``: a worker opened its attempt at this chunk earlier (before the batch stopped taking
    work) and finishes it now: the attempt is not opened again (the run record as that opening
    left it, or with this attempt open if it holds none); everything else is done. ``policy``: the
    checkpoints and poison budget (the worker's defaults)."""
    engine = engine or InProcessEngine()

    async def io(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        if started and fn is chunk_lifecycle.begin_run:
            record = stores.batches.chunk_run(message.tenant, message.batch_id, message.chunk, message.shards)
            if record is None:
                record = ChunkRunRecord(
                    tenant=message.tenant,
                    batch_id=message.batch_id,
                    chunk=message.chunk,
                    version=1,
                    open=[args[2]],
                    expires_at=message.expires_at + chunk_lifecycle.MARKER_RETENTION_SECONDS,
                    count_shards=message.shards,
                )
                stores.batches.save_chunk_run(record)
            return chunk_lifecycle.RunStart(record, died=0, exhausted=False)
        return fn(*args, **kwargs)

    return asyncio.run(
        process_chunk(
            stores,
            message,
            engine,
            io=io,
            max_line_bytes=max_line_bytes,
            on_dispatch=during or (lambda: None),
            policy=policy,
        )
    )


def wait_until(predicate, timeout: float = 30.0, interval: float = 0.02, what: str = "condition") -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"timed out waiting for {what}")


def queue_depth(url: str) -> tuple[int, int]:
    """(visible, in flight) messages of a queue."""
    attrs = clients.client("sqs").get_queue_attributes(
        QueueUrl=url, AttributeNames=["ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible"]
    )["Attributes"]
    return int(attrs["ApproximateNumberOfMessages"]), int(attrs["ApproximateNumberOfMessagesNotVisible"])


def dlq_url(queue_url: str) -> str:
    import json

    sqs = clients.client("sqs")
    policy = json.loads(
        sqs.get_queue_attributes(QueueUrl=queue_url, AttributeNames=["RedrivePolicy"])["Attributes"]["RedrivePolicy"]
    )
    return sqs.get_queue_url(QueueName=policy["deadLetterTargetArn"].split(":")[-1])["QueueUrl"]
