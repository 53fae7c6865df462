"""A tenant's media allowlist (``TenantPolicy.allowed_media_domains``, docs/governance.md): it
narrows the deployment's ``allowed_media_domains`` and never widens it; ingest checks audio lines
against the narrowed list and snapshots it into the manifest and the work messages (a policy
change after ingest changes no running batch); the worker narrows its own media policy by the
message's list (``MediaPolicy.narrowed``); ``batchctl tenants`` sets it."""

import argparse
import asyncio
import json

import pytest

from batchctl import tenants as tenants_cli
from functions.core import schema, tenants
from functions.core.messages import ChunkManifest, WorkMessage
from functions.core.settings import ModelRoute, Settings
from functions.core.tenants import TenantPolicy, default_policy
from functions.ingest import logic
from gpu_worker.attempt import RunPolicy
from gpu_worker.media import DATA_URLS_ONLY, MediaPolicy
from tests.builders import batch_record
from tests.chunks import process_chunk
from tests.fakes.aws import fake_stores
from tests.fakes.engine import InProcessEngine

AUDIO, CHAT = "/v1/audio/transcriptions", "/v1/chat/completions"
NOW = 1_000
QUEUE, CHAT_QUEUE = "https://sqs.local/work-whisper", "https://sqs.local/work-chat"
DEPLOYMENT = ("media.example.com", "cdn.example.org", "Mixed.Example.NET")
SETTINGS = Settings(
    table_name="t",
    bucket_name="b",
    chunk_max_lines=2,
    allowed_media_domains=DEPLOYMENT,
    models={
        "whisper": ModelRoute(endpoints=(AUDIO,), queue_url=QUEUE),
        "chat": ModelRoute(endpoints=(CHAT,), queue_url=CHAT_QUEUE),
    },
)
WAV = "data:audio/wav;base64,UklGRgAAAABXQVZF"


# --- the effective list -------------------------------------------------------------------------
def test_a_tenants_list_narrows_the_deployments_and_never_widens_it():
    assert tenants.media_domains(None, DEPLOYMENT) is None  # no record: the deployment's, as they are
    assert tenants.media_domains(default_policy("acme"), DEPLOYMENT) is None  # no list of its own
    policy = TenantPolicy(
        tenant="acme", allowed_media_domains=["mixed.example.net", "evil.example.com", "MEDIA.example.com"]
    )
    assert policy.allowed_media_domains == ["mixed.example.net", "evil.example.com", "media.example.com"]
    # the hosts both list, lowercase, in the deployment's order; evil.example.com only the tenant lists
    assert tenants.media_domains(policy, DEPLOYMENT) == ("media.example.com", "mixed.example.net")
    assert tenants.media_domains(TenantPolicy(tenant="acme", allowed_media_domains=[]), DEPLOYMENT) == ()
    assert tenants.media_domains(policy, ()) == ()  # a deployment with no host: none for anyone


def test_the_policy_field_is_stored_and_checked():
    policy = TenantPolicy(
        tenant="acme", allowed_media_domains=[" Media.Example.com", "media.example.com", "203.0.113.7"]
    )
    assert policy.allowed_media_domains == ["media.example.com", "203.0.113.7"]
    assert TenantPolicy.from_item(policy.to_item()) == policy
    none = TenantPolicy(tenant="acme", allowed_media_domains=[])  # data: URLs only, not "no list"
    assert TenantPolicy.from_item(none.to_item()).allowed_media_domains == []
    assert "allowed_media_domains" not in default_policy("acme").to_item()
    for bad in (["https://media.example.com"], ["media.example.com/a"], [""], ["a b"], ["u@media.example.com"]):
        with pytest.raises(ValueError, match="media domains must be host names"):
            TenantPolicy(tenant="acme", allowed_media_domains=bad)


def test_a_media_policy_is_narrowed_to_the_hosts_both_list():
    resolver = lambda host, port: ["8.8.8.8"]  # noqa: E731
    worker = MediaPolicy(allowed_domains=("media.example.com", "CDN.example.org"), timeout=7, resolver=resolver)
    assert worker.narrowed(None) is worker
    narrowed = worker.narrowed(["cdn.example.org", "evil.example.com"])
    assert narrowed.allowed_domains == ("cdn.example.org",)  # evil.example.com: only the message lists it
    assert (narrowed.timeout, narrowed.max_bytes, narrowed.resolver) == (7, worker.max_bytes, resolver)
    assert (
        worker.narrowed(()).allowed_domains == () and DATA_URLS_ONLY.narrowed(["media.example.com"]) == DATA_URLS_ONLY
    )


