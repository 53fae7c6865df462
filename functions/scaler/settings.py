"""The scaler's configuration: ``SCALER_TABLE_NAME`` and ``SCALER_SERVICES`` (JSON), written by the
worker construct (infra/constructs/worker.py) from the deployment config."""

from pydantic_settings import SettingsConfigDict

from functions.core.settings import EnvSettings

from .logic import ScaledService


class ScalerSettings(EnvSettings):
    model_config = SettingsConfigDict(env_prefix="SCALER_")

    table_name: str
    services: tuple[ScaledService, ...] = ()
