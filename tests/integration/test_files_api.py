"""Files API through the local front with the official openai SDK (and raw HTTP for exact errors)."""

import dataclasses
import json
import re
from urllib.parse import parse_qs, unquote, urlsplit

import openai
import pytest
from openai.types import FileDeleted, FileObject

from functions.core import deps, schema
from functions.reaper.logic import purge_removed
from infra.local.ttl import expire_once
from tests.helpers import assert_error, assert_openai_shape, sdk_client

JSONL = b'{"custom_id": "a", "method": "POST", "url": "/v1/chat/completions", "body": {}}\n'


def upload(raw, name="in.jsonl", content=JSONL, purpose="batch", **form):
    return raw.post("/files", files={"file": (name, content)}, data={"purpose": purpose, **form})


# --- create ------------------------------------------------------------------------------------
def test_create_batch_file_matches_openai_and_expires_in_30_days(raw, client):
    response = upload(raw)
    assert response.status_code == 200
    data = response.json()
    f = assert_openai_shape(FileObject, data)
    assert f.id.startswith("file-") and f.object == "file" and f.purpose == "batch"
    assert f.bytes == len(JSONL) and f.filename == "in.jsonl" and f.status == "processed"
    assert f.expires_at == f.created_at + 30 * 86_400
    assert client.files.retrieve(f.id) == f


@pytest.mark.parametrize("purpose", ["assistants", "fine-tune", "vision", "user_data", "evals"])
def test_other_purposes_never_expire_by_default(client, purpose):
    f = client.files.create(file=("data.bin", b"\x00\xffbinary"), purpose=purpose)
    assert f.purpose == purpose and f.expires_at is None
    assert client.files.content(f.id).content == b"\x00\xffbinary"


def test_expires_after_is_honoured(client):
    f = client.files.create(
        file=("x.jsonl", JSONL), purpose="batch", expires_after={"anchor": "created_at", "seconds": 7200}
    )
    assert f.expires_at == f.created_at + 7200


def test_bad_purpose(raw):
    assert_error(upload(raw, purpose="batchy"), 400, "invalid_value", "purpose", message="'batchy'")


@pytest.mark.parametrize("name", ["upload", "data.txt", "in.csv", "noext", "IN.JSONL"])
def test_a_batch_file_is_judged_by_its_content_not_its_name(raw, client, name):
    # "upload" is what the SDK's multipart sends for raw bytes (curator's upload); the lines are
    # judged when a batch is created from the file.
    response = upload(raw, name=name, content=JSONL.rstrip(b"\n"))
    assert response.status_code == 200, response.text
    f = client.files.retrieve(response.json()["id"])
    assert (f.filename, f.purpose, f.status, f.bytes) == (name, "batch", "processed", len(JSONL) - 1)
    assert client.files.content(f.id).content == JSONL.rstrip(b"\n")


def test_raw_bytes_through_the_sdk_are_a_file_named_upload(client):
    f = client.files.create(file=JSONL, purpose="batch")
    assert (f.filename, f.status) == ("upload", "processed")


def test_empty_file(raw):
    assert_error(upload(raw, content=b""), 400, "empty_file", "file")


@pytest.mark.settings(max_batch_file_bytes=100)
def test_batch_file_too_large(raw, client):
    assert_error(upload(raw, content=b"x" * 101), 400, "file_too_large", "file", message="at most 100 bytes")
    assert client.files.list().data == []  # nothing half-written is visible


@pytest.mark.parametrize(
    ("form", "param", "code"),
    [
        (
            {"expires_after[anchor]": "last_access", "expires_after[seconds]": "7200"},
            "expires_after.anchor",
            "invalid_value",
        ),
        (
            {"expires_after[anchor]": "created_at", "expires_after[seconds]": "60"},
            "expires_after.seconds",
            "invalid_value",
        ),
        (
            {"expires_after[anchor]": "created_at", "expires_after[seconds]": "2592001"},
            "expires_after.seconds",
            "invalid_value",
        ),
        ({"expires_after[anchor]": "created_at"}, "expires_after.seconds", "missing_required_parameter"),
        ({"expires_after[seconds]": "7200"}, "expires_after.anchor", "missing_required_parameter"),
        (
            {"expires_after[anchor]": "created_at", "expires_after[seconds]": "soon"},
            "expires_after[seconds]",
            "invalid_value",
        ),
    ],
)
def test_bad_expires_after(raw, form, param, code):
    assert_error(upload(raw, **form), 400, code, param)


def test_missing_file_and_purpose(raw):
    assert_error(raw.post("/files", files={"file": ("a.jsonl", JSONL)}), 400, "missing_required_parameter", "purpose")
    assert_error(
        raw.post("/files", data={"purpose": "batch"}, files={"x": ("a", b"1")}),
        400,
        "missing_required_parameter",
        "file",
    )


