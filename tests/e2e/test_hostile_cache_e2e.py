"""A hostile tenant against the engine's prefix cache and the engine's environment, end to end with
the real engine and only the official SDK (docs/governance.md, "Prefix-cache isolation").

Tenant A sends a long prompt; its own repeat hits the cache (``cached_tokens > 0``). Tenant B then
sends A's exact prompt with a ``cache_salt`` of its own choosing and gets ``cached_tokens == 0``
(then its own repeat without one hits: both carried B's salt), so B cannot learn from ``cached_tokens`` (or from latency) what A
sent. Locally, the engine processes' environment holds none of the task's credentials or the
worker's settings (the cache-salt secret among them)."""

import re
import uuid
from pathlib import Path

import pytest
from openai import OpenAI
from openai.types.chat import ChatCompletion

from infra import names
from infra.local.processes import ENGINE_WITHHELD_PREFIXES

from .test_batches_e2e import lines, submit, wait

pytestmark = [pytest.mark.e2e, pytest.mark.engine, pytest.mark.slow]


def tenant_sdk(deployment, request: pytest.FixtureRequest, role: str) -> OpenAI:
    name = f"hc-{role}-" + re.sub(r"[^A-Za-z0-9_.-]", "-", request.node.name)[:40]
    return deployment.client(deployment.new_key(name))


def secret_prompt() -> str:
    """About 700 tokens (SmolLM2's tokenizer), new per run: no earlier request can have cached it."""
    return f"Merger codename {uuid.uuid4()}. " + "The board meets on Thursday to approve the acquisition terms. " * 60


def cached_tokens(sdk: OpenAI, model: str, system: str, *, salt: str | None = None, copies: int = 1) -> list[int]:
    """``copies`` lines with ``system`` as their system prompt, as one batch: each line's cached tokens."""
    rows = []
    for i in range(copies):
        body = {
            "model": model,
            "max_tokens": 2,
            "temperature": 0,
            "messages": [{"role": "system", "content": system}, {"role": "user", "content": f"Line {i}."}],
        }
        if salt is not None:
            body["cache_salt"] = salt
        rows.append({"custom_id": f"c-{i}", "method": "POST", "url": "/v1/chat/completions", "body": body})
    batch = wait(sdk, submit(sdk, rows).id, timeout=180)
    assert batch.status == "completed" and batch.request_counts.completed == copies, batch
    found = []
    for line in lines(sdk, batch.output_file_id):
        completion = ChatCompletion.model_validate(line.response.body)
        assert completion.usage.prompt_tokens > 600, completion.usage
        found.append(completion.usage.prompt_tokens_details.cached_tokens or 0)
    return found


def test_another_tenant_s_identical_prompt_never_hits_its_cache(deployment_with_models, chat_model, request):
    a, b = tenant_sdk(deployment_with_models, request, "a"), tenant_sdk(deployment_with_models, request, "b")
    system = secret_prompt()
    cached_tokens(a, chat_model, system)  # A's prompt is now in the engine's cache
    (again,) = cached_tokens(a, chat_model, system)
    assert again > 0  # A's own repeat hits (the cache works for its owner)
    (salted,) = cached_tokens(b, chat_model, system, salt="anything-b-chooses")
    assert salted == 0  # B's identical prompt, whatever salt it sets, learns nothing about A's
    (plain,) = cached_tokens(b, chat_model, system)
    assert plain > 0  # B's own repeat hits: its value was replaced by its own salt
    (third,) = cached_tokens(a, chat_model, system, salt="a-own-salt")
    assert third > 0  # A's own value is replaced by its salt: its hits do not depend on it


@pytest.mark.local_only("reads the local engines' /proc environment")
def test_the_engine_processes_hold_no_credentials_or_worker_settings(local_engines):
    for model in (names.LOCAL_CHAT_MODEL, names.LOCAL_EMBED_MODEL):
        leader = local_engines.child_group("engine", model)
        assert leader is not None, local_engines.log()
        members = local_engines.group_members(leader)
        assert leader in members and len(members) >= 2  # the API server and its engine core
        for pid, environ in members.items():
            names_ = [e.split(b"=", 1)[0].decode() for e in environ if e]
            assert [n for n in names_ if n.startswith(ENGINE_WITHHELD_PREFIXES)] == [], (model, pid)
        worker = local_engines.child_group("worker", model)
        assert worker is not None  # the worker beside it does hold them: the check sees a difference
        worker_env = Path(f"/proc/{worker}/environ").read_bytes()
        assert b"AWS_ENDPOINT_URL=" in worker_env and b"WORKER_CACHE_SALT_SECRET=" in worker_env
