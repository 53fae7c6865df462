"""Fixtures every level shares: no real AWS ever, and the deployment settings under test.
Level fixtures live beside their tests: tests/unit (in-memory fakes), tests/integration (moto),
tests/e2e (the local deployment), tests/infra (CDK assertions)."""

import pytest

# Shared helpers assert too: rewritten like test modules, so a failing helper assertion shows its
# operands (which field, which line) instead of a bare AssertionError. Before they are imported.
pytest.register_assert_rewrite(
    "tests.agreement",
    "tests.builders",
    "tests.chunks",
    "tests.fakes",
    "tests.helpers",
    "tests.wire_bytes",
    "tests.unit.chunk_steps",
    "tests.unit.fault_driver",
    "tests.integration.batch_helpers",
    "tests.integration.worker.harness",
)

from functions.core.settings import ModelRoute, Settings  # noqa: E402

TEST_SETTINGS = Settings(
    table_name="batch-api-test",
    bucket_name="batch-api-test-bucket",
    completion_windows=("24h", "1h", "30s"),
    models={
        "test-chat": ModelRoute(endpoints=("/v1/chat/completions", "/v1/completions")),
        "test-embed": ModelRoute(endpoints=("/v1/embeddings",)),
    },
)
PREFIX = "batch-api-test"


@pytest.fixture(autouse=True)
def _aws_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """Never reach real AWS: fake credentials, a fixed region, no endpoint override."""
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SECURITY_TOKEN", "AWS_SESSION_TOKEN"):
        monkeypatch.setenv(name, "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    monkeypatch.delenv("AWS_ENDPOINT_URL", raising=False)
    monkeypatch.delenv("AWS_PROFILE", raising=False)
    # A call that escaped moto (e.g. from a thread outliving its mock) goes to a dead loopback
    # proxy and fails at once, instead of leaving this machine.
    monkeypatch.setenv("HTTPS_PROXY", "http://127.0.0.1:9")
    monkeypatch.setenv("HTTP_PROXY", "http://127.0.0.1:9")
    monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost")


@pytest.fixture
def settings(request: pytest.FixtureRequest) -> Settings:
    """The deployment settings; ``@pytest.mark.settings(field=value)`` overrides fields."""
    marker = request.node.get_closest_marker("settings")
    return TEST_SETTINGS.model_copy(update=marker.kwargs) if marker else TEST_SETTINGS


# --- xdist groups ------------------------------------------------------------------------------
#: `make test` runs ``pytest -n 2`` (both cores). The tests that start the local deployment or a
#: real vLLM engine share session-, package- and module-scoped deployments and engines, so they all
#: run in one process, in collection order ("engine"); the CDK tests share one synth ("infra");
#: every other test is a unit of its own, spread over both processes as they come free. Grouped by
#: path, in our own scheduler: xdist's ``--dist loadgroup`` reads ``xdist_group`` marks into node
#: ids, which pytest 9.2 no longer lets it rewrite (nothing was grouped).
GROUPS = (
    ("tests/e2e/", "engine"),
    ("tests/integration/worker/test_worker_real_engine.py", "engine"),
    ("tests/integration/worker/test_run_batch_real_engine.py", "engine"),
    ("tests/infra/", "infra"),
)


def xdist_group(nodeid: str) -> str | None:
    return next((group for prefix, group in GROUPS if nodeid.startswith(prefix)), None)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """A test marked ``e2e`` or ``engine`` outside GROUPS would start its own deployment or engine
    in the other process, beside the group's: refused at collection, so GROUPS follows the marks."""
    stray = [
        item.nodeid
        for item in items
        if (item.get_closest_marker("e2e") or item.get_closest_marker("engine"))
        and xdist_group(item.nodeid) != "engine"
    ]
    if stray:
        raise pytest.UsageError(f"tests marked e2e/engine outside tests/conftest.py GROUPS: {stray}")


@pytest.hookimpl(optionalhook=True)  # only with pytest-xdist
def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> object:
    from xdist.scheduler import LoadScopeScheduling

    class Groups(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return xdist_group(nodeid) or nodeid

    return Groups(config, log)
