"""``python -m infra.local`` (``make up``): the whole system on this machine, in the foreground.

Environment: ``PORT`` (API, default 8080), ``MOTO_PORT`` (moto, default 4566),
``BATCHAPI_LOCAL_STATE_DIR`` (where endpoint.json and the engines' and workers' logs go, default
<repo>/.local-state), ``BATCHAPI_LOCAL_ENGINES=0`` (no engines and workers),
``BATCHAPI_LOCAL_SPEECH=0`` (no speech model). Port 0 picks a free port. Ctrl-C (SIGINT) or SIGTERM
stops everything it started; the exit status is 0 when everything stopped cleanly. An engine or
worker that dies meanwhile is restarted with backoff (``processes.Supervisor``; each restart is
logged here and in <state dir>/logs/supervisor.log).
"""

import logging
import os
import signal
import sys
import threading
from collections.abc import Mapping

from functions.core.settings import Settings
from infra import names

from . import state
from .deployment import LocalConfig, build, wait_until_answering

READY = "READY"


def config_from_env(env: Mapping[str, str]) -> LocalConfig:
    # Without speech, neither its route nor its engine: the API refuses its model, as a deployment that lacks it.
    models = {
        model: route
        for model, route in names.LOCAL_MODELS.items()
        if model != names.LOCAL_SPEECH_MODEL or env.get(SPEECH_ENV, "1") != "0"
    }
    return LocalConfig(
        api_port=int(env.get("PORT") or names.LOCAL_API_PORT),
        moto_port=int(env.get("MOTO_PORT") or names.LOCAL_MOTO_PORT),
        state_path=state.state_path(env),
        engines=env.get(ENGINES_ENV, "1") != "0",
        engine_ports=tuple((model, 0) for model in models),
        fair_queues=env.get(FAIR_QUEUES_ENV, "1") != "0",
        settings=LocalConfig.settings.model_copy(
            update={
                "models": models,
                # The governance switch (Settings.governance): BATCHAPI_GOVERNANCE=false turns it off locally.
                "governance": env.get(Settings.env_name("governance"), "true").lower() != "false",
            }
        ),
    )


#: ``BATCHAPI_LOCAL_ENGINES=0`` runs without the vLLM engines and workers (API, ingest, workflow).
ENGINES_ENV = "BATCHAPI_LOCAL_ENGINES"
#: ``BATCHAPI_LOCAL_SPEECH=0``: no speech model (Whisper's engine takes ~2.3 GiB and ~40 s to load).
SPEECH_ENV = "BATCHAPI_LOCAL_SPEECH"
#: ``BATCHAPI_LOCAL_FAIR_QUEUES=0``: moto's standard queues receive by arrival (no fair-queue emulation).
FAIR_QUEUES_ENV = "BATCHAPI_LOCAL_FAIR_QUEUES"


def main() -> int:
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    try:
        config = config_from_env(os.environ)
    except ValueError as exc:
        print(f"infra.local: bad PORT/MOTO_PORT: {exc}", file=sys.stderr)
        return 2

    stop = threading.Event()
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda *_: stop.set())

    local = build(config, os.environ)
    try:
        local.deployment.start()
        wait_until_answering(local.front.base_url, config.key)
    except Exception as exc:  # noqa: BLE001 - whatever failed, stop what started and say why
        local.deployment.stop()
        print(f"infra.local: could not start: {exc}", file=sys.stderr)
        return 1

    print(f"moto (local AWS): {local.moto.endpoint}", flush=True)
    print(f"state file:       {local.state_file.path}", flush=True)
    print(f"base URL:         {local.front.base_url}", flush=True)
    print(
        f"API key:          {config.key}  (tenant {config.tenant!r}; more: batchctl keys create --tenant NAME)",
        flush=True,
    )
    print("Ctrl-C stops everything.", flush=True)
    print(f"{READY} {local.front.base_url}", flush=True)

    while not stop.wait(1.0):
        pass
    print("stopping...", flush=True)
    failed = local.deployment.stop()
    if failed:
        print(f"infra.local: failed to stop: {', '.join(failed)}", file=sys.stderr)
        return 1
    print("stopped.", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
