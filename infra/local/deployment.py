"""The local deployment: an ordered list of components, each with ``start()`` and ``stop()``.

``Deployment.start()`` starts them in order and, if one fails, stops those already started;
``Deployment.stop()`` stops them in reverse order. Later parts of the system (SQS pollers, the
workflow front, GPU workers) are more components appended in ``components()``.
"""

import json
import logging
import os
import socket
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, MutableMapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from functions.api import handler as api_handler
from functions.assembler import handler as assembler_handler
from functions.audit_append import handler as audit_append_handler
from functions.authorizer import handler as authorizer_handler
from functions.chunk_dlq import handler as chunk_dlq_handler
from functions.core import auth, clients, deps, http, limits, signing
from functions.core.settings import Settings
from functions.ingest import handler as ingest_handler
from functions.ingest_dlq import handler as ingest_dlq_handler
from functions.stream_front.routes import StreamFront
from functions.sweeper import handler as sweeper_handler
from functions.webhooks import handler as webhooks_handler
from functions.workflow import handler as workflow_handler
from gpu_worker.local_engine import free_port
from infra import names

from . import atomic_dynamodb, fair_queues, moto_dispatch, moto_query, moto_sfn_clients, moto_sfn_paths, state
from .front import LocalApi, make_server
from .lambda_context import LocalLambdaContext
from .lambda_front import LambdaFront
from .moto_keepalive import KeepAliveMotoServer
from .pollers import Poller
from .processes import (
    CONTROL_PLANE_NICE,
    PROCESS_COMPONENTS,
    Engines,
    EngineSpec,
    Supervisor,
    Workers,
    max_num_seqs,
)
from .resources import create_resources, create_webhook_queue, ingest_dlq_url, ingest_queue_url, work_dlq_url
from .served import ServedHttp
from .ttl import start_sweeper

log = logging.getLogger("infra.local")

Clock = Callable[[], int]


def now() -> int:
    return int(time.time())


class Component(Protocol):
    name: str

    def start(self) -> None: ...

    def stop(self) -> None: ...


class Deployment:
    """The components, started in order. Those of the control plane start from a thread at
    ``control_plane_nice`` (Linux), so that every thread they start (servers, pollers, sweepers,
    the Lambdas those run) inherits it and the engines' threads go first on cores they share
    (docs/local.md, "CPU priority: the engines first"). The components that start processes
    (``PROCESS_COMPONENTS``: the engines, their workers, the supervisor that restarts both) start
    from the calling thread, so the engines keep its priority; the workers lower their own
    (``WORKER_NICE``)."""

    def __init__(self, components: Sequence[Component], control_plane_nice: int = CONTROL_PLANE_NICE):
        self.components = list(components)
        self.control_plane_nice = control_plane_nice
        self._started: list[Component] = []

    def start(self) -> None:
        for component in self.components:
            try:
                if isinstance(component, PROCESS_COMPONENTS):
                    component.start()
                else:
                    start_at_nice(component, self.control_plane_nice)
            except BaseException:
                self.stop()
                raise
            self._started.append(component)
            log.debug("started %s", component.name)

    def stop(self) -> list[str]:
        """Stop what was started, newest first; returns the names of components that failed to stop."""
        failed = []
        while self._started:
            component = self._started.pop()
            try:
                component.stop()
            except Exception:
                log.exception("stopping %s failed", component.name)
                failed.append(component.name)
        return failed


def start_at_nice(component: Component, nice: int) -> None:
    """``component.start()`` on a thread of its own whose nice value is raised to ``nice`` (never
    lowered: a process started under ``nice`` keeps its own), waited for; its error, if any, is
    raised here. Linux keeps a nice value per thread, inherited by the threads and processes a
    thread starts (setpriority(2), "BUGS"); elsewhere one value is the whole process's, so the
    component starts at the caller's."""
    if sys.platform != "linux":
        component.start()
        return

    def run() -> None:
        tid = threading.get_native_id()
        os.setpriority(os.PRIO_PROCESS, tid, max(nice, os.getpriority(os.PRIO_PROCESS, tid)))
        component.start()

    with ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"start-{component.name}") as starter:
        starter.submit(run).result()


def check_port_free(host: str, port: int, setting: str) -> None:
    """Fail early with a clear message (moto's server thread would otherwise die silently)."""
    if port == 0:
        return
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError as exc:
            raise RuntimeError(
                f"{host}:{port} is already in use ({exc.strerror}); is another `make up` running? "
                f"{setting}=<port> picks another port"
            ) from None


