"""The official SDK through the local front under API Gateway's rules (docs/local.md): files.content
with the SDK's own headers gets the exact bytes; other clients get a redirect instead of base64
text; every response (ours, the authorizer's, API Gateway's own) carries x-request-id, which the SDK
reads into ``_request_id`` and which the api Lambda logs as ``correlation_id``."""

from urllib.parse import urlsplit

import openai
import pytest
from openai import OpenAI

from functions.api import handler as api_handler
from functions.core import schema
from tests.integration.batch_helpers import line, submit

#: Every byte value, a NUL and invalid UTF-8 included.
BINARY = bytes(range(256)) * 3 + b"\x00\xff\xfe"


def test_files_content_with_the_sdks_headers_returns_the_exact_bytes(client):
    f = client.files.create(file=("blob.bin", BINARY), purpose="user_data")
    response = client.files.with_raw_response.content(f.id)
    assert response.http_request.headers["accept"] == "application/binary"  # the SDK's own header
    assert response.http_response.status_code == 200
    assert response.content == BINARY
    assert client.files.content(f.id).content == BINARY


def test_a_client_whose_first_accept_is_not_binary_is_redirected_not_sent_base64(raw, client):
    """curl's and browsers' ``*/*`` is no binary media type: API Gateway would send them the base64
    text of an inline body, so the API sends a presigned URL of the file instead, whatever its size."""
    f = client.files.create(file=("small.jsonl", b'{"a": 1}\n'), purpose="batch")
    for accept in ("*/*", "application/json", "text/plain, application/binary"):
        response = raw.get(f"/files/{f.id}/content", headers={"Accept": accept})
        assert response.status_code == 307, accept
        assert urlsplit(response.headers["location"]).path.endswith(schema.file_key("acme", f.id))
    inline = raw.get(f"/files/{f.id}/content", headers={"Accept": "application/octet-stream"})
    assert inline.status_code == 200 and inline.content == b'{"a": 1}\n'


def test_every_sdk_answer_carries_the_request_id_the_lambda_logged(client):
    created = client.files.create(file=("a.jsonl", b'{"a": 1}\n'), purpose="batch")
    assert created._request_id
    assert api_handler.logger.get_correlation_id() == created._request_id  # the same id in the logs
    listed = client.files.with_raw_response.list()
    assert listed.request_id and listed.request_id != created._request_id
    assert client.files.retrieve(created.id)._request_id
    batch = submit(client, (line(1) + "\n").encode())
    assert batch._request_id
    assert client.batches.retrieve(batch.id)._request_id


def test_errors_carry_the_request_id_too(client, api_url):
    with pytest.raises(openai.NotFoundError) as missing:
        client.files.retrieve("file-nope")
    assert missing.value.request_id
    with pytest.raises(openai.AuthenticationError) as bad_key:
        OpenAI(base_url=api_url, api_key="sk-wrong", max_retries=0).files.list()
    assert bad_key.value.request_id  # the authorizer's 401 is API Gateway's UNAUTHORIZED response
    assert bad_key.value.body["code"] == "invalid_api_key"
