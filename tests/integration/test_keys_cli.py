"""``batchctl keys create|list|revoke --id|backfill`` and ``batchctl tenants disable|enable``,
``--requests-per-minute``, ``--max-stored-bytes`` against the deployed stack on moto: the key on
stdout and its id on stderr, a listing that never shows a key, revoke by id, a disabled tenant's keys
refused through the API and no key made for it, every change in the tenant's audit chain, usage in
``tenants get``, and bad values refused with a clear message (exit 2)."""

import json
import time

import openai
import pytest

from batchctl import cli
from functions.core import audit, auth
from functions.core import tenants as tenant_rules
from functions.core.records import ApiKeyRecord, key_id
from tests.helpers import sdk_client
from tests.integration.test_tenants_cli import env, run_cli, stack


def sdk(api_url: str, key: str) -> openai.OpenAI:
    return sdk_client(api_url, key, max_retries=0)


def create(env, tenant="acme") -> str:
    code, out, err = run_cli("keys", "create", "--tenant", tenant, env=env)
    assert code == 0, err
    key = out.strip()
    assert f"key id {key_id(auth.hash_key(key))} (tenant '{tenant}')" in err
    return key


def test_keys_are_listed_by_id_hint_created_at_and_status_never_the_key(stack, env):
    keys = [create(env) for _ in range(2)]
    create(env, "globex")
    code, out, err = run_cli("keys", "list", "--tenant", "acme", env=env)
    assert code == 0, err
    rows = [json.loads(line) for line in out.splitlines()]
    assert sorted(r["id"] for r in rows) == sorted(key_id(auth.hash_key(k)) for k in keys)
    assert {tuple(sorted(r)) for r in rows} == {("created_at", "hint", "id", "status")}
    assert {r["hint"] for r in rows} == {k[-4:] for k in keys} and {r["status"] for r in rows} == {"active"}
    assert not any(k in out or auth.hash_key(k) in out for k in keys)


def test_revoke_by_id_stops_that_key_only_and_is_audited(appender, stack, env, api_url, stores):
    revoked, kept = create(env), create(env)
    sdk(api_url, revoked).files.list()
    revoked_id = key_id(auth.hash_key(revoked))
    code, out, err = run_cli("keys", "revoke", "--id", revoked_id, env=env)
    assert code == 0, err
    assert out.strip() == f"revoked key {revoked_id} of tenant 'acme'"
    with pytest.raises(openai.AuthenticationError) as info:
        sdk(api_url, revoked).files.list()
    assert info.value.code == "invalid_api_key"
    sdk(api_url, kept).files.list()
    assert run_cli("keys", "revoke", "--id", revoked_id, env=env)[0] == 1  # no such key any more
    actions = [(r.action, r.target) for r in appender.records("acme")]
    assert ("keys.revoke", revoked_id) in actions and ("keys.create", revoked_id) in actions
    assert audit.key_actor(f"Bearer {revoked}") == revoked_id  # the id is the actor of its requests


@pytest.mark.parametrize("value", ["3f2a9c01b7de", "key:3F2A9C01B7DE", "key:3f2a", "key:3f2a9c01b7dz"])
def test_a_malformed_id_is_a_usage_error(value, env, capsys):
    with pytest.raises(SystemExit) as info:
        cli.main(["keys", "revoke", "--id", value], env=env)
    assert info.value.code == 2 and "expected a key id" in capsys.readouterr().err


@pytest.mark.settings(policy_cache_seconds=0)
def test_disable_refuses_the_tenant_s_keys_and_new_ones_until_enable(appender, stack, env, api_url, stores):
    key, other = create(env), create(env, "globex")
    code, out, err = run_cli("tenants", "disable", "acme", env=env)
    assert code == 0, err
    assert json.loads(out)["disabled"] is True and "1 keys marked" in err
    with pytest.raises(openai.AuthenticationError) as info:
        sdk(api_url, key).files.list()
    assert info.value.code == "account_deactivated"
    sdk(api_url, other).files.list()
    code, out, err = run_cli("keys", "create", "--tenant", "acme", env=env)
    assert (code, out) == (1, "") and "is disabled" in err
    assert [
        r["status"] for r in map(json.loads, run_cli("keys", "list", "--tenant", "acme", env=env)[1].splitlines())
    ] == ["disabled"]
    assert run_cli("tenants", "enable", "--tenant", "acme", env=env)[0] == 0
    assert sdk(api_url, key).files.list().data == []
    actions = [
        (r.action, r.details["keys"], r.details["policy"]["disabled"])
        for r in appender.records("acme")
        if r.action.startswith("tenants.")
    ]
    assert actions == [("tenants.disable", 1, True), ("tenants.enable", 1, False)]


def test_disable_needs_one_tenant(stack, env):
    assert run_cli("tenants", "disable", env=env)[0] == 2
    assert run_cli("tenants", "disable", "acme", "--tenant", "globex", env=env)[0] == 2


def test_backfill_lists_a_key_stored_before_ids(stack, env, stores):
    old = ApiKeyRecord(key_hash=auth.hash_key("sk-from-before"), tenant="acme", created_at=1, hint="fore")
    stores.keys._table.put(old.to_item())  # the key item alone, as keys were stored before ids
    assert run_cli("keys", "list", "--tenant", "acme", env=env)[1] == ""
    code, _, err = run_cli("keys", "backfill", env=env)
    assert code == 0 and "1 keys got an id" in err
    assert json.loads(run_cli("keys", "list", "--tenant", "acme", env=env)[1])["id"] == old.id
    assert "0 keys" in run_cli("keys", "backfill", env=env)[2]


def test_rate_and_storage_options_are_stored_and_get_shows_their_usage(stack, env, client):
    code, out, err = run_cli(
        "tenants", "set", "--tenant", "acme", "--requests-per-minute", "50", "--max-stored-bytes", "2KiB", env=env
    )
    assert code == 0, err
    assert (json.loads(out)["requests_per_minute"], json.loads(out)["max_stored_bytes"]) == (50, 2048)
    client.files.create(file=("a.txt", b"a" * 300), purpose="user_data")
    assert json.loads(run_cli("tenants", "get", "--tenant", "acme", env=env)[1])["usage"]["stored_bytes"] == 300
    # The request count is the current minute's: a request and its read may fall on either side of
    # a minute's turn, and two tries in a row cannot both.
    for _ in range(2):
        minute = tenant_rules.minute_start(int(time.time()))
        client.files.list()
        usage = json.loads(run_cli("tenants", "get", "--tenant", "acme", env=env)[1])["usage"]
        if tenant_rules.minute_start(int(time.time())) == minute:
            break
    assert usage["requests_this_minute"] >= 1
    code, out, _ = run_cli(
        "tenants", "set", "--tenant", "acme", "--requests-per-minute", "none", "--max-stored-bytes", "none", env=env
    )
    assert (json.loads(out)["requests_per_minute"], json.loads(out)["max_stored_bytes"]) == (None, None)


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["--requests-per-minute", "0"], "at least 1"),
        (["--requests-per-minute", "-3"], "must not be negative"),
        (["--requests-per-minute", "fast"], "whole number"),
        (["--max-stored-bytes", "10 parsecs"], "byte count"),
        (["--max-stored-bytes", "-1"], "byte count"),
        (["--max-stored-bytes", "1.5GB"], "byte count"),
    ],
)
def test_bad_rate_and_storage_values_exit_2_saying_why(argv, says, env, capsys):
    with pytest.raises(SystemExit) as info:
        cli.main(["tenants", "set", "--tenant", "acme", *argv], env=env)
    assert info.value.code == 2 and says in capsys.readouterr().err
