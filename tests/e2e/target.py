"""Which deployment the end-to-end suite drives: the local one (``make up`` in a subprocess, the
default) or a deployed stack (``make e2e-aws``). The tests themselves are the same for both: they
take a ``deployment`` (conftest.py) and use only what both kinds have (``Deployment`` below).

    BATCHAPI_E2E_TARGET       local (default) | aws
    BATCHAPI_STACK            the stack on AWS (batchctl's variable; default BatchApi)
    AWS_REGION, AWS_PROFILE   the standard credential chain, as for batchctl
    BATCHAPI_E2E_CHAT_MODEL   the chat model to use (default: the local one if served, else the
                              only model the stack serves)
    BATCHAPI_E2E_EMBED_MODEL  the embeddings model (default: the local one if served; tests that
                              need one skip when there is none)
    BATCHAPI_E2E_SPEECH_MODEL the speech model (audio transcriptions and translations; default: the
                              local one if served; tests that need one skip when there is none)
    BATCHAPI_E2E_KEY_CACHE_SECONDS  how long a revoked key may still work (the stack's
                              authorizer_cache_seconds; default 300, the config's default)
    BATCHAPI_E2E_WARM_UP_SECONDS    on AWS, how long the models' first one-line batches may take
                              (GPU services start from zero; default 1800)

On AWS the suite reads the API's base URL and the table from the stack's outputs (one
DescribeStacks), creates its keys with batchctl's own code (``batchctl.keys`` on the table the
outputs name, the standard credential chain), gives every tenant a per-run prefix (a second run
sees nothing of the first), and at the end deletes the files its tenants made and revokes its
keys. Tests marked ``local_only`` (they need something only the local deployment has: its
processes, its moto, its models by name, its windows and chunk size) are skipped there.
"""

import json
import os
import secrets
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import SplitResult

from openai import OpenAI

from batchctl import keys as batchctl_keys
from batchctl import targets as batchctl_targets
from batchctl.settings import CliSettings
from functions.core.aws.repos import KeyRepo
from infra import names
from infra.local import state as local_state

TARGET_ENV = "BATCHAPI_E2E_TARGET"
CHAT_MODEL_ENV = "BATCHAPI_E2E_CHAT_MODEL"
EMBED_MODEL_ENV = "BATCHAPI_E2E_EMBED_MODEL"
SPEECH_MODEL_ENV = "BATCHAPI_E2E_SPEECH_MODEL"
KEY_CACHE_ENV = "BATCHAPI_E2E_KEY_CACHE_SECONDS"
WARM_UP_ENV = "BATCHAPI_E2E_WARM_UP_SECONDS"
#: From zero: queue metrics (1-5 min), an instance (~2 min), the image (~10 GB) and the weights:
#: docs/deploy.md says 10-20 minutes is normal for the first batch.
DEFAULT_WARM_UP_SECONDS = 1800
KINDS = ("local", "aws")
#: The marker of tests that need the local deployment itself; its argument says why.
LOCAL_ONLY = "local_only"
#: The fixtures that are the local deployment (its processes, state file, moto, logs). A test whose
#: fixture closure holds one must be marked LOCAL_ONLY (tests/e2e/test_e2e_target.py checks it).
LOCAL_FIXTURES = frozenset({"local", "local_engines", "start_local"})
#: The default of infra/config.py's authorizer_cache_seconds.
DEFAULT_KEY_CACHE_SECONDS = 300
#: Tenant names are 1-64 characters (functions.core.records.check_tenant).
TENANT_MAX = 64


@dataclass(frozen=True)
class E2ESettings:
    kind: str = "local"
    stack: str = names.STACK_NAME
    chat_model: str | None = None
    embed_model: str | None = None
    speech_model: str | None = None
    key_cache_seconds: int = DEFAULT_KEY_CACHE_SECONDS
    warm_up_seconds: int = DEFAULT_WARM_UP_SECONDS

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> "E2ESettings":
        kind = env.get(TARGET_ENV) or "local"
        if kind not in KINDS:
            raise ValueError(f"{TARGET_ENV}={kind!r}: must be one of {', '.join(KINDS)}")
        seconds = {}
        for name in (KEY_CACHE_ENV, WARM_UP_ENV):
            value = env.get(name) or ""
            if value and not value.isdigit():
                raise ValueError(f"{name}={value!r}: must be a whole number of seconds")
            seconds[name] = int(value) if value else None
        return cls(
            kind=kind,
            stack=CliSettings.from_env(env).stack,
            chat_model=env.get(CHAT_MODEL_ENV) or None,
            embed_model=env.get(EMBED_MODEL_ENV) or None,
            speech_model=env.get(SPEECH_MODEL_ENV) or None,
            key_cache_seconds=seconds[KEY_CACHE_ENV]
            if seconds[KEY_CACHE_ENV] is not None
            else DEFAULT_KEY_CACHE_SECONDS,
            warm_up_seconds=seconds[WARM_UP_ENV] if seconds[WARM_UP_ENV] is not None else DEFAULT_WARM_UP_SECONDS,
        )