# --- Components -------------------------------------------------------------------------------
class MotoServer:
    """moto in server mode: the local AWS."""

    name = "moto"

    def __init__(self, host: str, port: int, fair: bool = True):
        self._host, self._port, self._fair = host, port, fair
        self._server: KeepAliveMotoServer | None = None

    def start(self) -> None:
        check_port_free(self._host, self._port, "MOTO_PORT")
        logging.getLogger("werkzeug").setLevel(logging.WARNING)  # no line per AWS call
        fair_queues.install(self._fair)  # standard queues receive as SQS fair queues (fair_queues.py)
        atomic_dynamodb.install()  # each DynamoDB request atomic, as AWS's (atomic_dynamodb.py)
        moto_dispatch.install()  # each host's backend found once (moto_dispatch.py)
        moto_query.install()  # a Query lists its partition, not the table (moto_query.py)
        moto_sfn_clients.install()  # a state machine's task clients built once (moto_sfn_clients.py)
        moto_sfn_paths.install()  # a state machine's JSONPaths parsed once (moto_sfn_paths.py)
        # Its clients' connections kept, as AWS's endpoints keep them (moto_keepalive.py).
        self._server = KeepAliveMotoServer(ip_address=self._host, port=self._port, verbose=False)
        self._server.start()
        self._port = self._server.get_host_and_port()[1]
        # Run state machines for real (their Lambda tasks reach the LambdaFront); must be set
        # before the state machine is created.
        request = urllib.request.Request(
            f"{self.endpoint}/moto-api/config",
            data=json.dumps(MOTO_CONFIG).encode(),
            method="POST",
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=10):  # loopback URL we built
            pass
        logging.getLogger("moto.stepfunctions.parser").setLevel(logging.CRITICAL)  # logs caught errors loudly

    @property
    def port(self) -> int:
        return self._port

    @property
    def endpoint(self) -> str:
        return f"http://{self._host}:{self._port}"

    def stop(self) -> None:
        if self._server is not None:
            self._server.stop()
            self._server = None


MOTO_CONFIG = {"stepfunctions": {"execute_state_machine": True}, "lambda": {"use_docker": False}}


class AwsEnvironment:
    """Points this process's boto3 clients at moto and configures the handlers (as the stack
    configures the Lambdas): endpoint, fake credentials, region, ``settings.to_env()``."""

    name = "environment"
    _CLEARED = ("AWS_PROFILE", "AWS_DEFAULT_PROFILE", "AWS_SESSION_TOKEN", "AWS_SECURITY_TOKEN")

    def __init__(self, environ: MutableMapping[str, str], moto: MotoServer, lambdas: LambdaFront, settings: Settings):
        self._environ, self._moto, self._lambdas, self._settings = environ, moto, lambdas, settings
        self._saved: dict[str, str | None] = {}

    def start(self) -> None:
        values: dict[str, str | None] = {
            "AWS_ENDPOINT_URL": self._moto.endpoint,
            "AWS_ACCESS_KEY_ID": state.ACCESS_KEY_ID,
            "AWS_SECRET_ACCESS_KEY": state.SECRET_ACCESS_KEY,
            "AWS_REGION": state.REGION,
            "AWS_DEFAULT_REGION": state.REGION,
            # moto's own SDK calls (its Step Functions interpreter's Lambda invokes) go to this
            # port: the Lambda front, which runs our handlers and forwards the rest to moto.
            "MOTO_PORT": str(self._lambdas.port),
            **{name: None for name in self._CLEARED},
            **self._settings.to_env(),
        }
        for key, value in values.items():
            self._saved[key] = self._environ.get(key)
            if value is None:
                self._environ.pop(key, None)
            else:
                self._environ[key] = value
        deps.reset()

    def stop(self) -> None:
        for key, value in self._saved.items():
            if value is None:
                self._environ.pop(key, None)
            else:
                self._environ[key] = value
        self._saved.clear()
        deps.reset()


class Resources:
    """The resources (from the definitions the stack uses) and the seeded API key. Like a stack's
    outputs, the queue URLs and the state machine ARN then go into the handlers' settings."""

    name = "resources"

    def __init__(
        self,
        environ: MutableMapping[str, str],
        settings: Settings,
        *,
        prefix: str,
        tenant: str,
        key: str,
        clock: Clock = now,
    ):
        self._environ, self._settings, self._prefix = environ, settings, prefix
        self._tenant, self._key, self._clock = tenant, key, clock

    def start(self) -> None:
        concrete = create_resources(
            self._settings,
            clients.client,
            prefix=self._prefix,
            workflow_function_arn=workflow_function_arn(self._prefix),
        )
        self._environ.update(concrete.to_env())
        deps.reset()
        auth.create_key(deps.stores().keys, self._tenant, now=self._clock(), key=self._key)

    def stop(self) -> None:
        pass  # they live in moto and go with it


