"""The deployment config: defaults, files, validation (no synth needed)."""

import json

import pytest
from pydantic import ValidationError

from functions.core import limits
from functions.core.settings import ModelRoute, Settings
from gpu_worker.config import WorkerConfig
from infra import config


def test_no_config_gives_safe_scale_to_zero_defaults():
    cfg = config.parse(None)
    assert cfg.account is None and cfg.region is None  # environment-agnostic
    assert cfg.removal_policy == "retain"
    assert cfg.models and all(m.min_instances == 0 for m in cfg.models)
    (model,) = cfg.models
    assert (model.spot, model.max_instances, model.endpoints) == (False, 1, config.DEFAULT_MODEL_ENDPOINTS)
    assert cfg.network is None  # a new VPC without NAT gateways
    assert cfg.settings(table_name="t", bucket_name="b") == Settings(
        table_name="t", bucket_name="b", models={model.name: ModelRoute(endpoints=model.endpoints)}
    )


def test_settings_carry_each_models_queue_and_the_workflow():
    cfg = config.parse({"models": [{"name": "chat"}, {"name": "embed", "endpoints": ["/v1/embeddings"]}]})
    settings = cfg.settings(
        table_name="t", bucket_name="b", queue_urls={"chat": "q1", "embed": "q2"}, state_machine_arn="sm"
    )
    assert settings.models == {
        "chat": ModelRoute(endpoints=config.DEFAULT_MODEL_ENDPOINTS, queue_url="q1"),
        "embed": ModelRoute(endpoints=("/v1/embeddings",), queue_url="q2"),
    }
    assert settings.state_machine_arn == "sm"
    assert Settings.from_env(settings.to_env()) == settings  # what the functions and the worker read


def test_model_worker_settings_become_worker_env():
    (model,) = config.parse({"models": [{"name": "m", "worker": {"max_in_flight": 64, "drain_seconds": 30}}]}).models
    assert model.worker_env() == {"WORKER_DRAIN_SECONDS": "30", "WORKER_MAX_IN_FLIGHT": "64", "WORKER_MODEL": "m"}
    assert WorkerConfig.from_env(model.worker_env()) == model.worker_config()
    assert model.worker_config().drain_seconds == 30


def test_yaml_file(tmp_path):
    path = tmp_path / "deploy.yaml"
    path.write_text(
        "removal_policy: destroy\n"
        "log_retention_days: 14\n"
        "limits: {max_batch_file_bytes: 1048576}\n"
        "models:\n"
        "  - {name: m1, instance_type: g5.xlarge, min_instances: 1, max_instances: 3, spot: true,"
        " engine_args: [--max-model-len, '4096']}\n"
    )
    cfg = config.parse(str(path))
    assert cfg.removal_policy == "destroy" and cfg.log_retention_days == 14
    (model,) = cfg.models
    assert (model.name, model.instance_type, model.min_instances, model.max_instances, model.spot) == (
        "m1",
        "g5.xlarge",
        1,
        3,
        True,
    )
    assert model.engine_args == ("--max-model-len", "4096")
    settings = cfg.settings(table_name="t", bucket_name="b")
    assert settings.max_batch_file_bytes == 1048576
    assert settings.max_file_bytes == limits.DEFAULT_MAX_FILE_BYTES


def test_json_file_and_inline_json_and_object(tmp_path):
    body = {"throttle": {"rate_limit": 5, "burst_limit": 10}}
    path = tmp_path / "deploy.json"
    path.write_text(json.dumps(body))
    for raw in (str(path), json.dumps(body), body):
        assert config.parse(raw).throttle == config.ThrottleConfig(rate_limit=5, burst_limit=10)


#: (config, where the error is, what its message says): each config is rejected for its own reason.
INVALID = [
    ({"limits": {"table_name": "x"}}, ("limits",), "unknown limits ['table_name']"),  # wired by the stack
    ({"limits": {"no_such_limit": 1}}, ("limits",), "unknown limits ['no_such_limit']"),
    ({"limits": {"max_file_bytes": 0}}, ("limits", "max_file_bytes"), "greater than 0"),  # Settings' bounds
    ({"log_retention_days": 10}, ("log_retention_days",), "log_retention_days must be one of"),  # not CloudWatch's
    ({"account": "123456789012"}, (), "set both account and region"),
    (
        {"models": [{"name": "m", "min_instances": 2, "max_instances": 1}]},
        ("models", 0),
        "max_instances < min_instances",
    ),
    ({"models": [{"name": "m"}, {"name": "m"}]}, ("models",), "model names must be unique"),
    (
        {"models": [{"name": "m", "endpoints": ["/v1/moderations"]}]},
        (),
        "endpoints ['/v1/moderations'] are not in allowed_endpoints",
    ),
    ({"models": [{"name": "m", "endpoints": []}]}, ("models", 0, "endpoints"), "at least 1 item"),
    (
        {"models": [{"name": "m", "engine_args": ["--max-model-len 8192"]}]},
        ("models", 0, "engine_args"),
        "no whitespace inside one",
    ),
    (
        {"models": [{"name": "m", "worker": {"queue_url": "x"}}]},
        ("models", 0, "worker"),
        "unknown worker settings ['queue_url']",
    ),
    (
        {"models": [{"name": "m", "worker": {"no_such_knob": 1}}]},
        ("models", 0, "worker"),
        "unknown worker settings ['no_such_knob']",
    ),
    (
        {"models": [{"name": "m", "worker": {"max_in_flight": -1}}]},
        ("models", 0, "worker", "max_in_flight"),
        "greater than or equal to 0",
    ),
    (
        {"models": [{"name": "m", "spot": True, "on_demand_base": 2, "max_instances": 1}]},
        ("models", 0),
        "on_demand_base > max_instances",
    ),
    ({"models": [{"name": "m", "volume_gib": 10}]}, ("models", 0, "volume_gib"), "greater than or equal to 30"),
    (
        {"network": {"vpc_id": "vpc-0123456789abcdef0", "subnet_ids": ["subnet-01234567"], "availability_zones": []}},
        ("network", "availability_zones"),
        "at least 1 item",
    ),
    (
        {
            "network": {
                "vpc_id": "vpc-0123456789abcdef0",
                "subnet_ids": ["subnet-01234567", "subnet-89abcdef"],
                "availability_zones": ["eu-west-1a"],
            }
        },
        ("network",),
        "one availability zone per subnet id",
    ),
    (
        {"network": {"vpc_id": "vpc-1", "subnet_ids": ["subnet-01234567"], "availability_zones": ["eu-west-1a"]}},
        ("network", "vpc_id"),
        "should match pattern",
    ),
    ({"removal_policy": "snapshot"}, ("removal_policy",), "'retain' or 'destroy'"),
    ({"unknown_key": 1}, ("unknown_key",), "Extra inputs are not permitted"),
]


@pytest.mark.parametrize(("bad", "loc", "message"), INVALID)
def test_invalid_configs_are_rejected_for_their_reason(bad, loc, message):
    with pytest.raises(ValidationError) as info:
        config.parse(bad)
    (error,) = info.value.errors()  # one error: the one this config is about
    assert tuple(error["loc"]) == loc
    assert message in error["msg"]
