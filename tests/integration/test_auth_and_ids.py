"""API keys (hash-only storage, authorizer answers) and time-sortable ids."""

import fnmatch
import time

import pytest

from functions.authorizer import handler as authorizer
from functions.core import auth, ids, schema
from functions.core.errors import AuthenticationFailed
from functions.core.records import key_id
from infra.local.lambda_context import LocalLambdaContext

ARN = "arn:aws:execute-api:us-east-1:123456789012:abc123/prod/GET/v1/files"


def test_keys_are_stored_only_as_hashes(stores, settings):
    from functions.core import clients

    key = auth.create_key(stores.keys, "acme", now=1)
    assert key.startswith("sk-") and len(key) > 40
    items = clients.dynamodb_table(settings.table_name).scan()["Items"]
    # The key item, its listing in the tenant's key partition and its id's lookup item.
    assert sorted(i["pk"] for i in items) == sorted(
        [schema.key_pk(auth.hash_key(key)), schema.tenant_keys_pk("acme"), schema.key_id_pk(key_id(auth.hash_key(key)))]
    )
    assert key not in str(items)
    (item,) = [i for i in items if i["pk"] == schema.key_pk(auth.hash_key(key))]
    assert item["key_hash"] == auth.hash_key(key) and item["hint"] == key[-4:]


def test_authorizer_allows_the_whole_api_and_passes_the_tenant(stores, clock):
    key = auth.create_key(stores.keys, "acme", now=1)
    clock.now = 1_234
    answer = authorizer.handler(
        {"headers": {"authorization": f"Bearer {key}"}, "methodArn": ARN}, LocalLambdaContext("a")
    )
    assert answer["principalId"] == "acme"
    assert answer["context"] == {"tenant": "acme", "authorized_at": 1_234}
    stage = "arn:aws:execute-api:us-east-1:123456789012:abc123/prod"
    # cached per key by API Gateway, so the policy must cover every method and route of the stage
    assert answer["policyDocument"]["Statement"] == [
        {"Action": "execute-api:Invoke", "Effect": "Allow", "Resource": [f"{stage}/*/*"]}
    ]
    for route in ("GET/v1/files", "POST/v1/batches/batch_x/cancel", "DELETE/v1/files/file-x", "GET/v1/models"):
        assert fnmatch.fnmatchcase(f"{stage}/{route}", f"{stage}/*/*")
    assert not fnmatch.fnmatchcase(f"{stage.replace('/prod', '/other')}/GET/v1/files", f"{stage}/*/*")


@pytest.mark.parametrize("header", [None, "", "Bearer ", "Token sk-x", "Bearer sk-unknown"])
def test_authorizer_rejects_with_unauthorized(stores, header):
    headers = {"Authorization": header} if header is not None else {}
    with pytest.raises(Exception, match=r"^Unauthorized$"):
        authorizer.handler({"headers": headers, "methodArn": ARN}, LocalLambdaContext("a"))


def test_revoked_key_no_longer_resolves(stores):
    key = auth.create_key(stores.keys, "acme", now=1)
    assert auth.resolve_tenant(stores.keys, f"Bearer {key}") == "acme"
    assert auth.revoke_key(stores.keys, key).tenant == "acme"
    with pytest.raises(AuthenticationFailed) as info:
        auth.resolve_tenant(stores.keys, f"Bearer {key}")
    assert info.value.status == 401 and info.value.code == "invalid_api_key"
    assert key not in info.value.message  # the key is masked in the message
    assert auth.revoke_key(stores.keys, key) is None


def test_seeding_a_known_key_is_idempotent_but_never_moves_tenants(stores):
    assert auth.create_key(stores.keys, "local", now=1, key="sk-local") == "sk-local"
    assert auth.create_key(stores.keys, "local", now=2, key="sk-local") == "sk-local"
    with pytest.raises(ValueError, match="another tenant"):
        auth.create_key(stores.keys, "other", now=3, key="sk-local")


