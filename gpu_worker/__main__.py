"""``python -m gpu_worker``: the GPU worker process (one per ECS task, beside the engine).

Reads its configuration once (``WORKER_*`` and the deployment's ``BATCHAPI_*`` settings), builds
the stores, the queue and the engine client, installs SIGTERM/SIGINT handlers (drain), runs.
Exit status: 0 after a clean stop, 1 if the engine never became healthy, 2 on bad configuration.
"""

import asyncio
import gc
import os
import signal
import sys
from collections.abc import Mapping

from aws_lambda_powertools import Logger

from functions.core import clients
from functions.core.aws import stores_from_settings
from functions.core.aws.sqs import SqsQueue
from functions.core.ports import Stores, WorkQueue
from functions.core.settings import Settings

from .config import WorkerConfig
from .engine_client import EngineClient, EngineDown
from .loop import Worker
from .metrics import WorkerMetrics, make_logger


class ConfigError(Exception):
    pass


def queue_url(config: WorkerConfig, settings: Settings) -> str:
    if config.queue_url:
        return config.queue_url
    route = settings.models.get(config.model)
    if route is None or not route.queue_url:
        raise ConfigError(
            f"no work queue: set WORKER_QUEUE_URL, or WORKER_MODEL to one of {sorted(settings.models)} "
            "(BATCHAPI_MODELS names each model's queue)"
        )
    return route.queue_url


def new_event_loop() -> asyncio.AbstractEventLoop:
    """uvloop's event loop where it is installed (the vLLM image has it: uvicorn's), else
    asyncio's: the loop's own work (callbacks, timers, socket reads and writes) is a large part of
    a short line's CPU (docs/benchmarks.md, "Worker ceiling")."""
    try:
        import uvloop
    except ImportError:  # pragma: no cover - a platform without it
        return asyncio.new_event_loop()
    return uvloop.new_event_loop()


def freeze_startup_heap() -> None:
    """Take what the process built to start (its modules, boto3's service models, pydantic's
    schemas: hundreds of thousands of objects that live as long as it) out of the garbage
    collector's view, so its full collections, which the per-line garbage of a fast batch
    triggers every few thousand lines, scan only what came after (``gc.freeze``). Measured in
    docs/benchmarks.md, "Worker ceiling"."""
    gc.collect()
    gc.freeze()


def build_worker(
    config: WorkerConfig,
    settings: Settings,
    *,
    stores: Stores,
    queue: WorkQueue,
    engine: EngineClient,
    metrics: WorkerMetrics,
    logger: Logger,
) -> Worker:
    """The worker of ``config`` under the deployment's ``settings`` (its line bound, chunk size and
    the hosts audio lines may be fetched from)."""
    return Worker(
        config,
        stores=stores,
        queue=queue,
        engine=engine,
        metrics=metrics,
        logger=logger,
        max_line_bytes=settings.max_line_bytes,
        chunk_max_lines=settings.chunk_max_lines,
        allowed_media_domains=settings.allowed_media_domains,
    )


async def serve(config: WorkerConfig, settings: Settings, stores: Stores, queue: WorkQueue) -> int:
    logger = make_logger(config.service)
    logger.append_keys(model=config.model)
    metrics = WorkerMetrics(
        namespace=config.metrics_namespace, service=config.service, logger=logger, model=config.model
    )
    async with EngineClient.from_config(config) as engine:
        worker = build_worker(
            config, settings, stores=stores, queue=queue, engine=engine, metrics=metrics, logger=logger
        )
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, worker.stop)
        freeze_startup_heap()
        try:
            await worker.run()
        except EngineDown as exc:
            logger.error("engine unavailable; exiting", extra={"error": str(exc)})
            return 1
    logger.info("stopped")
    return 0


def main(env: Mapping[str, str] | None = None) -> int:
    env = os.environ if env is None else env
    try:
        config = WorkerConfig.from_env(env)
        settings = Settings.from_env(env)
        url = queue_url(config, settings)
    except (ConfigError, ValueError) as exc:
        print(f"gpu_worker: configuration error: {exc}", file=sys.stderr)
        return 2
    if config.nice:
        os.nice(config.nice)  # before any thread: each thread it starts inherits it
    with asyncio.Runner(loop_factory=new_event_loop) as runner:
        return runner.run(
            serve(
                config, settings, stores_from_settings(settings, concurrent=True), SqsQueue(clients.client("sqs"), url)
            )
        )


if __name__ == "__main__":
    sys.exit(main())