def test_request_over_lambda_payload_limit_is_413(raw):
    big = b"x" * (6 * 1024 * 1024)  # Lambda's 6 MB request limit, before base64 grows it
    assert_error(upload(raw, name="big.jsonl", content=big), 413, "request_too_large", None, message="Uploads API")


# --- auth and tenancy --------------------------------------------------------------------------
@pytest.mark.parametrize("header", [None, "Bearer", "Basic abc", "Bearer sk-unknown", "sk-local"])
def test_missing_malformed_or_unknown_key_is_401(api_url, header):
    from tests.helpers import raw_client

    with raw_client(api_url, None) as http:
        response = http.get("/files", headers={"Authorization": header} if header else {})
    assert_error(response, 401, "invalid_api_key", None)


def test_sdk_raises_authentication_error(api_url):
    bad = sdk_client(api_url, "sk-wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError) as info:
        bad.files.list()
    assert info.value.code == "invalid_api_key"


def test_another_tenants_file_is_indistinguishable_from_a_missing_one(client, other_client, raw):
    f = client.files.create(file=("mine.jsonl", JSONL), purpose="batch")
    for call in (other_client.files.retrieve, other_client.files.content, other_client.files.delete):
        with pytest.raises(openai.NotFoundError) as info:
            call(f.id)
        assert info.value.param == "file_id"
        assert f.id in info.value.message
    assert other_client.files.list().data == []
    assert client.files.retrieve(f.id).id == f.id  # untouched


@pytest.mark.parametrize("file_id", ["file-01m8n7xjx1bekcr5r3de2q3dfv", "file-nope", "batch_123"])
@pytest.mark.parametrize("suffix", ["", "/content"])
def test_unknown_or_malformed_id_is_404(raw, file_id, suffix):
    assert_error(raw.get(f"/files/{file_id}{suffix}"), 404, None, "file_id", message=f"No such File object: {file_id}")
    assert_error(raw.delete(f"/files/{file_id}"), 404, None, "file_id")


def test_unexpected_exception_is_a_500_server_error_envelope(raw, client, stores, monkeypatch):
    class BrokenFiles:
        def __getattr__(self, name):
            def fail(*args, **kwargs):
                raise RuntimeError("the store broke")

            return fail

    monkeypatch.setattr(deps, "stores", lambda: dataclasses.replace(stores, files=BrokenFiles()))
    error = assert_error(raw.get("/files"), 500, None, None)
    assert error["message"] == "The server had an error while processing your request."
    assert "broke" not in error["message"]  # internals are logged, not answered
    with pytest.raises(openai.InternalServerError):
        client.files.retrieve("file-01m8n7xjx1bekcr5r3de2q3dfv")


def test_unknown_route_is_openai_404(raw):
    assert_error(raw.get("/nope"), 404, None, None, message="Invalid URL (GET /v1/nope)")


# --- list and pagination ------------------------------------------------------------------------
def test_pagination_walks_a_long_list_in_both_orders(client):
    created = [client.files.create(file=(f"f{i}.jsonl", JSONL), purpose="batch").id for i in range(23)]
    assert created == sorted(created)  # ids sort by creation time
    for order, expected in (("desc", created[::-1]), ("asc", created)):
        seen, after, pages = [], None, 0
        while True:
            kwargs = {"after": after} if after else {}
            page = client.files.list(limit=5, order=order, **kwargs)
            pages += 1
            ids = [f.id for f in page.data]
            assert page.first_id == ids[0] and page.last_id == ids[-1]
            seen += ids
            if not page.has_more:
                break
            after = page.last_id
        assert seen == expected and pages == 5
    # the SDK's own auto-pagination walks the same list
    assert [f.id for f in client.files.list(limit=4)] == created[::-1]


def test_list_envelope_and_default_order(raw, client):
    a = client.files.create(file=("a.jsonl", JSONL), purpose="batch")
    b = client.files.create(file=("b.txt", b"hi"), purpose="user_data")
    body = raw.get("/files").json()
    assert set(body) == {"object", "data", "first_id", "last_id", "has_more"}
    assert body["object"] == "list" and body["has_more"] is False
    assert [f["id"] for f in body["data"]] == [b.id, a.id]
    for item in body["data"]:
        assert_openai_shape(FileObject, item)
    empty = raw.get("/files", params={"after": b.id, "order": "asc"}).json()
    assert empty == {"object": "list", "data": [], "first_id": None, "last_id": None, "has_more": False}


def test_list_filters_by_purpose(client):
    batch = [client.files.create(file=(f"{i}.jsonl", JSONL), purpose="batch").id for i in range(3)]
    client.files.create(file=("u.txt", b"u"), purpose="user_data")
    page = client.files.list(purpose="batch", limit=2)
    assert [f.id for f in page.data] == batch[::-1][:2] and page.has_more
    rest = client.files.list(purpose="batch", limit=2, after=page.last_id)
    assert [f.id for f in rest.data] == [batch[0]] and not rest.has_more
    assert client.files.list(purpose="batch_output").data == []


@pytest.mark.parametrize(
    ("params", "param"),
    [
        ({"limit": 0}, "limit"),
        ({"limit": 10_001}, "limit"),
        ({"limit": "many"}, "limit"),
        ({"order": "sideways"}, "order"),
        ({"after": "not-an-id"}, "after"),
        ({"purpose": "nope"}, "purpose"),
    ],
)
def test_bad_pagination_is_400(raw, params, param):
    assert_error(raw.get("/files", params=params), 400, "invalid_value", param)


# --- content ------------------------------------------------------------------------------------
#: A first Accept type in the API's binary media types: API Gateway hands such a client the bytes of
#: an inline (base64) body; any other client gets a redirect (docs/local.md).
BINARY_ACCEPT = {"Accept": "application/octet-stream"}


def test_content_is_returned_inline_byte_for_byte(raw, client):
    payload = bytes(range(256)) * 10
    f = client.files.create(file=("blob.bin", payload), purpose="user_data")
    response = raw.get(f"/files/{f.id}/content", headers=BINARY_ACCEPT)
    assert response.status_code == 200
    assert response.content == payload
    assert response.headers["content-type"] == "application/octet-stream"
    assert 'filename="blob.bin"' in response.headers["content-disposition"]


@pytest.mark.settings(inline_content_limit=10, presign_seconds=120)
def test_large_content_redirects_to_a_short_lived_presigned_url(raw, client, settings):
    f = client.files.create(file=("big.jsonl", JSONL), purpose="batch")
    response = raw.get(f"/files/{f.id}/content")
    assert response.status_code == 307
    location = urlsplit(response.headers["location"])
    assert location.path.endswith(schema.file_key("acme", f.id))
    query = parse_qs(location.query)
    assert query["X-Amz-Expires"] == ["120"]
    assert 'filename="big.jsonl"' in query["response-content-disposition"][0]


# --- hostile file names ---------------------------------------------------------------------------
#: RFC 5987 ext-value with charset UTF-8 and no language.
EXT_VALUE = re.compile(r"filename\*=UTF-8''([A-Za-z0-9!#$&+\-.^_`|~%]*)$", re.IGNORECASE)


def download_name(disposition: str) -> str:
    """The name an RFC 6266 recipient takes from a Content-Disposition: filename* if present, else
    the quoted filename. The header must be printable ASCII (it cannot split or fail to encode)."""
    assert all(" " <= c <= "~" for c in disposition), disposition
    assert disposition.startswith("attachment; ")
    match = EXT_VALUE.search(disposition)
    if match:
        return unquote(match.group(1), encoding="utf-8", errors="strict")
    return re.fullmatch(r'attachment; filename="([^"\\]*)"', disposition).group(1)


@pytest.mark.parametrize(
    "name",
    ["日本語 €.jsonl", "😀.jsonl", 'say "hi".jsonl', "back\\slash.jsonl", "x\r\nSet-Cookie: a=b.jsonl", "100%.jsonl"],
    ids=["non-latin-1", "emoji", "quotes", "backslash", "crlf", "percent"],
)
def test_any_name_the_sdk_sends_is_stored_retrieved_and_downloaded_safely(raw, client, name):
    """The SDK sends the name in a multipart header (quotes, CR, LF as %22, %0D, %0A, a backslash
    doubled: WHATWG form encoding); whatever name arrives is kept, and every call answers."""
    created = client.files.create(file=(name, JSONL), purpose="batch")
    if name.isprintable() and '"' not in name and "\\" not in name:
        assert created.filename == name  # any script round-trips exactly
    assert client.files.retrieve(created.id).filename == created.filename
    assert client.files.content(created.id).content == JSONL
    response = raw.get(f"/files/{created.id}/content", headers=BINARY_ACCEPT)
    assert response.status_code == 200 and response.content == JSONL
    assert download_name(response.headers["content-disposition"]) == created.filename
    assert "set-cookie" not in response.headers


@pytest.mark.settings(inline_content_limit=10)
def test_a_redirected_download_carries_the_same_safe_disposition(raw, client):
    name = 'rapport "final" 日本語.jsonl'
    created = client.files.create(file=(name, JSONL), purpose="batch")
    response = raw.get(f"/files/{created.id}/content")
    assert response.status_code == 307
    disposition = parse_qs(urlsplit(response.headers["location"]).query)["response-content-disposition"][0]
    assert download_name(disposition) == created.filename


def raw_multipart(raw, filename: bytes):
    body = (
        b'--XX\r\nContent-Disposition: form-data; name="purpose"\r\n\r\nbatch\r\n'
        b'--XX\r\nContent-Disposition: form-data; name="file"; filename="' + filename + b'"\r\n'
        b"Content-Type: application/octet-stream\r\n\r\n" + JSONL + b"\r\n--XX--\r\n"
    )
    return raw.post("/files", content=body, headers={"Content-Type": "multipart/form-data; boundary=XX"})


@pytest.mark.parametrize("filename", [b"nul\x00.jsonl", b"tab\t.jsonl", b"esc\x1b.jsonl"])
def test_a_raw_control_character_in_a_multipart_name_is_400(raw, stores, filename):
    assert_error(raw_multipart(raw, filename), 400, "invalid_value", "filename")
    assert stores.objects.list_keys("files/") == []


def test_a_multipart_name_that_is_not_utf8_is_400_not_500(raw, stores):
    response = raw_multipart(raw, b"caf\xe9.jsonl")  # Latin-1 bytes
    assert_error(response, 400, None)
    assert "multipart" in response.json()["error"]["message"]
    assert stores.objects.list_keys("files/") == []


def test_a_multipart_body_without_a_boundary_is_400_not_500(raw, stores):
    response = raw.post("/files", content=b"--XX\r\n", headers={"Content-Type": "multipart/form-data"})
    assert_error(response, 400, None)
    assert "boundary" in response.json()["error"]["message"]
    assert stores.objects.list_keys("files/") == []


# --- delete -------------------------------------------------------------------------------------
def test_delete_removes_record_and_bytes(raw, client, stores):
    f = client.files.create(file=("gone.jsonl", JSONL), purpose="batch")
    response = raw.delete(f"/files/{f.id}")
    assert response.status_code == 200
    assert assert_openai_shape(FileDeleted, response.json()) == FileDeleted(id=f.id, object="file", deleted=True)
    assert stores.objects.list_keys("files/") == []
    with pytest.raises(openai.NotFoundError):
        client.files.retrieve(f.id)
    with pytest.raises(openai.NotFoundError):
        client.files.delete(f.id)


# --- expiry -------------------------------------------------------------------------------------
def test_expired_files_disappear_and_their_bytes_are_removed(client, clock, stores, settings):
    short = client.files.create(
        file=("s.jsonl", JSONL), purpose="batch", expires_after={"anchor": "created_at", "seconds": 3600}
    )
    keep = client.files.create(file=("k.txt", b"keep"), purpose="user_data")
    clock.now += 3600
    with pytest.raises(openai.NotFoundError):
        client.files.retrieve(short.id)
    with pytest.raises(openai.NotFoundError):
        client.files.content(short.id)
    assert [f.id for f in client.files.list()] == [keep.id]
    # DynamoDB's TTL process (the local sweeper stands in for it) removes the item; the stream's
    # reaper removes the bytes.
    from functions.core import clients

    removed = expire_once(clients.dynamodb_table(settings.table_name), stores.objects, clock.now)
    assert removed == 1
    assert stores.objects.list_keys("files/") == [schema.file_key("acme", keep.id)]


def test_reaper_handler_deletes_bytes_of_removed_file_items(client, stores):
    from functions.reaper import handler as reaper
    from infra.local.lambda_context import LocalLambdaContext

    def image(file_id: str) -> dict:
        return {
            "pk": {"S": "T#acme"},
            "sk": {"S": f"FILE#{file_id}"},
            "s3_key": {"S": schema.file_key("acme", file_id)},
        }

    removed, inserted, modified = (client.files.create(file=(f"{n}.jsonl", JSONL), purpose="batch").id for n in "rim")
    event = {
        "Records": [
            {"eventName": "REMOVE", "dynamodb": {"OldImage": image(removed)}},
            # records of files that exist: their bytes must stay
            {"eventName": "INSERT", "dynamodb": {"NewImage": image(inserted)}},
            {"eventName": "MODIFY", "dynamodb": {"OldImage": image(modified), "NewImage": image(modified)}},
        ]
    }
    reaper.handler(event, LocalLambdaContext("reaper"))
    assert sorted(stores.objects.list_keys("files/")) == sorted(
        schema.file_key("acme", i) for i in (inserted, modified)
    )
    assert client.files.content(inserted).content == JSONL
    assert purge_removed(stores.objects, [{"sk": "UPLOAD#x", "s3_key": "whatever"}]) == []


def test_malformed_json_body_is_400(raw):
    response = raw.post("/uploads", content=b"{not json", headers={"Content-Type": "application/json"})
    error = assert_error(response, 400, None, None)
    assert "JSON" in error["message"]
    assert json.loads(response.text)["error"]["type"] == "invalid_request_error"
