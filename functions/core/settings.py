"""Deployment settings, read from the environment once per process.

Every setting is a field here; its environment variable is ``BATCHAPI_<FIELD>``. The CDK stack
and the local deployment produce the environment with ``Settings.to_env()``, so the names exist
in one place only. Logic receives a ``Settings`` object and never reads ``os.environ``.

One loader for every process that reads its configuration from the environment: ``EnvSettings``
(pydantic-settings), subclassed by ``Settings`` (the Lambdas and the worker, ``BATCHAPI_``), the
worker's ``WorkerConfig`` (``WORKER_``) and batchctl's ``CliSettings`` (``BATCHAPI_``). The one
rule: a field is ``<PREFIX><FIELD>``; a string or number is read as it is, anything else (lists,
tuples, mappings, models) is JSON; a class decides whether an empty value counts as unset
(``env_ignore_empty``). ``from_env(mapping)`` reads a given mapping (``os.environ`` in ``main``s,
a dict in tests); constructing a class directly reads nothing from the environment.
"""

import json
import os
from collections.abc import Mapping
from functools import cache
from typing import Self

from pydantic import BaseModel, ConfigDict, Field
from pydantic_settings import BaseSettings, EnvSettingsSource, PydanticBaseSettingsSource, SettingsConfigDict
from pydantic_settings.sources.utils import parse_env_vars

from . import limits
from .work import Bounds

ENV_PREFIX = "BATCHAPI_"


class _MappingSource(EnvSettingsSource):
    """pydantic-settings' environment source over a given mapping instead of ``os.environ``."""

    def __init__(self, settings_cls: type[BaseSettings], env: Mapping[str, str]):
        self._env = env
        super().__init__(settings_cls)

    def _load_env_vars(self) -> Mapping[str, str | None]:
        return parse_env_vars(self._env, self.case_sensitive, self.env_ignore_empty, self.env_parse_none_str)


class EnvSettings(BaseSettings):
    """Base of every settings class read from the environment (see the module docstring)."""

    model_config = SettingsConfigDict(frozen=True, extra="forbid", case_sensitive=False)

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        # Built directly (tests, the stack), a settings object is exactly its arguments.
        return (init_settings,)

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> Self:
        """The settings ``env`` gives (fields it does not name keep their defaults). Raises
        pydantic's ValidationError naming the field of an invalid value, or
        pydantic_settings.SettingsError naming the variable of invalid JSON."""
        return cls(**_MappingSource(cls, env)())

    @classmethod
    def env_name(cls, field: str) -> str:
        return cls.model_config.get("env_prefix", "").upper() + field.upper()


