"""The one settings loader (pydantic-settings): ``Settings`` (``BATCHAPI_``, the Lambdas and the
worker), ``WorkerConfig`` (``WORKER_``) and batchctl's ``CliSettings`` (``BATCHAPI_``).

The rule under test: ``<PREFIX><FIELD>``; strings and numbers are read as they are, lists, tuples
and mappings as JSON; ``to_env`` writes what ``from_env`` reads; an invalid value is an error that
names its field; a settings object built directly reads nothing from the process environment."""

import json

import pytest
from pydantic import ValidationError
from pydantic_settings import SettingsError

from batchctl.settings import CliSettings
from functions.core.settings import ModelRoute, Settings
from gpu_worker.config import WorkerConfig

BASE = {"BATCHAPI_TABLE_NAME": "tbl", "BATCHAPI_BUCKET_NAME": "bkt"}


def full_settings() -> Settings:
    return Settings(
        table_name="tbl",
        bucket_name="bkt",
        max_line_bytes=2048,
        completion_windows=("24h", "1h"),
        allowed_endpoints=("/v1/chat/completions", "/v1/embeddings"),
        models={
            "org/Chat-7B": ModelRoute(endpoints=("/v1/chat/completions",), queue_url="https://sqs/q1"),
            "embed": ModelRoute(endpoints=("/v1/embeddings",)),
        },
        state_machine_arn="",
        event_bus_name="bus",
    )


def error_fields(info: pytest.ExceptionInfo[ValidationError]) -> set[tuple]:
    return {tuple(e["loc"]) for e in info.value.errors()}


# --- Settings (BATCHAPI_) ---------------------------------------------------------------------
def test_to_env_from_env_round_trip() -> None:
    settings = full_settings()
    assert Settings.from_env(settings.to_env()) == settings


def test_to_env_writes_strings_and_numbers_raw_and_the_rest_as_json() -> None:
    env = full_settings().to_env()
    assert all(name.startswith("BATCHAPI_") for name in env)
    assert env["BATCHAPI_TABLE_NAME"] == "tbl"
    assert env["BATCHAPI_MAX_LINE_BYTES"] == "2048"
    assert env["BATCHAPI_STATE_MACHINE_ARN"] == ""
    assert json.loads(env["BATCHAPI_COMPLETION_WINDOWS"]) == ["24h", "1h"]
    assert json.loads(env["BATCHAPI_MODELS"]) == {
        "org/Chat-7B": {"endpoints": ["/v1/chat/completions"], "queue_url": "https://sqs/q1", "max_engines": 1},
        "embed": {"endpoints": ["/v1/embeddings"], "queue_url": "", "max_engines": 1},
    }


def test_json_fields_are_parsed_and_validated_into_their_types() -> None:
    settings = Settings.from_env(
        {
            **BASE,
            "BATCHAPI_MODELS": '{"m": {"endpoints": ["/v1/embeddings"], "queue_url": "u"}}',
            "BATCHAPI_COMPLETION_WINDOWS": '["24h", "30s"]',
        }
    )
    assert settings.models == {"m": ModelRoute(endpoints=("/v1/embeddings",), queue_url="u")}
    assert settings.completion_windows == ("24h", "30s")


def test_string_fields_are_raw_even_when_they_look_like_json_and_empty_is_a_value() -> None:
    settings = Settings.from_env({**BASE, "BATCHAPI_TABLE_NAME": '{"a": 1}', "BATCHAPI_EVENT_BUS_NAME": ""})
    assert settings.table_name == '{"a": 1}'
    assert settings.event_bus_name == ""  # set to empty, not the default "default"


def test_unset_fields_keep_their_defaults_and_other_variables_are_ignored() -> None:
    settings = Settings.from_env({**BASE, "BATCHAPI_NOT_A_FIELD": "x", "PATH": "/bin", "WORKER_MODEL": "m"})
    assert settings.max_batch_lines == 50_000  # README: too_many_tasks above 50,000 lines
    assert settings.max_line_bytes == 1024 * 1024  # README: line_too_large above 1 MiB
    assert settings.completion_windows == ("24h",)
    assert settings.event_bus_name == "default"


def test_variable_names_are_not_case_sensitive_about_the_field() -> None:
    assert Settings.from_env({"batchapi_table_name": "t", "BATCHAPI_BUCKET_NAME": "b"}).table_name == "t"


def test_an_invalid_number_names_its_field() -> None:
    with pytest.raises(ValidationError) as info:
        Settings.from_env({**BASE, "BATCHAPI_MAX_LINE_BYTES": "lots"})
    assert error_fields(info) == {("max_line_bytes",)}
    assert info.value.errors()[0]["type"] == "int_parsing"


