"""The worker's own configuration, read from the environment once per process.

Every field is ``WORKER_<FIELD>`` in the environment (e.g. ``WORKER_MAX_IN_FLIGHT``); an empty
value counts as unset. Read by the same loader as the deployment settings
(``functions.core.settings.EnvSettings``, pydantic-settings). The deployment's shared settings
(table, bucket, queues, state machine) come from ``functions.core.settings.Settings``
(``BATCHAPI_*``), exactly as the Lambdas read them.
Logic receives a ``WorkerConfig``; nothing below ``__main__`` reads ``os.environ``.
"""

import math
from typing import Literal

from pydantic import Field, SecretStr
from pydantic_settings import SettingsConfigDict

from functions.core import limits, names
from functions.core.settings import EnvSettings

ENV_PREFIX = "WORKER_"

#: vLLM's default ``max_num_seqs`` for the OpenAI server on most GPUs (H100-class and larger: 1024,
#: CPU: 128). Used when neither ``max_in_flight`` nor ``engine_max_num_seqs`` is known.
VLLM_DEFAULT_MAX_NUM_SEQS = 256
#: Requests kept in flight per sequence slot of the engine: vLLM's scheduler only fills a freed
#: slot from its waiting queue, so the worker keeps that queue non-empty (vLLM's own offline
#: pooling path keeps 2 x max_num_seqs requests in the engine for the same reason).
IN_FLIGHT_PER_SEQ = 2
#: In smart order the worker, not vLLM's first-come queue, decides which line runs next: with an
#: engine in first-come order only about a quarter of max_num_seqs more than the engine runs is
#: sent ahead (enough to fill the slots that free up during one turnaround), the rest waits in the
#: worker's order. The same quarter is the reserve a newly arrived tenant's lines may take beyond
#: the cap (``Admission``'s ``reserve``).
SMART_AHEAD_FRACTION = 0.25


