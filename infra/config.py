"""The one deployment config: what an infra team chooses per deployment, typed and validated.

Every field has a default, so ``cdk synth`` works with no config at all. A deployment gives its
config through CDK context under ``CONTEXT_KEY``:

- a path to a JSON or YAML file: ``cdk deploy -c batchapi=deploy.yaml``
  (relative paths are resolved from the current directory, i.e. the repository root);
- or the config inline, as an object in ``cdk.json``'s ``"context": {"batchapi": {...}}``
  or as a JSON string on the command line.

Names and limits that the code shares are not redefined here: ``limits`` overrides fields of
``functions.core.settings.Settings`` (the same names the Lambdas read), validated against it.
"""

import json
from pathlib import Path
from typing import Annotated, Any, Final, Literal, Self

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from functions.core.settings import Settings

#: The CDK context key that carries the config (a file path or an object).
CONTEXT_KEY: Final = "batchapi"

#: The values CloudWatch Logs accepts for RetentionInDays.
LOG_RETENTION_DAYS: Final = frozenset(
    (1, 3, 5, 7, 14, 30, 60, 90, 120, 150, 180, 365, 400, 545, 731, 1096, 1827, 2192, 2557, 2922, 3288, 3653)
)

#: Settings fields the stack wires from its own resources (or from other config fields); every
#: other Settings field is a limit a config may override.
_WIRED_SETTINGS: Final = frozenset(
    {"table_name", "bucket_name", "models", "state_machine_arn", "event_bus_name", "completion_windows"}
)

#: The engine image the GPU worker runs by default: the same vLLM release the local deployment runs
#: on the CPU, so what is tested locally is what serves in the cloud. Pin your own per model.
DEFAULT_ENGINE_IMAGE: Final = "vllm/vllm-openai:v0.32.0"


class _Strict(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class ModelConfig(_Strict):
    """One model the deployment serves: its own work queue and GPU service (issue 4's worker)."""

    #: The name clients put in ``body.model`` (and vLLM's ``--served-model-name``).
    name: Annotated[str, Field(min_length=1)]
    #: Hugging Face id or path the engine loads; defaults to ``name``.
    weights: str | None = None
    engine_image: str = DEFAULT_ENGINE_IMAGE
    #: Extra arguments for ``vllm serve`` (e.g. ``["--max-model-len", "8192"]``).
    engine_args: tuple[str, ...] = ()
    #: EC2 GPU instance type of the capacity provider.
    instance_type: str = "g6.xlarge"
    gpu_count: Annotated[int, Field(ge=1)] = 1
    #: Instances (one engine task each) the service scales between; 0 = idle at zero cost.
    min_instances: Annotated[int, Field(ge=0)] = 0
    max_instances: Annotated[int, Field(ge=1)] = 1
    #: Spot capacity (with On-Demand fallback) instead of On-Demand only.
    spot: bool = False

    @model_validator(mode="after")
    def _bounds(self) -> Self:
        if self.max_instances < self.min_instances:
            raise ValueError(f"model {self.name!r}: max_instances < min_instances")
        return self


class ThrottleConfig(_Strict):
    """API Gateway stage throttling (token bucket, per stage across all clients)."""

    rate_limit: Annotated[float, Field(gt=0)] = 50.0
    burst_limit: Annotated[int, Field(gt=0)] = 100


class DomainConfig(_Strict):
    """An optional custom domain for the API (a regional ACM certificate in the stack's region)."""

    name: Annotated[str, Field(min_length=1)]
    certificate_arn: Annotated[str, Field(pattern=r"^arn:aws[a-z-]*:acm:")]


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
    #: What happens to the bucket, table and log groups when the stack is deleted. ``destroy`` also
    #: empties the bucket on delete (for dev stacks); ``retain`` keeps customer data (default).
    removal_policy: Literal["retain", "destroy"] = "retain"
    #: SNS topic the alarms notify (none: alarms only show in CloudWatch).
    alarm_topic_arn: Annotated[str, Field(pattern=r"^arn:aws[a-z-]*:sns:")] | None = None
    #: WAFv2 web ACL (REGIONAL scope) to associate with the API stage.
    web_acl_arn: Annotated[str, Field(pattern=r"^arn:aws[a-z-]*:wafv2:")] | None = None
    domain: DomainConfig | None = None
    #: Tags on every resource of the stack.
    tags: dict[str, str] = Field(default_factory=dict)

    @field_validator("limits")
    @classmethod
    def _limits_are_settings(cls, value: dict[str, Any]) -> dict[str, Any]:
        known = set(Settings.model_fields) - _WIRED_SETTINGS
        if unknown := set(value) - known:
            raise ValueError(f"unknown limits {sorted(unknown)}; known: {sorted(known)}")
        Settings(table_name="-", bucket_name="-", **value)  # validates types and bounds
        return value

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

    @model_validator(mode="after")
    def _pinned_together(self) -> Self:
        if (self.account is None) != (self.region is None):
            raise ValueError("set both account and region, or neither (environment-agnostic stack)")
        return self

    def settings(self, *, table_name: str, bucket_name: str) -> Settings:
        """The Lambdas' settings for this deployment (resource names are usually CDK tokens)."""
        values: dict[str, Any] = {"table_name": table_name, "bucket_name": bucket_name, **self.limits}
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