def test_a_value_out_of_bounds_names_its_field() -> None:
    with pytest.raises(ValidationError) as info:
        Settings.from_env({**BASE, "BATCHAPI_CHUNK_MAX_LINES": "0"})
    assert error_fields(info) == {("chunk_max_lines",)}
    assert info.value.errors()[0]["type"] == "greater_than"


def test_json_of_the_wrong_shape_names_the_nested_field() -> None:
    with pytest.raises(ValidationError) as info:
        Settings.from_env({**BASE, "BATCHAPI_MODELS": '{"m": {"endpoints": ["/v1/x"], "queue": "u"}}'})
    assert error_fields(info) == {("models", "m", "queue")}
    assert info.value.errors()[0]["type"] == "extra_forbidden"


def test_invalid_json_names_its_field_and_is_a_value_error() -> None:
    with pytest.raises(SettingsError, match='field "models"') as info:
        Settings.from_env({**BASE, "BATCHAPI_MODELS": "{not json"})
    assert isinstance(info.value, ValueError)  # gpu_worker's main reports ValueErrors as config errors


def test_a_missing_required_field_names_it() -> None:
    with pytest.raises(ValidationError) as info:
        Settings.from_env({"BATCHAPI_TABLE_NAME": "t"})
    assert error_fields(info) == {("bucket_name",)}
    assert info.value.errors()[0]["type"] == "missing"


def test_built_directly_settings_read_nothing_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("BATCHAPI_MAX_LINE_BYTES", "7")
    monkeypatch.setenv("BATCHAPI_TABLE_NAME", "from-env")
    settings = Settings(table_name="t", bucket_name="b")
    assert (settings.table_name, settings.max_line_bytes) == ("t", 1024 * 1024)
    monkeypatch.setenv("WORKER_MAX_ATTEMPTS", "9")
    assert WorkerConfig().max_attempts == 4


def test_settings_are_frozen() -> None:
    with pytest.raises(ValidationError):
        full_settings().table_name = "other"  # type: ignore[misc]


# --- WorkerConfig (WORKER_) -------------------------------------------------------------------
def test_worker_reads_its_prefix_and_ignores_empty_values() -> None:
    config = WorkerConfig.from_env(
        {
            "WORKER_MODEL": "org/Chat-7B",
            "WORKER_MAX_IN_FLIGHT": "512",
            "WORKER_DRAIN_SECONDS": "12.5",
            "WORKER_QUEUE_URL": "",  # empty: unset, the model's queue from BATCHAPI_MODELS is used
            "WORKER_ENGINE_URL": "",
            "BATCHAPI_MODEL": "not-mine",
        }
    )
    assert (config.model, config.max_in_flight, config.drain_seconds) == ("org/Chat-7B", 512, 12.5)
    assert config.queue_url == ""
    assert config.engine_url == "http://127.0.0.1:8000"  # docs/worker.md: the engine on loopback


def test_worker_invalid_value_names_its_field() -> None:
    with pytest.raises(ValidationError) as info:
        WorkerConfig.from_env({"WORKER_POLL_WAIT_SECONDS": "21"})  # SQS long polls at most 20 s
    assert error_fields(info) == {("poll_wait_seconds",)}
    assert info.value.errors()[0]["type"] == "less_than_equal"


# --- CliSettings (batchctl) -------------------------------------------------------------------
def test_cli_defaults() -> None:
    settings = CliSettings.from_env({})
    assert settings.stack == "BatchApi"  # docs/deploy.md: the stack is named BatchApi
    assert (settings.base_url, settings.api_key, settings.local_state_dir) == ("", "", "")


def test_cli_reads_batchapi_variables_and_treats_empty_as_unset() -> None:
    settings = CliSettings.from_env(
        {
            "BATCHAPI_STACK": "Staging",
            "BATCHAPI_BASE_URL": "https://x/prod/v1",
            "BATCHAPI_LOCAL_STATE_DIR": "",
        }
    )
    assert (settings.stack, settings.base_url, settings.local_state_dir) == ("Staging", "https://x/prod/v1", "")
    assert CliSettings.from_env({"BATCHAPI_STACK": ""}).stack == "BatchApi"


@pytest.mark.parametrize(
    ("env", "key"),
    [
        ({"BATCHAPI_API_KEY": "sk-batch", "OPENAI_API_KEY": "sk-openai"}, "sk-batch"),
        ({"BATCHAPI_API_KEY": "", "OPENAI_API_KEY": "sk-openai"}, "sk-openai"),
        ({"OPENAI_API_KEY": "sk-openai"}, "sk-openai"),
        ({}, ""),
    ],
)
def test_cli_key_prefers_batchapi_then_openai(env: dict[str, str], key: str) -> None:
    assert CliSettings.from_env(env).api_key == key