# --- ingest -------------------------------------------------------------------------------------
def audio_line(i: int, url: str) -> str:
    return json.dumps(
        {"custom_id": f"a-{i}", "method": "POST", "url": AUDIO, "body": {"model": "whisper", "file_url": url}}
    )


def ingest(
    urls: list[str],
    policy: TenantPolicy | None,
    *,
    endpoint: str = AUDIO,
    lines: list[str] | None = None,
    settings: Settings = SETTINGS,
):
    stores = fake_stores()
    if policy is not None:
        stores.tenants.put(policy)
    record = batch_record(created_at=NOW - 10, endpoint=endpoint)
    stores.batches.put(record)
    content = lines if lines is not None else [audio_line(i, url) for i, url in enumerate(urls)]
    stores.objects.put(record.input_key, ("\n".join(content) + "\n").encode())
    status = logic.ingest(stores, settings, "acme", "batch_1", now=NOW)
    return stores, status


def errors(stores) -> list[tuple[str, int, str, str]]:
    return [(e["code"], e["line"], e["param"], e["message"]) for e in stores.batches.get("acme", "batch_1").errors]


def manifest(stores) -> ChunkManifest:
    return ChunkManifest.model_validate_json(stores.objects.get(schema.batch_manifest_key("acme", "batch_1")))


def sent(stores, queue: str = QUEUE) -> list[str]:
    return stores.queues.queue(queue).bodies()


NARROW = TenantPolicy(tenant="acme", allowed_media_domains=["cdn.example.org", "tenant-only.example.com"])


def test_ingest_refuses_a_host_the_deployment_allows_but_the_tenants_list_lacks():
    stores, status = ingest(["https://cdn.example.org/a.wav", "https://media.example.com/b.wav?sig=s3cr3t"], NARROW)
    assert status == "failed"
    ((code, line, param, message),) = errors(stores)
    assert (code, line, param) == ("invalid_value", 2, "body.file_url")
    assert "'media.example.com' is not an allowed media domain; allowed: cdn.example.org." in message
    assert "s3cr3t" not in message and sent(stores) == []


def test_ingest_refuses_a_host_only_the_tenant_lists():
    stores, status = ingest(["https://tenant-only.example.com/a.wav"], NARROW)
    assert status == "failed"
    assert [row[:3] for row in errors(stores)] == [("invalid_value", 1, "body.file_url")]


def test_ingest_accepts_a_host_both_list_and_snapshots_the_list_into_the_manifest_and_every_message():
    stores, status = ingest(["https://CDN.example.org/a.wav", WAV, "https://cdn.example.org/c.wav"], NARROW)
    assert status == "in_progress"
    assert manifest(stores).allowed_media_domains == ("cdn.example.org",)
    messages = [WorkMessage.model_validate_json(body) for body in sent(stores)]
    assert len(messages) == 2 and all(m.allowed_media_domains == ("cdn.example.org",) for m in messages)


def test_a_policy_change_after_ingest_leaves_a_fan_out_again_on_the_snapshot():
    stores, _ = ingest(["https://cdn.example.org/a.wav"], NARROW)
    first = sent(stores)
    stores.tenants.put(TenantPolicy(tenant="acme", allowed_media_domains=None))  # widened back to the deployment's
    stores.batches.set("acme", "batch_1", enqueued=False)  # as a lost fan-out that the sweeper resumes
    logic.resume(stores, SETTINGS, stores.batches.get("acme", "batch_1"), NOW + 60)
    again = sent(stores)[len(first) :]
    assert again == first and WorkMessage.model_validate_json(again[0]).allowed_media_domains == ("cdn.example.org",)


def test_without_a_tenant_list_the_deployments_apply_and_nothing_rides_in_the_messages():
    stores, status = ingest(["https://media.example.com/a.wav", "https://mixed.example.net/b.wav"], None)
    assert status == "in_progress" and manifest(stores).allowed_media_domains is None
    assert all("allowed_media_domains" not in json.loads(body) for body in sent(stores))
    _, status = ingest(["https://evil.example.com/a.wav"], default_policy("acme"))
    assert status == "failed"


def test_a_chat_batch_of_a_narrowing_tenant_carries_no_media_list():
    chat = json.dumps({"custom_id": "c", "method": "POST", "url": CHAT, "body": {"model": "chat", "messages": []}})
    stores, status = ingest([], NARROW, endpoint=CHAT, lines=[chat])
    assert status == "in_progress" and manifest(stores).allowed_media_domains is None
    assert all("allowed_media_domains" not in json.loads(body) for body in sent(stores, CHAT_QUEUE))