class ModelRoute(BaseModel):
    """A model this deployment serves: the endpoints it answers and its work queue."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    endpoints: tuple[str, ...]
    queue_url: str = ""
    #: The most engines (GPU tasks) the model's service runs: ingest cuts a big batch into at
    #: least that many chunks (``ingest.logic.chunk_lines``).
    max_engines: int = Field(default=1, gt=0)


class Settings(EnvSettings):
    model_config = SettingsConfigDict(env_prefix=ENV_PREFIX)

    table_name: str
    bucket_name: str
    max_batch_file_bytes: int = Field(default=limits.DEFAULT_MAX_BATCH_FILE_BYTES, gt=0)
    max_file_bytes: int = Field(default=limits.DEFAULT_MAX_FILE_BYTES, gt=0)
    inline_content_limit: int = Field(default=limits.DEFAULT_INLINE_CONTENT_LIMIT, ge=0)
    presign_seconds: int = Field(default=limits.DEFAULT_PRESIGN_SECONDS, gt=0)
    max_upload_part_bytes: int = Field(default=limits.MAX_UPLOAD_PART_BYTES, gt=0)
    #: The queue of the upload assembler (docs/uploads.md): uploads larger than
    #: limits.UPLOAD_INLINE_ASSEMBLY_BYTES are assembled there, not in the API request.
    assembly_queue_url: str = ""
    # --- Batches ---
    #: Endpoints a batch may target (each also needs a model that serves it: ``served_endpoints``).
    allowed_endpoints: tuple[str, ...] = limits.DEFAULT_ENDPOINTS
    #: The hosts an audio line's ``http(s)`` ``file_url`` may be fetched from (exact host names, as
    #: lowercase; an IP literal only if listed): empty, only ``data:`` URLs are accepted
    #: (docs/api.md, "Audio lines"; docs/worker.md, "Audio fetch").
    allowed_media_domains: tuple[str, ...] = ()
    #: Completion windows a batch may ask for ("24h" as OpenAI; a local deployment adds short ones).
    completion_windows: tuple[str, ...] = limits.DEFAULT_COMPLETION_WINDOWS
    #: Served models by name (the `model` in each request line).
    models: dict[str, ModelRoute] = Field(default_factory=dict)
    max_batch_lines: int = Field(default=limits.DEFAULT_MAX_BATCH_LINES, gt=0)
    max_line_bytes: int = Field(default=limits.DEFAULT_MAX_LINE_BYTES, gt=0)
    #: The most work one line may ask (``n``, inputs, output tokens; functions/core/work.py): every
    #: tenant's lines, a tenant's policy may set lower bounds.
    line_bounds: Bounds = Field(default_factory=Bounds)
    chunk_max_lines: int = Field(default=limits.DEFAULT_CHUNK_MAX_LINES, gt=0)
    chunk_max_bytes: int = Field(default=limits.DEFAULT_CHUNK_MAX_BYTES, gt=0)
    #: How long a cancelled or expired batch waits for chunks already running before finalizing.
    drain_grace_seconds: int = Field(default=limits.DEFAULT_DRAIN_GRACE_SECONDS, ge=0)
    #: How often the workflow checks whether running chunks have finished while draining.
    drain_poll_seconds: int = Field(default=limits.DEFAULT_DRAIN_POLL_SECONDS, ge=0)
    #: How long the workflow waits for a signal before it reads the batch itself (lost signals).
    reconcile_seconds: int = Field(default=limits.DEFAULT_RECONCILE_SECONDS, gt=0)
    #: Liveness (docs/lifecycle.md): the sweeper's period, and its deadlines for a batch stuck
    #: validating, not enqueued, or open past its expiry.
    sweep_seconds: int = Field(default=limits.DEFAULT_SWEEP_SECONDS, gt=0)
    validating_timeout_seconds: int = Field(default=limits.DEFAULT_VALIDATING_TIMEOUT_SECONDS, gt=0)
    enqueue_grace_seconds: int = Field(default=limits.DEFAULT_ENQUEUE_GRACE_SECONDS, ge=0)
    expiry_grace_seconds: int = Field(default=limits.DEFAULT_EXPIRY_GRACE_SECONDS, ge=0)
    state_machine_arn: str = ""
    #: Where the batch lifecycle events are published: the stack's own bus (``names.event_bus_name``,
    #: only the stack's publishers may put events on it), or the local deployment's of that name.
    event_bus_name: str = "default"
    #: Webhooks (docs/webhooks.md): the queue of events and deliveries; plain http to a loopback
    #: host is allowed only where this is set (the local deployment), never on AWS.
    webhook_queue_url: str = ""
    #: Where a delivery whose schedule is spent goes (the webhook queue's dead-letter queue).
    webhook_dead_letter_queue_url: str = ""
    webhook_allow_loopback_http: bool = False
    #: Governance (docs/governance.md "The switch"): off, the deployment reads no tenant
    #: policy, enforces and audits nothing (the stores get the no-op policy store) and the stack
    #: grants nothing on the TENANTS partition. CDK: the config's ``governance``; local: on.
    governance: bool = True
    #: How long the API keeps a tenant's policy between reads for its per-request checks
    #: (``requests_per_minute``, disabled): a policy change reaches every API process within this.
    policy_cache_seconds: float = Field(default=limits.DEFAULT_POLICY_CACHE_SECONDS, ge=0)
    #: The audit queue (FIFO): every writer sends its audit intents there (docs/audit.md); empty
    #: with governance off (nothing is audited).
    audit_queue_url: str = ""
    #: The audit appender's own settings: the Object Lock bucket it copies every record and signs
    #: every checkpoint into, and its signing key: a KMS key (ECC_NIST_P256) on AWS, or, in the
    #: local deployment only, a PEM key file (functions.core.signing.FileSigner).
    audit_bucket_name: str = ""
    audit_signing_key_id: str = ""
    audit_local_key_file: str = ""

    def served_endpoints(self) -> tuple[str, ...]:
        """The endpoints a batch of this deployment may target: those allowed that at least one
        served model answers (in ``allowed_endpoints`` order). Which model serves which endpoint
        is chosen per deployment (``models[name].endpoints``)."""
        served = {endpoint for route in self.models.values() for endpoint in route.endpoints}
        return tuple(endpoint for endpoint in self.allowed_endpoints if endpoint in served)

    def to_env(self) -> dict[str, str]:
        return {
            ENV_PREFIX + name.upper(): value if isinstance(value, str) else json.dumps(value)
            for name, value in self.model_dump(mode="json").items()
        }


@cache
def current() -> Settings:
    """The process's settings (handlers call this once, at import or first use)."""
    return Settings.from_env(os.environ)
