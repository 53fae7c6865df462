"""The one deployment config: what an infra team chooses per deployment, typed and validated.

Every field has a default, so ``cdk synth`` works with no config at all. A deployment gives its
config through CDK context under ``CONTEXT_KEY``:

- a path to a JSON or YAML file: ``cdk deploy -c batchapi=deploy.yaml``
  (relative paths are resolved from the current directory, i.e. the repository root);
- or the config inline, as an object in ``cdk.json``'s ``"context": {"batchapi": {...}}``
  or as a JSON string on the command line.

Names and limits that the code shares are not redefined here: ``limits`` overrides fields of
``functions.core.settings.Settings`` (the same names the Lambdas read), validated against it. A
model's ``worker`` section overrides fields of ``gpu_worker.config.WorkerConfig`` and is validated
against it the same way (``infra`` may import ``functions`` and ``gpu_worker``; they never import
``infra``).
"""

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, Final, Literal, Self

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from functions.core import limits as core_limits
from functions.core.settings import ModelRoute, Settings
from gpu_worker.config import WorkerConfig

#: The CDK context key that carries the config (a file path or an object).
CONTEXT_KEY: Final = "batchapi"

#: The values CloudWatch Logs accepts for RetentionInDays.
LOG_RETENTION_DAYS: Final = frozenset(
    (1, 3, 5, 7, 14, 30, 60, 90, 120, 150, 180, 365, 400, 545, 731, 1096, 1827, 2192, 2557, 2922, 3288, 3653)
)

#: Settings fields the stack wires from its own resources (or from other config fields); every
#: other Settings field is a limit a config may override.
_WIRED_SETTINGS: Final = frozenset(
    {
        "table_name",
        "bucket_name",
        "models",
        "state_machine_arn",
        "event_bus_name",
        "completion_windows",
        "governance",
        "audit_queue_url",
        "audit_bucket_name",
        "audit_signing_key_id",
        "audit_local_key_file",
    }
)

#: WorkerConfig fields the stack wires (the model, its queue, the engine on loopback); every other
#: field is a knob a model's ``worker`` section may set (``WORKER_<FIELD>`` in the container).
_WIRED_WORKER: Final = frozenset({"model", "queue_url", "engine_url"})

#: The endpoints a model serves unless its config says otherwise (a chat model: vLLM serves the
#: Responses API for every generate model). An embeddings model: ``["/v1/embeddings", "/v1/score",
#: "/v1/rerank"]`` (vLLM scores with the embeddings' cosine); a cross-encoder reranker:
#: ``["/v1/score", "/v1/rerank"]``; a speech model: ``["/v1/audio/transcriptions",
#: "/v1/audio/translations"]`` (its audio hosts: ``limits: {"allowed_media_domains": [...]}``)
#: (docs/engine.md "Endpoints").
DEFAULT_MODEL_ENDPOINTS: Final = ("/v1/chat/completions", "/v1/completions", "/v1/responses")

#: The engine image the GPU worker runs by default: the same vLLM release the local deployment runs
#: on the CPU, so what is tested locally is what serves in the cloud. Pin your own per model.
DEFAULT_ENGINE_IMAGE: Final = "vllm/vllm-openai:v0.32.0"


