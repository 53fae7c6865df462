"""The local deployment as ``make up`` builds it (``infra.local.deployment.build``), for
``bench_pipeline``, with one difference: the worker reaches its engine through a URL of the bench's
choosing (a timestamping proxy), so the bench sees when requests reach the engine without any
change to product code. Only the chat model gets an engine and a worker (the bench sends chat
lines only); everything else (moto, the API front, ingest, the workflow, the sweepers, the
supervisor) is what ``make up`` runs.

    python -m tests.bench.pipeline_local --engine-port P --worker-engine-url URL

Environment as ``python -m infra.local`` (``PORT``, ``MOTO_PORT``, ``BATCHAPI_LOCAL_STATE_DIR``,
``ENGINE_MAX_NUM_SEQS``, ``WORKER_*``). Prints ``READY <base url>`` once the API answers and the
engine is healthy; SIGINT/SIGTERM stops everything it started.
"""

import argparse
import dataclasses
import logging
import os
import signal
import sys
import threading
from urllib.parse import urlsplit

from infra import names
from infra.local.__main__ import READY, config_from_env
from infra.local.deployment import build, wait_until_answering
from infra.local.processes import Engines, EngineSpec, Supervisor, Workers, max_num_seqs


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--engine-port", type=int, required=True, help="the chat engine's own port")
    p.add_argument("--worker-engine-url", required=True, help="where the worker sends its engine requests (the proxy)")
    args = p.parse_args()
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")

    stop = threading.Event()
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda *_: stop.set())

    config = dataclasses.replace(config_from_env(os.environ), engines=False)  # engines added below
    local = build(config, os.environ)
    seqs = max_num_seqs(os.environ)
    model = names.LOCAL_CHAT_MODEL
    proxy_port = urlsplit(args.worker_engine_url).port
    log_dir = config.state_path.parent / "logs"
    engines = Engines([EngineSpec(model, args.engine_port, seqs)], log_dir)
    # EngineSpec.url is 127.0.0.1:<port>: the worker's spec carries the proxy's port.
    workers = Workers([EngineSpec(model, proxy_port, seqs)], log_dir, os.environ)
    supervisor = Supervisor([*engines.children, *workers.children], log_dir / "supervisor.log")
    at = local.deployment.components.index(local.front)  # where build() puts engine_components()
    local.deployment.components[at:at] = [engines, workers, supervisor]
    try:
        local.deployment.start()
        wait_until_answering(local.front.base_url, config.key)
    except Exception as exc:
        local.deployment.stop()
        print(f"pipeline_local: could not start: {exc}", file=sys.stderr)
        return 1
    print(f"{READY} {local.front.base_url}", flush=True)
    while not stop.wait(1.0):
        pass
    failed = local.deployment.stop()
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
