"""Deployment settings, read from the environment once per process.

Every setting is a field here; its environment variable is ``BATCHAPI_<FIELD>``. The CDK stack
and the local deployment produce the environment with ``Settings.to_env()``, so the names exist
in one place only. Logic receives a ``Settings`` object and never reads ``os.environ``.
"""

import os
from collections.abc import Mapping
from functools import cache
from typing import Any, Self

from pydantic import BaseModel, ConfigDict, Field

from . import limits

ENV_PREFIX = "BATCHAPI_"


class Settings(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    table_name: str
    bucket_name: str
    max_batch_file_bytes: int = Field(default=limits.DEFAULT_MAX_BATCH_FILE_BYTES, gt=0)
    max_file_bytes: int = Field(default=limits.DEFAULT_MAX_FILE_BYTES, gt=0)
    inline_content_limit: int = Field(default=limits.DEFAULT_INLINE_CONTENT_LIMIT, ge=0)
    presign_seconds: int = Field(default=limits.DEFAULT_PRESIGN_SECONDS, gt=0)
    max_upload_part_bytes: int = Field(default=limits.MAX_UPLOAD_PART_BYTES, gt=0)

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> Self:
        values: dict[str, Any] = {}
        for name in cls.model_fields:
            raw = env.get(ENV_PREFIX + name.upper())
            if raw is not None:
                values[name] = raw
        return cls.model_validate(values)

    def to_env(self) -> dict[str, str]:
        return {ENV_PREFIX + name.upper(): str(value) for name, value in self.model_dump().items()}


@cache
def current() -> Settings:
    """The process's settings (handlers call this once, at import or first use)."""
    return Settings.from_env(os.environ)