class WorkerConfig(EnvSettings):
    model_config = SettingsConfigDict(env_prefix=ENV_PREFIX, env_ignore_empty=True)

    #: The served model name whose work queue this worker drains (a key of Settings.models).
    model: str = ""
    #: The work queue; empty = ``Settings.models[model].queue_url``.
    queue_url: str = ""
    #: The OpenAI-compatible engine in the same task (loopback only).
    engine_url: str = "http://127.0.0.1:8000"
    #: Global cap on requests in flight to the engine; 0 = IN_FLIGHT_PER_SEQ x engine_max_num_seqs.
    max_in_flight: int = Field(default=0, ge=0)
    #: The engine's ``--max-num-seqs`` (the entrypoint passes the value it gave vLLM); 0 = unknown.
    engine_max_num_seqs: int = Field(default=0, ge=0)
    #: Chunks filling the engine at once (a chunk whose every line is already in the engine, its
    #: tail, does not count); 0 = enough chunks to fill the cap, plus two.
    max_open_chunks: int = Field(default=0, ge=0)
    #: The order lines of the open chunks enter the engine (``admission.Admission``): ``file`` (as
    #: they come) or ``smart`` (longest expected output first, lines sharing a prefix together).
    #: Results keep input order either way.
    order: Literal["file", "smart"] = "smart"
    #: The engine orders its waiting queue by each request's ``priority`` (vLLM
    #: ``--scheduling-policy priority``; the entrypoint and the local engines start it so): the
    #: worker tags every line in fair order across tenants (``admission.FairTags``), so it can let
    #: the engine keep as many lines waiting as it runs, as ``vllm run-batch`` does
    #: (``admission_cap``), without a tenant that arrives later waiting behind them.
    engine_priority: bool = False
    #: Follow the engine's measured capacity (``capacity.CapacityWatch``: vLLM's running and
    #: waiting gauges from /metrics, read every ``capacity_read_seconds``): lines in the engine =
    #: what it runs + a headroom, at most ``admission_cap()``. Off: always ``admission_cap()``.
    measure_capacity: bool = True
    capacity_read_seconds: float = Field(default=1.0, gt=0)
    #: One engine request (any endpoint) may take this long before it is retried.
    request_timeout_seconds: float = Field(default=600.0, gt=0)
    connect_timeout_seconds: float = Field(default=10.0, gt=0)
    #: Attempts per line on timeouts and connection errors, then an error line.
    max_attempts: int = Field(default=4, ge=1)
    backoff_base_seconds: float = Field(default=0.5, ge=0)
    backoff_max_seconds: float = Field(default=30.0, ge=0)
    #: A line answered 429/503 keeps being retried (with backoff, all requests paused) this long,
    #: then its last answer becomes its result.
    overload_max_seconds: float = Field(default=900.0, ge=0)
    #: How long to wait for the engine's /health before giving up (model download + load).
    health_timeout_seconds: float = Field(default=1800.0, gt=0)
    #: Visibility set on a message per extension (and at receive, by the queue).
    visibility_seconds: int = Field(default=names.WORK_VISIBILITY_SECONDS, gt=0, le=43_200)
    #: How often a running chunk's visibility is extended; 0 = a third of visibility_seconds.
    heartbeat_seconds: float = Field(default=0.0, ge=0)
    #: SQS long-poll wait.
    poll_wait_seconds: int = Field(default=20, ge=0, le=20)
    #: A chunk that failed for an infrastructure reason is retried after this long.
    failure_retry_seconds: int = Field(default=10, ge=0)
    #: After SIGTERM, in-flight chunks may finish this long; the rest are released to the queue.
    drain_seconds: float = Field(default=90.0, ge=0)
    #: A running chunk checkpoints its finished results (S3) once this many wait, or this long
    #: after its last checkpoint; a redelivery does not run them again. 0 turns a trigger off.
    #: Checkpoints are also the batch's live progress (docs/lifecycle.md, "Live progress"):
    #: request_counts lags finished lines by about ``checkpoint_seconds``.
    checkpoint_lines: int = Field(default=25, ge=0)
    checkpoint_seconds: float = Field(default=5.0, ge=0)
    #: ...but never by the line count sooner than this after the last checkpoint: fast lines are
    #: checkpointed by time (docs/lifecycle.md, "Live progress"; docs/benchmarks.md, "Worker ceiling").
    checkpoint_min_seconds: float = Field(default=1.0, ge=0)
    #: A chunk that failed for real (careful mode) sends this many lines at a time, alone on the
    #: engine (docs/reliability.md, "Poison isolation").
    careful_group_lines: int = Field(default=8, ge=1)
    #: Store calls (S3, DynamoDB) that run at once (``store_pool.StorePool``), when the stores
    #: allow it (``Stores.concurrent``): chunks that end together commit side by side. Each call
    #: is one or a few round trips, so a few threads cover a worker's open chunks.
    store_threads: int = Field(default=4, ge=1, le=32)
    #: Processes that run tenants' prompt and output policy checks (``policy_checks.PolicyChecks``:
    #: started at the first check, round-robin across tenants, one tenant holding at most all but
    #: one of them); 0 = two, up to four on machines of more than 8 cores.
    policy_check_processes: int = Field(default=0, ge=0, le=32)
    #: One line's check may take this long before its process is killed and the line fails
    #: ``policy_check_timeout`` (``limits.POLICY_CHECK_SECONDS``).
    policy_check_seconds: float = Field(default=limits.POLICY_CHECK_SECONDS, gt=0)
    #: The deployment's secret the tenants' prefix-cache salts are derived from
    #: (``shaping.CacheSalts``); empty: a random one for this process.
    cache_salt_secret: SecretStr | None = None
    #: Metrics (EMF) and a summary log line are flushed this often.
    metrics_interval_seconds: float = Field(default=60.0, gt=0)
    metrics_namespace: str = "BatchApi/Worker"
    service: str = "gpu-worker"
    #: Added to the worker's nice value as it starts (``os.nice``, before its first thread): on a
    #: host where it shares cores with its engine (the local deployment runs it at
    #: ``infra.local.processes.CONTROL_PLANE_NICE``), the engine's threads go first. 0 on a GPU task,
    #: whose engine steps run on the GPU (docs/local.md, "CPU priority: the engines first").
    nice: int = Field(default=0, ge=0, le=19)

    def in_flight_cap(self) -> int:
        """The global cap on requests in flight (module docstring of loop.py explains the default)."""
        if self.max_in_flight:
            return self.max_in_flight
        return IN_FLIGHT_PER_SEQ * (self.engine_max_num_seqs or VLLM_DEFAULT_MAX_NUM_SEQS)

    def engine_seqs(self) -> int:
        """The engine's max_num_seqs, as known (else derived from an explicit cap, else vLLM's default)."""
        if self.engine_max_num_seqs:
            return self.engine_max_num_seqs
        if self.max_in_flight:
            return max(1, self.max_in_flight // IN_FLIGHT_PER_SEQ)
        return VLLM_DEFAULT_MAX_NUM_SEQS

    def ahead(self) -> int:
        """SMART_AHEAD_FRACTION of the engine's max_num_seqs (at least one line)."""
        return max(1, math.ceil(self.engine_seqs() * SMART_AHEAD_FRACTION))

    def admission_cap(self) -> int:
        """Lines in the engine at once (``admission.Admission``): the in-flight cap in file order. In
        smart order, with an engine in first-come order, max_num_seqs plus ``ahead()`` (never
        above the cap), so that the order, not vLLM's queue, picks what starts next; with an engine
        that schedules by priority (``engine_priority``), the in-flight cap less ``ahead()``: the
        engine keeps nearly as many lines waiting as it runs (a wave of lines that end together is
        followed at once by the next, as in ``vllm run-batch``), in the tags' fair order."""
        if self.order == "file":
            return self.in_flight_cap()
        if self.engine_priority:
            return max(1, self.in_flight_cap() - self.ahead())
        return min(self.in_flight_cap(), self.engine_seqs() + self.ahead())

    def admission_reserve(self) -> int:
        """Lines a tenant that just arrived may send beyond ``admission_cap`` at once
        (``Admission``'s ``reserve``): ``ahead()``, within the in-flight cap."""
        return max(0, min(self.ahead(), self.in_flight_cap() - self.admission_cap()))

    def open_chunk_cap(self, chunk_max_lines: int) -> int:
        if self.max_open_chunks:
            return self.max_open_chunks
        return math.ceil(self.in_flight_cap() / max(1, chunk_max_lines)) + 2

    def heartbeat_interval(self) -> float:
        return self.heartbeat_seconds or self.visibility_seconds / 3
