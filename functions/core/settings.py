"""Deployment settings, read from the environment once per process.

Every setting is a field here; its environment variable is ``BATCHAPI_<FIELD>``. The CDK stack
and the local deployment produce the environment with ``Settings.to_env()``, so the names exist
in one place only. Logic receives a ``Settings`` object and never reads ``os.environ``.
"""

import json
import os
from collections.abc import Mapping
from functools import cache
from typing import Any, Self

from pydantic import BaseModel, ConfigDict, Field

from . import limits

ENV_PREFIX = "BATCHAPI_"


class ModelRoute(BaseModel):
    """A model this deployment serves: the endpoints it answers and its work queue."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    endpoints: tuple[str, ...]
    queue_url: str = ""


class Settings(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    table_name: str
    bucket_name: str
    max_batch_file_bytes: int = Field(default=limits.DEFAULT_MAX_BATCH_FILE_BYTES, gt=0)
    max_file_bytes: int = Field(default=limits.DEFAULT_MAX_FILE_BYTES, gt=0)
    inline_content_limit: int = Field(default=limits.DEFAULT_INLINE_CONTENT_LIMIT, ge=0)
    presign_seconds: int = Field(default=limits.DEFAULT_PRESIGN_SECONDS, gt=0)
    max_upload_part_bytes: int = Field(default=limits.MAX_UPLOAD_PART_BYTES, gt=0)
    # --- Batches ---
    #: Endpoints a batch may target (each also needs a model that serves it).
    allowed_endpoints: tuple[str, ...] = limits.DEFAULT_ENDPOINTS
    #: Completion windows a batch may ask for ("24h" as OpenAI; a local deployment adds short ones).
    completion_windows: tuple[str, ...] = limits.DEFAULT_COMPLETION_WINDOWS
    #: Served models by name (the `model` in each request line).
    models: dict[str, ModelRoute] = Field(default_factory=dict)
    max_batch_lines: int = Field(default=limits.DEFAULT_MAX_BATCH_LINES, gt=0)
    max_line_bytes: int = Field(default=limits.DEFAULT_MAX_LINE_BYTES, gt=0)
    chunk_max_lines: int = Field(default=limits.DEFAULT_CHUNK_MAX_LINES, gt=0)
    chunk_max_bytes: int = Field(default=limits.DEFAULT_CHUNK_MAX_BYTES, gt=0)
    #: How long a cancelled or expired batch waits for chunks already running before finalizing.
    drain_grace_seconds: int = Field(default=limits.DEFAULT_DRAIN_GRACE_SECONDS, ge=0)
    #: How often the workflow checks whether running chunks have finished while draining.
    drain_poll_seconds: int = Field(default=limits.DEFAULT_DRAIN_POLL_SECONDS, ge=0)
    state_machine_arn: str = ""
    event_bus_name: str = "default"

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> Self:
        values: dict[str, Any] = {}
        for name, field in cls.model_fields.items():
            raw = env.get(ENV_PREFIX + name.upper())
            if raw is not None:
                values[name] = raw if field.annotation in (str, int) else json.loads(raw)
        return cls.model_validate(values)

    def to_env(self) -> dict[str, str]:
        return {
            ENV_PREFIX + name.upper(): value if isinstance(value, str) else json.dumps(value)
            for name, value in self.model_dump(mode="json").items()
        }


@cache
def current() -> Settings:
    """The process's settings (handlers call this once, at import or first use)."""
    return Settings.from_env(os.environ)