@pytest.mark.parametrize("tenant", ["", "-x", "a b", "x" * 65, "t#1"])
def test_bad_tenant_names(stores, tenant):
    with pytest.raises(ValueError, match="invalid tenant"):
        auth.create_key(stores.keys, tenant, now=1)


def test_ids_sort_by_creation_time_and_have_openai_prefixes():
    now = time.time_ns() // 1_000_000
    made = [ids.new_id(ids.FILE, now + i) for i in range(0, 5000, 7)]
    assert made == sorted(made)
    assert len(set(ids.new_id(ids.BATCH, now) for _ in range(1000))) == 1000
    for prefix in (ids.FILE, ids.UPLOAD, ids.PART, ids.BATCH, ids.BATCH_REQUEST):
        value = ids.new_id(prefix)
        assert value.startswith(prefix) and ids.is_valid(value, prefix)
    assert not ids.is_valid("file-abc", ids.FILE)
    assert not ids.is_valid(ids.new_id(ids.BATCH), ids.FILE)
    assert not ids.is_valid(ids.new_id(ids.FILE).upper(), ids.FILE)


def _multipart(fields: dict[str, tuple[str, bytes] | str]) -> tuple[bytes, str]:
    from urllib3 import encode_multipart_formdata

    return encode_multipart_formdata(fields)


@pytest.mark.parametrize(
    ("method", "path", "body"),
    [
        ("POST", "/v1/files", _multipart({"purpose": "batch", "file": ("a.jsonl", b"{}\n")})),
        ("GET", "/v1/files", None),
        ("GET", "/v1/files/file-01m8n7xjx1bekcr5r3de2q3dfv", None),
        ("GET", "/v1/files/file-01m8n7xjx1bekcr5r3de2q3dfv/content", None),
        ("DELETE", "/v1/files/file-01m8n7xjx1bekcr5r3de2q3dfv", None),
        (
            "POST",
            "/v1/uploads",
            ({"filename": "a.jsonl", "purpose": "batch", "bytes": 3, "mime_type": "text/plain"}, "application/json"),
        ),
        ("POST", "/v1/uploads/upload_01m8n7xjx1bekcr5r3de2q3dfv/parts", _multipart({"data": ("blob", b"abc")})),
        (
            "POST",
            "/v1/uploads/upload_01m8n7xjx1bekcr5r3de2q3dfv/complete",
            ({"part_ids": ["part_x"]}, "application/json"),
        ),
        ("POST", "/v1/uploads/upload_01m8n7xjx1bekcr5r3de2q3dfv/cancel", None),
        (
            "POST",
            "/v1/batches",
            (
                {"input_file_id": "file-x", "endpoint": "/v1/chat/completions", "completion_window": "24h"},
                "application/json",
            ),
        ),
        ("GET", "/v1/batches", None),
        ("GET", "/v1/batches/batch_01m8n7xjx1bekcr5r3de2q3dfv", None),
        ("POST", "/v1/batches/batch_01m8n7xjx1bekcr5r3de2q3dfv/cancel", None),
        ("GET", "/v1/models", None),
        ("GET", "/v1/models/test-chat", None),
    ],
)
def test_api_answers_401_when_the_authorizer_context_has_no_tenant(stores, method, path, body):
    """Defence in depth: the api handler trusts only the authorizer's tenant, and has none here."""
    import json

    import httpx2

    from functions.api import handler as api_handler
    from infra.local.front import LocalApi
    from tests.helpers import assert_error

    def allow_without_tenant(event, context):
        return {"principalId": "someone", "policyDocument": {"Statement": [{"Effect": "Allow"}]}, "context": {}}

    headers = {"Authorization": "Bearer sk-anything"}
    payload = b""
    if isinstance(body, tuple) and isinstance(body[0], dict):
        payload, headers["Content-Type"] = json.dumps(body[0]).encode(), body[1]
    elif body is not None:
        payload, headers["Content-Type"] = body
    status, _, raw = LocalApi(api_handler.handler, allow_without_tenant).handle(method, path, headers, payload)
    assert_error(httpx2.Response(status, content=raw), 401, "invalid_api_key", None, message="API key")
