"""Hostile tenants against keys, rate limits and storage, end to end: the operator uses batchctl,
the tenants only the official SDK. A tenant that floods requests is limited (OpenAI's request-rate
429 with Retry-After) while another tenant's requests all succeed; a disabled tenant is refused at
once (locally; on AWS within the API's policy cache, which answers even while API Gateway still
holds the authorizer's cached Allow); a revoked key id stops working; a tenant over its storage
quota is refused and others are not."""

import io
import re

import openai
import pytest

from batchctl import cli
from functions.core import limits
from functions.core.records import KEY_ID_PREFIX

from .target import Deployment, eventually

pytestmark = pytest.mark.e2e

#: Requests of the flood, and the limit set on the flooding tenant: whatever minute boundary the
#: flood straddles, at most two windows' worth get through.
FLOOD, LIMIT = 24, 4


def batchctl(deployment: Deployment, *argv: str) -> tuple[str, str]:
    out, err = io.StringIO(), io.StringIO()
    assert cli.main(list(argv), env=deployment.env, out=out, err=err) == 0, err.getvalue()
    return out.getvalue(), err.getvalue()


def tenant(deployment: Deployment, request: pytest.FixtureRequest, role: str) -> str:
    return deployment.tenant(f"hk-{role}-" + re.sub(r"[^A-Za-z0-9_.-]", "-", request.node.name)[:40])


def sdk(deployment: Deployment, name: str) -> openai.OpenAI:
    """A client of a new key of ``name``, which retries nothing (every answer is counted here)."""
    return deployment.client(deployment.new_key(name)).with_options(max_retries=0)


def refused_within(deployment: Deployment, client: openai.OpenAI, code: str) -> bool:
    """Whether ``client`` is refused with 401 ``code``: at once locally; on AWS within the API's
    policy cache (a disable) or the authorizer's result cache (a revoked key)."""

    def refused() -> bool:
        try:
            client.files.list()
        except openai.AuthenticationError as error:
            return error.code == code
        return False

    within = (
        0
        if deployment.kind == "local"
        else (
            limits.DEFAULT_POLICY_CACHE_SECONDS + 5 if code == "account_deactivated" else deployment.key_cache_seconds
        )
    )
    return eventually(refused, within=within, interval=1)


def test_a_flooding_tenant_is_limited_while_another_tenant_s_requests_all_succeed(deployment, request):
    flooder, honest = tenant(deployment, request, "flood"), tenant(deployment, request, "honest")
    batchctl(deployment, "tenants", "set", "--tenant", flooder, "--requests-per-minute", str(LIMIT))
    hostile, fair = sdk(deployment, flooder), sdk(deployment, honest)
    limited = []
    for i in range(FLOOD):
        try:
            (hostile.files.list if i % 2 else hostile.models.list)()
        except openai.RateLimitError as error:
            limited.append(error)
        assert fair.files.list().data == []  # interleaved: the honest tenant is never slowed
    assert len(limited) >= FLOOD - 2 * LIMIT
    for error in limited:
        assert (error.status_code, error.type, error.code) == (429, "requests", "rate_limit_exceeded")
        assert 1 <= int(error.response.headers["retry-after"]) <= 60
        assert error.body["message"].startswith(f"Rate limit reached for requests in organization {flooder}")


def test_a_disabled_tenant_is_refused_at_once_and_an_enabled_one_is_accepted(deployment, request):
    target, other = tenant(deployment, request, "off"), tenant(deployment, request, "on")
    disabled, untouched = sdk(deployment, target), sdk(deployment, other)
    disabled.files.create(file=("a.txt", b"a"), purpose="user_data")
    out, err = batchctl(deployment, "tenants", "disable", target)
    assert '"disabled": true' in out and "1 keys marked" in err
    assert refused_within(deployment, disabled, "account_deactivated")
    untouched.files.create(file=("b.txt", b"b"), purpose="user_data")
    batchctl(deployment, "tenants", "enable", target)


def test_a_revoked_key_id_stops_working_and_the_tenant_s_other_keys_do_not(deployment, request):
    name = tenant(deployment, request, "rev")
    out, err = batchctl(deployment, "keys", "create", "--tenant", name)
    key = out.strip()
    (key_id,) = re.findall(rf"{KEY_ID_PREFIX}[0-9a-f]{{12}}", err)
    revoked, kept = deployment.client(key).with_options(max_retries=0), sdk(deployment, name)
    revoked.files.list()
    listed, _ = batchctl(deployment, "keys", "list", "--tenant", name)
    assert key_id in listed and key not in listed
    batchctl(deployment, "keys", "revoke", "--id", key_id)
    assert refused_within(deployment, revoked, "invalid_api_key")
    kept.files.list()


def test_a_tenant_over_its_storage_quota_is_refused_and_others_are_not(deployment, request):
    full, other = tenant(deployment, request, "full"), tenant(deployment, request, "room")
    batchctl(deployment, "tenants", "set", "--tenant", full, "--max-stored-bytes", "1000")
    hoarder, neighbour = sdk(deployment, full), sdk(deployment, other)
    kept = hoarder.files.create(file=("a.bin", b"a" * 600), purpose="user_data")
    for attempt in (
        lambda: hoarder.files.create(file=("b.bin", b"b" * 600), purpose="user_data"),
        lambda: hoarder.uploads.create(bytes=600, filename="u.jsonl", mime_type="text/jsonl", purpose="batch"),
    ):
        with pytest.raises(openai.BadRequestError) as info:
            attempt()
        assert (info.value.status_code, info.value.code) == (400, "storage_quota_exceeded")
    for _ in range(2):
        neighbour.files.create(file=("c.bin", b"c" * 600), purpose="user_data")
    hoarder.files.delete(kept.id)
    hoarder.files.create(file=("b.bin", b"b" * 600), purpose="user_data")  # room again
