"""The local deployment gives each engine and the worker beside it one ``--max-num-seqs``: the
engine's flag and the worker's ``WORKER_ENGINE_MAX_NUM_SEQS`` (its in-flight cap, 2 x, follows the
engine, not a constant); ``ENGINE_MAX_NUM_SEQS`` overrides the local default."""

from pathlib import Path

import pytest

from gpu_worker.config import WorkerConfig
from infra.local.processes import LOCAL_MAX_NUM_SEQS, Engines, EngineSpec, Workers, max_num_seqs


def test_the_engine_and_its_worker_get_the_same_max_num_seqs(tmp_path: Path):
    spec = EngineSpec("smollm2-135m-instruct", 8123, max_num_seqs({"ENGINE_MAX_NUM_SEQS": "96"}))
    (engine,) = Engines([spec], tmp_path).children
    (worker,) = Workers([spec], tmp_path, {"WORKER_ORDER": "file"}).children
    argv = engine._argv
    assert argv[argv.index("--max-num-seqs") + 1] == "96"
    env = worker._env()
    assert env["WORKER_ENGINE_MAX_NUM_SEQS"] == "96" and "WORKER_MAX_IN_FLIGHT" not in env
    assert env["WORKER_ORDER"] == "file"  # the deployment's environment reaches the worker
    config = WorkerConfig.from_env(env)
    assert config.in_flight_cap() == 192 and config.order == "file"


def test_the_local_worker_defaults_yield_to_the_environment_but_its_model_and_engine_do_not(tmp_path: Path):
    spec = EngineSpec("smollm2-135m-instruct", 8123)
    (plain,) = Workers([spec], tmp_path, {}).children
    assert WorkerConfig.from_env(plain._env()).visibility_seconds == 30  # the local default, not 120
    (tuned,) = Workers(
        [spec],
        tmp_path,
        {"WORKER_VISIBILITY_SECONDS": "15", "WORKER_MODEL": "other", "WORKER_ENGINE_URL": "http://elsewhere"},
    ).children
    config = WorkerConfig.from_env(tuned._env())
    assert config.visibility_seconds == 15 and config.heartbeat_interval() == 5
    assert (config.model, tuned._env()["WORKER_ENGINE_URL"]) == ("smollm2-135m-instruct", "http://127.0.0.1:8123")


def test_the_default_and_bad_values():
    assert max_num_seqs({}) == max_num_seqs({"ENGINE_MAX_NUM_SEQS": ""}) == LOCAL_MAX_NUM_SEQS == 128
    for bad in ("0", "many", "-3"):
        with pytest.raises(ValueError, match="ENGINE_MAX_NUM_SEQS"):
            max_num_seqs({"ENGINE_MAX_NUM_SEQS": bad})