# --- the worker ---------------------------------------------------------------------------------
async def direct(fn, *args, **kwargs):
    return fn(*args, **kwargs)


def run_chunk(urls: list[str], snapshot: tuple[str, ...] | None, *, settings: Settings = SETTINGS):
    """The chunk of ``urls`` (ingested under ``settings``) run by a worker whose own setting is
    the deployment's, its message carrying ``snapshot``; returns (error rows, looked-up hosts,
    the engine)."""
    stores, status = ingest(urls, None, settings=settings)
    assert status == "in_progress"
    (body,) = sent(stores)
    message = WorkMessage.model_validate_json(body).model_copy(update={"allowed_media_domains": snapshot})
    looked_up: list[str] = []

    def resolver(host: str, port: int) -> list[str]:
        looked_up.append(host)
        return ["10.9.8.7"]  # a private answer: refused by the SSRF rules, nothing is connected to

    engine = InProcessEngine()
    policy = RunPolicy(media=MediaPolicy(allowed_domains=DEPLOYMENT, resolver=resolver))
    asyncio.run(
        process_chunk(stores, message, engine, io=direct, max_line_bytes=1 << 20, now=lambda: NOW, policy=policy)
    )
    marker = stores.batches.counted_chunk("acme", "batch_1", 0)
    err = stores.objects.get(schema.chunk_part_key("acme", "batch_1", 0, marker.attempt, "err")).decode()
    rows = [json.loads(row) for row in err.splitlines()]
    return [(r["custom_id"], r["error"]["code"], r["error"]["message"]) for r in rows], looked_up, engine


def test_the_worker_refuses_a_host_outside_the_messages_list_though_its_own_setting_allows_it():
    rows, looked_up, engine = run_chunk(
        ["https://media.example.com/a.wav", "https://cdn.example.org/b.wav"], ("cdn.example.org",)
    )
    ((refused_id, refused_code, refused_message), (fetched_id, fetched_code, _)) = rows
    assert (refused_id, refused_code) == ("a-0", "invalid_value")  # the line's validation error, as at ingest
    assert "'media.example.com' is not an allowed media domain; allowed: cdn.example.org." in refused_message
    assert (fetched_id, fetched_code) == ("a-1", "media_fetch_failed")  # went on to the fetch (its private answer)
    assert looked_up == ["cdn.example.org"] and engine.requests == []


def test_a_message_without_a_list_runs_under_the_workers_own_setting():
    rows, looked_up, _ = run_chunk(["https://media.example.com/a.wav", "https://cdn.example.org/b.wav"], None)
    assert [row[1] for row in rows] == ["media_fetch_failed", "media_fetch_failed"]
    assert sorted(looked_up) == ["cdn.example.org", "media.example.com"]  # fetched side by side


def test_a_message_can_never_widen_the_workers_setting():
    """A message listing a host the worker's own setting lacks (a deployment that listed it at
    ingest, and no longer does): the line is refused before any lookup."""
    wider = SETTINGS.model_copy(update={"allowed_media_domains": (*DEPLOYMENT, "elsewhere.example.com")})
    rows, looked_up, _ = run_chunk(["https://elsewhere.example.com/a.wav"], ("elsewhere.example.com",), settings=wider)
    assert [row[1] for row in rows] == ["invalid_value"] and looked_up == []


# --- batchctl tenants ---------------------------------------------------------------------------
def parsed(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    tenants_cli.add_parsers(parser.add_subparsers(dest="command"))
    return parser.parse_args(["tenants", "set", "--tenant", "acme", *argv])


def test_batchctl_sets_clears_and_empties_the_list():
    policy = tenants_cli.apply(
        default_policy("acme"), parsed("--allowed-media-domains", "CDN.example.org, media.example.com"), now=5
    )
    assert policy.allowed_media_domains == ["cdn.example.org", "media.example.com"] and policy.updated_at == 5
    assert (
        tenants_cli.apply(policy, parsed("--batches-per-hour", "3"), now=6).allowed_media_domains
        == policy.allowed_media_domains
    )
    assert tenants_cli.apply(policy, parsed("--allowed-media-domains", "none"), now=7).allowed_media_domains == []
    assert tenants_cli.apply(policy, parsed("--allowed-media-domains", "all"), now=8).allowed_media_domains is None


def test_batchctl_refuses_an_empty_list(capsys):
    with pytest.raises(SystemExit) as info:
        parsed("--allowed-media-domains", " , ")
    assert info.value.code == 2 and "comma-separated list of hosts" in capsys.readouterr().err