class AuditSigningKey:
    """The local stand-in for the stack's KMS key that signs the audit checkpoints (docs/audit.md):
    a P-256 key file in the state directory (made on first start, mode 0600; outside moto, so
    access to moto alone cannot sign), and its public half beside it for ``batchctl audit
    verify``. Only the appender's settings name the private key (the workers' environment drops it)."""

    name = "audit-signing-key"

    def __init__(self, environ: MutableMapping[str, str], directory: Path, *, enabled: bool):
        self._environ, self._enabled = environ, enabled
        self.private = directory / names.LOCAL_AUDIT_KEY_FILE
        self.public = directory / names.LOCAL_AUDIT_PUBLIC_KEY_FILE

    def start(self) -> None:
        if not self._enabled:  # governance off: no audit chain, no key
            return
        self.public.write_bytes(signing.FileSigner(self.private).public_pem())
        self._environ[Settings.env_name("audit_local_key_file")] = str(self.private)
        deps.reset()

    def stop(self) -> None:
        pass  # kept: the next start signs with the same key


class TtlSweeper:
    """DynamoDB TTL + the stream-triggered reaper, which moto does not run."""

    name = "ttl-sweeper"

    def __init__(self, settings: Settings, *, every: float, clock: Clock = now):
        self._settings, self._every, self._clock = settings, every, clock
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._stop.clear()
        table = clients.dynamodb_table(self._settings.table_name)
        stores = deps.stores()
        self._thread = start_sweeper(
            table, stores.objects, self._clock, self._stop, every=self._every, stored=stores.stored
        )

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None


class AssemblyQueue:
    """The upload assembler's queue (infra/constructs/uploads.py, docs/uploads.md); like the
    stack's output, its URL goes into the handlers' settings."""

    name = "assembly-queue"

    def __init__(self, environ: MutableMapping[str, str], prefix: str):
        self._environ, self._prefix = environ, prefix

    @property
    def url(self) -> str:
        return self._environ[Settings.env_name("assembly_queue_url")]

    def start(self) -> None:
        self._environ[Settings.env_name("assembly_queue_url")] = clients.client("sqs").create_queue(
            QueueName=f"{self._prefix}-assembly",
            Attributes={"VisibilityTimeout": str(limits.ASSEMBLER_TIMEOUT_SECONDS)},
        )["QueueUrl"]
        deps.reset()

    def stop(self) -> None:
        pass  # it lives in moto and goes with it


#: Concurrent rounds on the webhook queue, as its event source mapping invokes the webhook Lambda
#: concurrently on AWS: a round attempts its deliveries at once and lasts up to one POST deadline,
#: so a message arriving meanwhile is taken by another round instead of waiting for it.
WEBHOOK_POLLERS = 4


class WebhookQueue:
    """The webhook queue and the EventBridge rule feeding it (infra/constructs/webhooks.py,
    docs/webhooks.md); like the stack's output, its URL goes into the handlers' settings."""

    name = "webhook-queue"

    def __init__(self, environ: MutableMapping[str, str], prefix: str, event_bus: str):
        self._environ, self._prefix, self._event_bus = environ, prefix, event_bus

    @property
    def url(self) -> str:
        return self._environ[Settings.env_name("webhook_queue_url")]

    def start(self) -> None:
        url, dead_letters = create_webhook_queue(clients.client, prefix=self._prefix, event_bus=self._event_bus)
        self._environ[Settings.env_name("webhook_queue_url")] = url
        self._environ[Settings.env_name("webhook_dead_letter_queue_url")] = dead_letters
        deps.reset()

    def stop(self) -> None:
        pass  # it lives in moto and goes with it