class Deployment(Protocol):
    """What a test may use of the deployment under test, whichever kind it is."""

    kind: str
    #: How long a revoked key may still authenticate (0 locally; the authorizer's cache on AWS).
    key_cache_seconds: int

    @property
    def base_url(self) -> str: ...

    @property
    def env(self) -> dict[str, str]:
        """The environment a `batchctl` subprocess needs to reach this deployment."""
        ...

    def client(self, key: str | None = None) -> OpenAI: ...

    def new_key(self, tenant: str) -> str: ...

    def tenant(self, name: str) -> str:
        """``name`` as a tenant of this run (unique per run on a long-lived stack)."""
        ...

    def is_storage_url(self, url: SplitResult) -> bool:
        """True if ``url`` (a redirect's target) is the deployment's object store."""
        ...


def pick_model(
    listed: Iterable[str], *, wanted: str | None, local: str, exclude: str | None = None, only_if_alone: bool = False
) -> str | None:
    """The model a test uses, from what the deployment serves (``GET /v1/models``): ``wanted`` (it
    must be served), else the local deployment's model if served, else (``only_if_alone``) the one
    model served besides ``exclude``; None if there is none to use."""
    served = sorted(set(listed))
    if wanted is not None:
        if wanted not in served:
            raise ValueError(f"model {wanted!r} is not served by the deployment (it serves {served})")
        return wanted
    if local in served:
        return local
    others = [m for m in served if m != exclude]
    return others[0] if only_if_alone and len(others) == 1 else None


def run_prefix() -> str:
    """A short, random, tenant-safe prefix for one run."""
    return "e2e" + secrets.token_hex(4)


@dataclass
class StackDeployment:
    """A deployed stack, reached as a client and an operator reach it: the base URL from the
    stack's outputs, keys written by batchctl's code with the standard credential chain."""

    stack: str
    base_url: str
    bucket: str
    target: batchctl_targets.Target
    keys: KeyRepo
    operator_env: dict[str, str]
    state_dir: Path
    key_cache_seconds: int = DEFAULT_KEY_CACHE_SECONDS
    prefix: str = field(default_factory=run_prefix)
    clock: Callable[[], float] = time.time
    kind: str = "aws"
    created: list[str] = field(default_factory=list)
    _default_key: str | None = None

    @property
    def default_key(self) -> str:
        """The session's own key (a tenant of this run), made on first use."""
        if self._default_key is None:
            self._default_key = self.new_key("default")
        return self._default_key

    @property
    def env(self) -> dict[str, str]:
        """The operator's environment (credentials, region), the stack, the session's key, and a
        local state directory that holds no deployment (so batchctl never finds a `make up`)."""
        return {
            **self.operator_env,
            CliSettings.env_name("stack"): self.stack,
            CliSettings.env_name("api_key"): self.default_key,
            local_state.STATE_DIR_ENV: str(self.state_dir),
        }

    def tenant(self, name: str) -> str:
        return f"{self.prefix}.{name}"[:TENANT_MAX]

    def client(self, key: str | None = None) -> OpenAI:
        return OpenAI(base_url=self.base_url, api_key=key or self.default_key, max_retries=0, timeout=120)

    def new_key(self, tenant: str) -> str:
        """A key for ``tenant`` (made a tenant of this run), created as `batchctl keys create` does."""
        key = batchctl_keys.create_key(self.keys, self.tenant(tenant), now=int(self.clock()))
        self.created.append(key)
        return key

    def is_storage_url(self, url: SplitResult) -> bool:
        """The stack's bucket, virtual-hosted (``<bucket>.s3.<region>.amazonaws.com``) or path style."""
        host = url.hostname or ""
        return host.startswith(f"{self.bucket}.") or url.path.startswith(f"/{self.bucket}/")

    def close(self) -> list[str]:
        """Delete the files of this run's tenants, then revoke their keys (both are attempted
        whatever fails); returns what failed."""
        problems = self.delete_files()
        problems += self.revoke_keys()
        return problems

    def delete_files(self) -> list[str]:
        problems = []
        for key in self.created:
            try:
                with OpenAI(base_url=self.base_url, api_key=key, max_retries=2, timeout=60) as client:
                    for file in client.files.list():
                        client.files.delete(file.id)
            except Exception as exc:
                problems.append(f"deleting the files of a test key: {type(exc).__name__}: {exc}")
        return problems

    def revoke_keys(self) -> list[str]:
        problems = []
        for key in list(self.created):
            try:
                batchctl_keys.revoke_key(self.keys, key)
                self.created.remove(key)
            except Exception as exc:
                problems.append(f"revoking a test key: {type(exc).__name__}: {exc}")
        return problems