def _overrides(
    value: dict[str, Any],
    model: type[BaseModel],
    *,
    wired: frozenset[str],
    what: str,
    required: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """``value`` overrides fields of ``model`` that the stack does not wire; types and bounds are
    ``model``'s own."""
    known = set(model.model_fields) - wired
    if unknown := set(value) - known:
        raise ValueError(f"unknown {what} {sorted(unknown)}; known: {sorted(known)}")
    model.model_validate({**(required or {}), **value})
    return value


class _Strict(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class ModelConfig(_Strict):
    """One model the deployment serves: its own work queue, GPU service and scaling."""

    #: The name clients put in ``body.model`` (and vLLM's ``--served-model-name``).
    name: Annotated[str, Field(min_length=1)]
    #: The batch endpoints this model answers (``Settings.models[name].endpoints``): a chat model
    #: serves chat, completions and responses, an embedding model ``["/v1/embeddings", "/v1/score",
    #: "/v1/rerank"]`` (or only some of them: a batch may target only the endpoints listed here).
    endpoints: Annotated[tuple[str, ...], Field(min_length=1)] = DEFAULT_MODEL_ENDPOINTS
    #: Hugging Face id or path the engine loads; defaults to ``name``.
    weights: str | None = None
    #: The vLLM OpenAI server image the GPU image is built on (``gpu_worker/Dockerfile`` VLLM_IMAGE).
    engine_image: str = DEFAULT_ENGINE_IMAGE
    #: Extra arguments for ``vllm serve`` (e.g. ``["--max-model-len", "8192"]``); no whitespace
    #: inside one argument (the entrypoint splits ENGINE_ARGS on whitespace).
    engine_args: tuple[str, ...] = ()
    #: Secrets Manager secret (its complete ARN) holding a Hugging Face token, for gated weights.
    hf_token_secret_arn: Annotated[str, Field(pattern=r"^arn:aws[a-z-]*:secretsmanager:")] | None = None
    #: EC2 GPU instance type of the capacity provider (x86_64 with NVIDIA GPUs: g4dn, g5, g6, p4d...).
    #: The task reserves no CPU, so its vCPUs are the instance's: a chat model needs about 2 beside
    #: its GPU (vLLM's engine core, its API server, one worker), which 4 vCPUs hold; short embeddings
    #: at a fast GPU's rate need many more (vLLM's ``--api-server-count`` in ``engine_args``, fewer
    #: checkpoints): docs/benchmarks.md, "Worker ceiling", "What an H100 needs beside it".
    instance_type: str = "g6.xlarge"
    #: GPUs per task (= per instance: one engine per instance).
    gpu_count: Annotated[int, Field(ge=1)] = 1
    #: Memory the task reserves on the instance (soft limit; it may use more if the instance has it).
    memory_reservation_mib: Annotated[int, Field(ge=512)] = 8192
    #: /dev/shm for the engine (PyTorch and NCCL use it; vLLM asks for a large one).
    shared_memory_mib: Annotated[int, Field(ge=64)] = 4096
    #: The instance's root volume (gp3, encrypted): the image plus the model weight cache.
    volume_gib: Annotated[int, Field(ge=30, le=16384)] = 200
    #: Instances (one engine task each) the service scales between; 0 = idle at zero cost.
    min_instances: Annotated[int, Field(ge=0)] = 0
    max_instances: Annotated[int, Field(ge=1)] = 1
    #: Spot capacity beside On-Demand: tasks go to a Spot and an On-Demand capacity provider by
    #: ``spot_weight`` : 1, after the first ``on_demand_base`` tasks, which always run On-Demand.
    spot: bool = False
    spot_weight: Annotated[int, Field(ge=1)] = 3
    on_demand_base: Annotated[int, Field(ge=0)] = 0
    #: Work messages (chunks) waiting or running per task that the service scales to hold.
    backlog_per_task: Annotated[int, Field(ge=1)] = 20
    #: Minutes the work queue must stay empty before the service scales in to ``min_instances``.
    idle_minutes: Annotated[int, Field(ge=1, le=1440)] = 15
    #: Overrides of the worker's ``WorkerConfig`` (gpu_worker/config.py), e.g. ``{max_in_flight: 512,
    #: drain_seconds: 120}``; they become ``WORKER_<FIELD>`` in the container.
    worker: dict[str, Any] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _bounds(self) -> Self:
        if self.max_instances < self.min_instances:
            raise ValueError(f"model {self.name!r}: max_instances < min_instances")
        if self.spot and self.on_demand_base > self.max_instances:
            raise ValueError(f"model {self.name!r}: on_demand_base > max_instances")
        return self

    @field_validator("engine_args")
    @classmethod
    def _one_word_each(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        if any(not arg or any(c.isspace() for c in arg) for arg in value):
            raise ValueError("engine_args: one non-empty argument per item, no whitespace inside one")
        return value

    @field_validator("worker")
    @classmethod
    def _worker_fields(cls, value: dict[str, Any]) -> dict[str, Any]:
        return _overrides(value, WorkerConfig, wired=_WIRED_WORKER, what="worker settings")

    def worker_config(self) -> WorkerConfig:
        """The worker's configuration in the container (what ``WorkerConfig.from_env`` will read)."""
        return WorkerConfig.model_validate({**self.worker, "model": self.name})

    def worker_env(self) -> dict[str, str]:
        """``WORKER_*`` variables for this model's overrides (and its model name)."""
        values = {**self.worker, "model": self.name}
        return {f"WORKER_{k.upper()}": str(v) for k, v in sorted(values.items())}


class ThrottleConfig(_Strict):
    """API Gateway stage throttling (token bucket, per stage across all clients)."""

    rate_limit: Annotated[float, Field(gt=0)] = 50.0
    burst_limit: Annotated[int, Field(gt=0)] = 100


_SubnetId = Annotated[str, Field(pattern=r"^subnet-([0-9a-f]{8}|[0-9a-f]{17})$")]


class NetworkConfig(_Strict):
    """An existing VPC for the GPU instances (default: the stack creates one with public subnets
    and no NAT gateway). Given by ids, so synth looks nothing up."""

    vpc_id: Annotated[str, Field(pattern=r"^vpc-([0-9a-f]{8}|[0-9a-f]{17})$")]
    #: The subnets the instances launch in, and their availability zones (same order).
    subnet_ids: Annotated[tuple[_SubnetId, ...], Field(min_length=1)]
    availability_zones: Annotated[tuple[str, ...], Field(min_length=1)]
    #: Give instances public IPs (public subnets without NAT); false for private subnets with a
    #: NAT gateway or VPC endpoints. The instances need egress to ECR, the AWS APIs and the weights.
    public_ip: bool = False

    @model_validator(mode="after")
    def _same_length(self) -> Self:
        if len(self.subnet_ids) != len(self.availability_zones):
            raise ValueError("network: one availability zone per subnet id")
        return self


class DomainConfig(_Strict):
    """An optional custom domain for the API (a regional ACM certificate in the stack's region)."""

    name: Annotated[str, Field(min_length=1)]
    certificate_arn: Annotated[str, Field(pattern=r"^arn:aws[a-z-]*:acm:")]


#: Fargate's CPU units -> the memory sizes (MiB) each allows (the task sizes Fargate accepts).
FARGATE_SIZES: Final = {
    256: (512, 1024, 2048),
    512: tuple(range(1024, 4097, 1024)),
    1024: tuple(range(2048, 8193, 1024)),
    2048: tuple(range(4096, 16385, 1024)),
    4096: tuple(range(8192, 30721, 1024)),
}


class StreamFrontConfig(_Strict):
    """The streaming front (infra/constructs/stream_front.py): one CloudFront distribution in front
    of the API, whose ``/v1/files``, ``/v1/files/*/content`` and ``/v1/uploads/*/parts`` go to a
    small Fargate service (``python -m functions.stream_front``) behind an internal load balancer,
    so files of up to 512 MB and 64 MB Uploads parts pass with the unchanged SDK.
    ``stream_front: false`` turns the whole path off: no distribution, no service, nothing that
    bills while idle, and the API Gateway URL with its 10 MB request quota (Uploads parts of at
    most 4 MiB). (``null`` means the same in a config file or a JSON string, but CDK drops null
    values from context objects, so in ``cdk.json`` or ``-c`` objects only ``false`` works.)"""

    #: Tasks the service keeps (at least one: the front has no scale-from-zero) and may scale out
    #: to on CPU (target tracking).
    min_tasks: Annotated[int, Field(ge=1, le=100)] = 1
    max_tasks: Annotated[int, Field(ge=1, le=100)] = 2
    #: The task's size: 0.5 vCPU / 1 GiB holds about a hundred uploads at once (one 8 MiB S3 part
    #: each). Fargate's valid pairs only (``FARGATE_SIZES``).
    cpu: Literal[256, 512, 1024, 2048, 4096] = 512
    memory_mib: int = 1024
    #: The task's CPU architecture (the image is built for it at deploy): x86_64 builds on any
    #: Docker host; arm64 (Graviton) costs about 20% less per hour but needs a host that builds
    #: arm64 images (Apple silicon, Graviton, or QEMU emulation).
    architecture: Literal["x86_64", "arm64"] = "x86_64"
    #: CloudFront's response timeout for the front's origin (seconds). Above 60 needs a raise of
    #: the "Response timeout per origin" quota first.
    origin_read_timeout_seconds: Annotated[int, Field(ge=1, le=180)] = 60
    #: The ACM certificate (in us-east-1: CloudFront only reads certificates there) of
    #: ``domain.name``; required when ``domain`` is set: the domain is then the distribution's.
    certificate_arn: Annotated[str, Field(pattern=r"^arn:aws[a-z-]*:acm:us-east-1:\d{12}:certificate/")] | None = None
    #: A WAFv2 web ACL of scope CLOUDFRONT (created in us-east-1) for the distribution
    #: (``web_acl_arn`` is REGIONAL: API Gateway's). Its body-size rules must let uploads through.
    web_acl_arn: Annotated[str, Field(pattern=r"^arn:aws[a-z-]*:wafv2:us-east-1:\d{12}:global/webacl/")] | None = None
    #: The id of the managed prefix list ``com.amazonaws.global.cloudfront.origin-facing`` in the
    #: stack's region, for a region the construct's table does not know
    #: (``aws ec2 describe-managed-prefix-lists --filters Name=prefix-list-name,Values=com.amazonaws.global.cloudfront.origin-facing``).
    cloudfront_prefix_list_id: Annotated[str, Field(pattern=r"^pl-([0-9a-f]{8}|[0-9a-f]{17})$")] | None = None
    #: Two or more availability zones (names) for the front's VPC, instead of the region's first
    #: two: CloudFront VPC origins are not offered in every zone (e.g. use1-az3).
    availability_zones: Annotated[tuple[str, ...], Field(min_length=2)] | None = None
    #: CloudFront's price class (which edge locations serve the distribution).
    price_class: Literal["PriceClass_100", "PriceClass_200", "PriceClass_All"] = "PriceClass_All"

    @model_validator(mode="after")
    def _sizes(self) -> Self:
        if self.max_tasks < self.min_tasks:
            raise ValueError("stream_front: max_tasks < min_tasks")
        if self.memory_mib not in FARGATE_SIZES[self.cpu]:
            raise ValueError(f"stream_front: cpu {self.cpu} takes memory_mib in {list(FARGATE_SIZES[self.cpu])}")
        return self


class AuditObjectLockConfig(_Strict):
    """The Object Lock bucket of the audit chains' WORM copies and signed checkpoints (docs/audit.md,
    infra/constructs/audit.py): a default retention on every object version written there."""

    #: ``governance``: a principal with ``s3:BypassGovernanceRetention`` can still delete early;
    #: ``compliance``: nobody can, the root user included, until the retention ends.
    mode: Literal["governance", "compliance"] = "governance"
    retention_days: Annotated[int, Field(ge=1, le=36_500)] = 365


def _default_models() -> tuple[ModelConfig, ...]:
    return (ModelConfig(name="Qwen/Qwen2.5-7B-Instruct", engine_args=("--max-model-len", "8192")),)


class DeployConfig(_Strict):
    """Everything a deployment chooses. Defaults give a small, safe, scale-to-zero deployment."""

    #: Account and region to pin the stack to; both unset = an environment-agnostic stack (the CLI's
    #: credentials and region decide at deploy time). Synth never calls AWS either way.
    account: Annotated[str, Field(pattern=r"^\d{12}$")] | None = None
    region: str | None = None
    #: Models to serve (the GPU worker construct builds one service per model).
    models: tuple[ModelConfig, ...] = Field(default_factory=_default_models)
    #: Overrides of ``Settings`` limits (field name -> value), e.g. ``{"max_batch_file_bytes": 104857600}``.
    limits: dict[str, Any] = Field(default_factory=dict)
    #: Batch ``completion_window`` values the API accepts; unset = the code's default (OpenAI's "24h").
    completion_windows: tuple[str, ...] | None = None
    throttle: ThrottleConfig = ThrottleConfig()
    #: How long API Gateway caches the authorizer's answer per key (0 disables; max 3600).
    #: A revoked key keeps working for up to this long.
    authorizer_cache_seconds: Annotated[int, Field(ge=0, le=3600)] = 300
    log_retention_days: int = 30
    #: Days a batch's working data (everything under ``batches/<tenant>/<batch>/``: input snapshot,
    #: chunk manifest, result parts, checkpoints) is kept after the batch ends, at least; the
    #: bucket's lifecycle removes each object ``batch_data_retention_days`` plus the longest a batch
    #: can stay open after it was written (infra/constructs/storage.py, docs/deploy.md "Retention").
    #: The batch's record and its output and error files are not batch data: they keep their own expiry.
    batch_data_retention_days: Annotated[int, Field(ge=0, le=3650)] = 7
    #: What happens to the bucket, table and log groups when the stack is deleted. ``destroy`` also
    #: empties the bucket on delete (for dev stacks); ``retain`` keeps customer data (default).
    removal_policy: Literal["retain", "destroy"] = "retain"
    #: SNS topic the alarms notify (none: alarms only show in CloudWatch).
    alarm_topic_arn: Annotated[str, Field(pattern=r"^arn:aws[a-z-]*:sns:")] | None = None
    #: WAFv2 web ACL (REGIONAL scope) to associate with the API stage.
    web_acl_arn: Annotated[str, Field(pattern=r"^arn:aws[a-z-]*:wafv2:")] | None = None
    #: A custom domain for the API. With ``stream_front`` on it is the distribution's (its
    #: ``certificate_arn``, in us-east-1); with it off, API Gateway's (this regional certificate).
    domain: DomainConfig | None = None
    #: The large-body path (``StreamFrontConfig``): on by default; ``false`` = API Gateway only.
    stream_front: StreamFrontConfig | None = StreamFrontConfig()
    #: Where the GPU instances run (default: a new VPC, public subnets, no NAT: nothing idles).
    network: NetworkConfig | None = None
    #: Governance: tenant policies read and enforced, the TENANTS partition granted.
    #: False switches the subsystem off (``Settings.governance``, docs/governance.md "The switch").
    governance: bool = True
    #: The Object Lock bucket that anchors the audit chains (docs/audit.md): on whenever governance
    #: is (the default: governance mode, 365 days); refused as null with governance on.
    audit_object_lock: AuditObjectLockConfig | None = AuditObjectLockConfig()
    #: Tags on every resource of the stack.
    tags: dict[str, str] = Field(default_factory=dict)

    @field_validator("limits")
    @classmethod
    def _limits_are_settings(cls, value: dict[str, Any]) -> dict[str, Any]:
        required = {"table_name": "-", "bucket_name": "-"}
        return _overrides(value, Settings, wired=_WIRED_SETTINGS, what="limits", required=required)

    @model_validator(mode="after")
    def _audit_anchored(self) -> Self:
        if self.governance and self.audit_object_lock is None:
            raise ValueError(
                "audit_object_lock: governance keeps audit chains, anchored in an Object Lock bucket: "
                "it cannot be null while governance is on"
            )
        return self

    @field_validator("log_retention_days")
    @classmethod
    def _retention(cls, value: int) -> int:
        if value not in LOG_RETENTION_DAYS:
            raise ValueError(f"log_retention_days must be one of {sorted(LOG_RETENTION_DAYS)}")
        return value

    @field_validator("models")
    @classmethod
    def _unique_models(cls, value: tuple[ModelConfig, ...]) -> tuple[ModelConfig, ...]:
        names = [m.name for m in value]
        if len(names) != len(set(names)):
            raise ValueError("model names must be unique")
        return value

    @field_validator("stream_front", mode="before")
    @classmethod
    def _off(cls, value: Any) -> Any:
        # ``false`` (or ``null``) is "off": CDK context objects lose their null values on the way
        # in (jsii), so ``false`` is the spelling that survives every way a config arrives.
        return None if value is False else value

    @model_validator(mode="after")
    def _domain_certificates(self) -> Self:
        front = self.stream_front
        if front is not None and self.domain is not None and front.certificate_arn is None:
            raise ValueError(
                "stream_front.certificate_arn: with stream_front on, the domain is served by CloudFront, "
                "which needs its certificate in us-east-1 (or set stream_front: false to keep the domain "
                "on API Gateway)"
            )
        if front is not None and self.domain is None and front.certificate_arn is not None:
            raise ValueError("stream_front.certificate_arn is the certificate of domain.name: set domain too")
        return self

    @property
    def api_domain(self) -> DomainConfig | None:
        """The custom domain API Gateway serves: ``domain`` when the streaming front is off (with
        it on, the distribution serves the domain and API Gateway is its origin)."""
        return self.domain if self.stream_front is None else None

    @model_validator(mode="after")
    def _pinned_together(self) -> Self:
        if (self.account is None) != (self.region is None):
            raise ValueError("set both account and region, or neither (environment-agnostic stack)")
        return self

    @model_validator(mode="after")
    def _endpoints_allowed(self) -> Self:
        allowed = self.limits.get("allowed_endpoints", core_limits.DEFAULT_ENDPOINTS)
        for model in self.models:
            if extra := set(model.endpoints) - set(allowed):
                raise ValueError(f"model {model.name!r}: endpoints {sorted(extra)} are not in allowed_endpoints")
        return self

    def settings(
        self,
        *,
        table_name: str,
        bucket_name: str,
        queue_urls: Mapping[str, str] | None = None,
        state_machine_arn: str = "",
        event_bus_name: str = "",
    ) -> Settings:
        """The settings every function and the worker read (``Settings.to_env()``): resource names,
        each model's endpoints and work queue, the workflow, and the limits. Values are usually
        CDK tokens."""
        urls = queue_urls or {}
        values: dict[str, Any] = {
            "table_name": table_name,
            "bucket_name": bucket_name,
            "models": {
                m.name: ModelRoute(endpoints=m.endpoints, queue_url=urls.get(m.name, ""), max_engines=m.max_instances)
                for m in self.models
            },
            "state_machine_arn": state_machine_arn,
            **({"event_bus_name": event_bus_name} if event_bus_name else {}),
            "governance": self.governance,
            **self.limits,
        }
        if self.completion_windows is not None:
            values["completion_windows"] = self.completion_windows
        return Settings(**values)


def parse(raw: Any) -> DeployConfig:
    """A config from a context value: None, a mapping, a JSON string, or a JSON/YAML file path."""
    if raw is None or raw == "":
        return DeployConfig()
    if isinstance(raw, dict):
        return DeployConfig.model_validate(raw)
    if not isinstance(raw, str):
        raise TypeError(f"context {CONTEXT_KEY!r} must be a file path or an object, not {type(raw).__name__}")
    if raw.lstrip().startswith("{"):
        return DeployConfig.model_validate_json(raw)
    return load_file(Path(raw))


def load_file(path: Path) -> DeployConfig:
    text = path.read_text()
    if path.suffix.lower() in (".yaml", ".yml"):
        import yaml  # only needed for YAML configs

        data = yaml.safe_load(text) or {}
    else:
        data = json.loads(text)
    return DeployConfig.model_validate(data)


def from_context(node: Any) -> DeployConfig:
    """The config a CDK app was given (``node`` is the app's construct node)."""
    return parse(node.try_get_context(CONTEXT_KEY))