class Sweeper:
    """What the EventBridge schedule does: invokes the sweeper's handler every ``every`` seconds
    (``Settings.sweep_seconds``) in a thread."""

    name = "sweeper"

    def __init__(self, every: float, handler: Callable[[dict, object], object] = sweeper_handler.handler):
        self._every, self._handler = every, handler
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def tick(self) -> None:
        try:
            self._handler({"source": "aws.events", "detail-type": "Scheduled Event"}, LocalLambdaContext(self.name))
        except Exception:  # a moto hiccup must not end the sweeps for the rest of the run
            log.exception("sweep failed; the next one retries in %ss", self._every)

    def start(self) -> None:
        self._stop.clear()

        def run() -> None:
            while not self._stop.wait(self._every):
                self.tick()

        self._thread = threading.Thread(target=run, name="sweeper", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None


class HttpFront:
    """What API Gateway does: HTTP on loopback -> authorizer + api handler."""

    name = "http-front"

    def __init__(self, host: str, port: int):
        self._host, self._port = host, port
        self._served = ServedHttp()

    def start(self) -> None:
        check_port_free(self._host, self._port, "PORT")
        stream = StreamFront(deps.stores, deps.settings(), deps.now)
        server = make_server(
            LocalApi(api_handler.handler, authorizer_handler.handler, stream=stream), self._host, self._port
        )
        self._port = self._served.serve(server, self.name)

    @property
    def base_url(self) -> str:
        return f"http://{self._host}:{self._port}{http.API_PREFIX}"

    def stop(self) -> None:
        self._served.shutdown()


class StateFile:
    """``endpoint.json``: how batchctl and tests find this deployment while it runs."""

    name = "state-file"

    def __init__(self, path: Path, make: Callable[[], state.LocalState]):
        self.path, self._make = path, make

    def start(self) -> None:
        self._make().write(self.path)

    def stop(self) -> None:
        current = state.LocalState.read(self.path)
        if current is not None and current.pid == os.getpid():  # never remove another run's file
            self.path.unlink(missing_ok=True)


def workflow_function_arn(prefix: str) -> str:
    return f"arn:aws:lambda:{state.REGION}:123456789012:function:{prefix}-workflow"


# --- Assembly ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class LocalConfig:
    host: str = "127.0.0.1"
    api_port: int = names.LOCAL_API_PORT
    moto_port: int = names.LOCAL_MOTO_PORT
    state_path: Path = state.REPO_ROOT / names.LOCAL_STATE_DIR / names.LOCAL_STATE_FILE
    tenant: str = names.LOCAL_TENANT
    key: str = names.LOCAL_KEY
    lambda_port: int = 0
    prefix: str = names.LOCAL_PREFIX
    #: Run the vLLM engines and the workers (off: the API, ingest and workflow only, in a second).
    engines: bool = True
    #: Ports of the engines by model (0 = a free port): one for each model ``settings.models`` routes.
    engine_ports: tuple[tuple[str, int], ...] = tuple((model, 0) for model in names.LOCAL_MODELS)
    ttl_sweep_seconds: float = 10.0
    #: moto's standard queues receive as SQS fair queues (infra/local/fair_queues.py); off: by arrival.
    fair_queues: bool = True
    settings: Settings = Settings(
        table_name=names.LOCAL_TABLE,
        bucket_name=names.LOCAL_BUCKET,
        # The batch events go to a bus of the stack's name, not the default bus (docs/webhooks.md).
        event_bus_name=names.event_bus_name(names.LOCAL_PREFIX),
        models=names.LOCAL_MODELS,
        completion_windows=names.LOCAL_COMPLETION_WINDOWS,
        # Small chunks and a short drain: on one CPU engine a batch spans several chunks, so
        # cancel and expiry show partial results within seconds.
        chunk_max_lines=25,
        drain_grace_seconds=10,
        drain_poll_seconds=1,
        # A lost completion or cancel signal is recovered within 10 s (docs/lifecycle.md, "Lost signals"; 300 s on
        # AWS). Each reconcile tick of an open batch runs the workflow's register and check tasks
        # on moto's interpreter, on the CPU the engine uses: at 2 s the ticks of one open batch took
        # about 10 % of a core here (docs/benchmarks.md, "End to end vs vllm run-batch").
        reconcile_seconds=10,
        # The sweeper (docs/lifecycle.md, "Liveness: every batch ends") every 5 s: a batch never
        # enqueued is restarted after 5 s, an open one 30 s past its expiry is finalized (the
        # drain grace is 10 s), one validating past the ingest event's local retry life (5
        # receives x 60 s visibility) is failed.
        sweep_seconds=5,
        enqueue_grace_seconds=5,
        expiry_grace_seconds=30,
        validating_timeout_seconds=6 * 60,
        # Webhooks to a receiver on this machine (http://127.0.0.1:...); never on AWS.
        webhook_allow_loopback_http=True,
    )


@dataclass(frozen=True)
class Local:
    """The assembled deployment and the handles ``__main__`` reports from."""

    deployment: Deployment
    moto: MotoServer
    front: HttpFront
    state_file: StateFile


def build(config: LocalConfig, environ: MutableMapping[str, str]) -> Local:
    moto = MotoServer(config.host, config.moto_port, config.fair_queues)
    lambdas = LambdaFront(
        config.host,
        config.lambda_port,
        lambda: moto.port,
        {f"{config.prefix}-workflow": workflow_handler.handler},
    )
    front = HttpFront(config.host, config.api_port)
    audit_key = AuditSigningKey(environ, config.state_path.parent, enabled=config.settings.governance)
    state_file = StateFile(
        config.state_path,
        lambda: state.LocalState(
            moto_endpoint=moto.endpoint,
            api_base_url=front.base_url,
            table_name=config.settings.table_name,
            bucket_name=config.settings.bucket_name,
            pid=os.getpid(),
            audit_queue_url=environ.get(Settings.env_name("audit_queue_url"), ""),
            audit_bucket_name=environ.get(Settings.env_name("audit_bucket_name"), ""),
            audit_public_key_file=str(audit_key.public) if config.settings.governance else "",
        ),
    )

    def dlq_url(model: str) -> Callable[[], str]:
        return lambda: work_dlq_url(clients.client, config.prefix, model)

    deployment = Deployment(
        [
            moto,
            lambdas,
            AwsEnvironment(environ, moto, lambdas, config.settings),
            Resources(environ, config.settings, prefix=config.prefix, tenant=config.tenant, key=config.key),
            audit_key,
            TtlSweeper(config.settings, every=config.ttl_sweep_seconds),
            Poller(
                "ingest",
                lambda: clients.client("sqs"),
                lambda: ingest_queue_url(clients.client, config.prefix),
                ingest_handler.handler,
            ),
            Poller(
                "ingest-dlq",
                lambda: clients.client("sqs"),
                lambda: ingest_dlq_url(clients.client, config.prefix),
                ingest_dlq_handler.handler,
            ),
            assembly := AssemblyQueue(environ, config.prefix),
            Poller("assembler", lambda: clients.client("sqs"), lambda: assembly.url, assembler_handler.handler),
            webhook_queue := WebhookQueue(environ, config.prefix, config.settings.event_bus_name),
            Poller(
                "webhooks",
                lambda: clients.client("sqs"),
                lambda: webhook_queue.url,
                webhooks_handler.handler,
                threads=WEBHOOK_POLLERS,
            ),
            Sweeper(config.settings.sweep_seconds),
            *audit_appender(config, environ),
            *(
                Poller(f"dlq-{model}", lambda: clients.client("sqs"), dlq_url(model), chunk_dlq_handler.handler)
                for model in config.settings.models
            ),
            *engine_components(config, environ),
            front,
            state_file,
        ]
    )
    return Local(deployment=deployment, moto=moto, front=front, state_file=state_file)


def audit_appender(config: LocalConfig, environ: MutableMapping[str, str]) -> list[Component]:
    """The audit appender on the audit queue, as its event source mapping runs it (governance
    off: no queue, no appender)."""
    if not config.settings.governance:
        return []
    return [
        Poller(
            "audit-append",
            lambda: clients.client("sqs"),
            lambda: environ[Settings.env_name("audit_queue_url")],
            audit_append_handler.handler,
        )
    ]


def engine_components(config: LocalConfig, environ: MutableMapping[str, str]) -> list[Component]:
    """The engines (one vLLM server per model) and a worker beside each, unless turned off."""
    if not config.engines:
        return []
    seqs = max_num_seqs(environ)  # one --max-num-seqs for each engine and its worker's cap
    specs = [EngineSpec(model, port or free_port(config.host), seqs) for model, port in config.engine_ports]
    log_dir = config.state_path.parent / "logs"
    engines, workers = Engines(specs, log_dir), Workers(specs, log_dir, environ)
    # Last, so it stops first: nothing is restarted while the workers drain and the engines stop.
    return [engines, workers, Supervisor([*engines.children, *workers.children], log_dir / "supervisor.log")]


def wait_until_answering(base_url: str, key: str, timeout: float = 10.0) -> None:
    """Block until an authenticated API call succeeds end to end (front, authorizer, api handler,
    DynamoDB on moto); TimeoutError if it does not within ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    request = urllib.request.Request(f"{base_url}/files?limit=1", headers={http.AUTH_HEADER: f"Bearer {key}"})
    last: object = None
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(request, timeout=2) as response:  # loopback URL we built
                if response.status == 200:
                    return
                last = response.status
        except (urllib.error.URLError, OSError) as exc:
            last = exc
        time.sleep(0.05)
    raise TimeoutError(f"the local API did not answer at {base_url} within {timeout}s (last: {last})")