def open_stack(
    settings: E2ESettings,
    *,
    cloudformation: Any,
    operator_env: Mapping[str, str],
    state_dir: Path,
    region: str | None = None,
    key_repo: Callable[[batchctl_targets.Target], KeyRepo] = batchctl_keys.key_repo,
) -> StackDeployment:
    """The deployed stack ``settings.stack``: one DescribeStacks for its outputs (``ApiUrl``,
    ``TableName``, ``BucketName``), and batchctl's key repository on its table (in ``region``; None:
    boto3's chain)."""
    outputs = batchctl_targets.stack_outputs(cloudformation, settings.stack)
    target = batchctl_targets.target_from_outputs(outputs, settings.stack, region)
    return StackDeployment(
        stack=settings.stack,
        base_url=batchctl_targets.output(outputs, settings.stack, names.OUTPUT_API_URL),
        bucket=batchctl_targets.output(outputs, settings.stack, names.OUTPUT_BUCKET),
        target=target,
        keys=key_repo(target),
        operator_env=dict(operator_env),
        state_dir=state_dir,
        key_cache_seconds=settings.key_cache_seconds,
    )


def eventually(
    check: Callable[[], bool],
    *,
    within: float,
    interval: float = 5.0,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> bool:
    """True once ``check()`` is; tries at once and then every ``interval`` until ``within`` seconds
    have passed (``within=0``: one try)."""
    deadline = clock() + within
    while True:
        if check():
            return True
        if clock() >= deadline:
            return False
        sleep(interval)


# --- Which tests are local_only (tests/e2e/test_e2e_target.py) -----------------------------------
#: ``pytest -p tests.e2e.target --collect-only`` with this set writes every collected e2e test, its
#: local_only reason and its fixture closure to the file it names (JSON).
COLLECT_REPORT_ENV = "BATCHAPI_E2E_COLLECT_REPORT"


def pytest_collection_finish(session: Any) -> None:
    path = os.environ.get(COLLECT_REPORT_ENV)
    if not path:
        return
    rows = []
    for item in session.items:
        marker = item.get_closest_marker(LOCAL_ONLY)
        rows.append(
            {
                "id": item.nodeid,
                "local_only": (marker.args[0] if marker.args else "") if marker else None,
                "fixtures": sorted(getattr(item, "fixturenames", [])),
            }
        )
    Path(path).write_text(json.dumps(rows, indent=1))


# --- A deployed stack's GPU services start at zero -------------------------------------------------
TERMINAL = ("completed", "failed", "expired", "cancelled")


def warm_up_line(model: str, endpoint: str) -> bytes:
    body: dict[str, Any] = (
        {"model": model, "input": "warm up"}
        if endpoint == "/v1/embeddings"
        else ({"model": model, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 1})
    )
    return (json.dumps({"custom_id": "warm-up", "method": "POST", "url": endpoint, "body": body}) + "\n").encode()


def warm_up(
    client: OpenAI,
    models: Mapping[str, str],
    *,
    within: float,
    interval: float = 15.0,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> dict[str, str]:
    """One one-line batch per model (``{model: endpoint}``), all at once, waited for together up
    to ``within`` seconds: on a stack whose GPU services idle at zero, the suite's own batches
    then run on started services and its per-batch timeouts (minutes) hold. Returns each model's
    last batch status ("completed" when it is ready)."""
    batches = {}
    for model, endpoint in models.items():
        file = client.files.create(file=("warm-up.jsonl", warm_up_line(model, endpoint)), purpose="batch")
        batches[model] = client.batches.create(input_file_id=file.id, endpoint=endpoint, completion_window="24h").id  # type: ignore[arg-type]
    statuses = dict.fromkeys(models, "validating")
    deadline = clock() + within
    while True:
        for model, batch_id in batches.items():
            if statuses[model] not in TERMINAL:
                statuses[model] = client.batches.retrieve(batch_id).status
        if all(s in TERMINAL for s in statuses.values()) or clock() >= deadline:
            return statuses
        sleep(interval)
