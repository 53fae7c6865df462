"""Request rate limits, the stored-bytes quota and disabled tenants through the official SDK and the
local front on moto (the real authorizer and api handlers): a tenant over its ``requests_per_minute``
gets OpenAI's request-rate 429 with an exact ``Retry-After`` (``openai.RateLimitError`` with
``max_retries=0``, or after the SDK's own retries, which wait what the header says); another tenant
is untouched; the refusal is audited as a refusal. A tenant over its ``max_stored_bytes`` gets a 400
on files and uploads until it deletes. A disabled tenant's keys get 401 ``account_deactivated``
from the authorizer at once, and from the API itself while API Gateway would still hold an Allow."""

import json

import openai
import pytest

from functions.api import handler as api_handler
from functions.authorizer import handler as authorizer_handler
from functions.core import auth, deps
from functions.core.tenants import TenantPolicy
from infra.local.lambda_context import LocalLambdaContext
from tests.helpers import sdk_client

#: A clock minute; NOW is 20 s into it.
MINUTE = 1_800_000_000 - 1_800_000_000 % 60
NOW = MINUTE + 20


def sdk(api_url: str, key: str, **over) -> openai.OpenAI:
    return sdk_client(api_url, key, **{"max_retries": 0, **over})


def test_over_its_rate_a_tenant_gets_openai_s_429_with_retry_after_and_others_do_not(
    api_url,
    keys,
    stores,
    clock,
    other_client,
    appender,
):
    clock.now = NOW
    stores.tenants.put(TenantPolicy(tenant="acme", requests_per_minute=3))
    client = sdk(api_url, keys["acme"])
    client.files.list()
    client.models.list()
    with pytest.raises(openai.NotFoundError):  # every route counts, an unknown object too
        client.files.retrieve("file-nope")
    with pytest.raises(openai.RateLimitError) as info:
        client.files.create(file=("a.txt", b"a"), purpose="user_data")
    error = info.value
    assert (error.status_code, error.type, error.code, error.param) == (429, "requests", "rate_limit_exceeded", None)
    assert error.response.headers["retry-after"] == "40"
    assert error.body["message"].startswith("Rate limit reached for requests in organization acme on requests per min")
    assert error.response.headers["x-request-id"]
    for _ in range(5):
        other_client.files.list()  # another tenant: no limit
    # The refused create is in the chain as the refusal it was; nothing was created.
    (record,) = [r for r in appender.records("acme") if r.action == "files.create"]
    assert (record.outcome, record.details) == ("429", {"error_code": "rate_limit_exceeded", "error_type": "requests"})
    assert stores.files.list("acme", purpose=None, after=None, ascending=True, limit=10, now=NOW) == ([], False)
    clock.now = MINUTE + 60  # the window Retry-After named
    client.files.create(file=("a.txt", b"a"), purpose="user_data")


def test_the_sdk_s_own_retries_wait_what_retry_after_says_then_raise(api_url, keys, stores, clock, monkeypatch):
    clock.now = MINUTE + 59  # one second left in the window
    stores.tenants.put(TenantPolicy(tenant="acme", requests_per_minute=1))
    sdk(api_url, keys["acme"]).files.list()
    seen: list[tuple[int, str | None]] = []
    waits: list[float] = []
    monkeypatch.setattr(openai._base_client.time, "sleep", waits.append)  # the SDK's retry wait, recorded
    hooks = {"response": [lambda response: seen.append((response.status_code, response.headers.get("retry-after")))]}
    client = sdk(api_url, keys["acme"], max_retries=2, http_client=openai.DefaultHttpxClient(event_hooks=hooks))
    with pytest.raises(openai.RateLimitError):
        client.files.list()
    assert seen == [(429, "1")] * 3  # the request and the SDK's two retries
    assert waits == [1.0, 1.0]  # each after exactly the Retry-After
    clock.now = MINUTE + 60
    assert client.files.list().data == []


def test_over_its_stored_bytes_a_tenant_gets_a_400_until_it_deletes(client, other_client, stores):
    stores.tenants.put(TenantPolicy(tenant="acme", max_stored_bytes=100))
    kept = client.files.create(file=("a.txt", b"a" * 60), purpose="user_data")
    for attempt in (
        lambda: client.files.create(file=("b.txt", b"b" * 41), purpose="user_data"),
        lambda: client.uploads.create(bytes=41, filename="u.jsonl", mime_type="text/jsonl", purpose="batch"),
    ):
        with pytest.raises(openai.BadRequestError) as info:
            attempt()
        assert (info.value.status_code, info.value.type, info.value.code) == (
            400,
            "invalid_request_error",
            "storage_quota_exceeded",
        )
        assert info.value.body["message"].startswith("You have exceeded your file storage quota.")
    assert [f.id for f in client.files.list()] == [kept.id]
    other_client.files.create(file=("big.txt", b"x" * 500), purpose="user_data")  # no quota of its own
    upload = client.uploads.create(bytes=40, filename="u.jsonl", mime_type="text/jsonl", purpose="batch")
    assert stores.stored.used("acme") == 100
    client.uploads.cancel(upload.id)
    client.files.delete(kept.id)
    assert stores.stored.used("acme") == 0
    client.files.create(file=("b.txt", b"b" * 100), purpose="user_data")


@pytest.mark.settings(policy_cache_seconds=0)
def test_a_disabled_tenant_is_refused_at_once_and_accepted_again_when_enabled(api_url, keys, other_client, stores):
    client = sdk(api_url, keys["acme"])
    client.files.list()
    auth.set_disabled(stores.keys, stores.tenants, "acme", True, now=1)
    with pytest.raises(openai.AuthenticationError) as info:
        client.files.list()
    error = info.value
    assert (error.status_code, error.type, error.code) == (401, "invalid_request_error", "account_deactivated")
    assert error.body["message"].startswith("This key is associated with a deactivated account.")
    other_client.files.list()
    auth.set_disabled(stores.keys, stores.tenants, "acme", False, now=2)
    assert client.files.list().data == []


def test_the_authorizer_denies_a_disabled_tenant_s_key_and_the_api_refuses_a_cached_allow(stores, keys):
    arn = "arn:aws:execute-api:us-east-1:123456789012:abc123/prod/GET/v1/files"
    event = {"type": "REQUEST", "methodArn": arn, "headers": {"Authorization": f"Bearer {keys['acme']}"}}
    assert (
        authorizer_handler.handler(event, LocalLambdaContext("a"))["policyDocument"]["Statement"][0]["Effect"]
        == "Allow"
    )
    auth.set_disabled(stores.keys, stores.tenants, "acme", True, now=1)
    denied = authorizer_handler.handler(event, LocalLambdaContext("a"))
    assert [s["Effect"] for s in denied["policyDocument"]["Statement"]] == ["Deny"]
    # API Gateway may still hold the Allow it cached for this key: the API itself refuses the
    # tenant once its policy cache has the disabled policy.
    deps.reset()  # a fresh API process: nothing cached yet
    proxy = {
        "resource": "/v1/{proxy+}",
        "path": "/v1/files",
        "httpMethod": "GET",
        "headers": {},
        "multiValueHeaders": {},
        "queryStringParameters": None,
        "pathParameters": {"proxy": "files"},
        "body": None,
        "isBase64Encoded": False,
        "requestContext": {"requestId": "r1", "stage": "prod", "authorizer": {"tenant": "acme", "principalId": "acme"}},
    }
    answer = api_handler.handler(proxy, LocalLambdaContext("api"))
    assert answer["statusCode"] == 401
    assert json.loads(answer["body"])["error"]["code"] == "account_deactivated"
