"""Fixtures every level shares: no real AWS ever, and the deployment settings under test.
Level fixtures live beside their tests: tests/unit (in-memory fakes), tests/integration (moto),
tests/e2e (the local deployment), tests/infra (CDK assertions)."""


import pytest

from functions.core.settings import ModelRoute, Settings

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


