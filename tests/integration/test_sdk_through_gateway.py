"""The official SDK through the local front under API Gateway's rules (docs/local.md): files.content
with the SDK's own headers gets the exact bytes, and so does any other Accept (a request with none
is redirected instead of sent base64 text); every response (ours, the authorizer's, API Gateway's
own) carries x-request-id, which the SDK reads into ``_request_id`` and which the api Lambda logs
as ``correlation_id``."""

from urllib.parse import urlsplit

import openai
import pytest
from openai import OpenAI

from functions.api import handler as api_handler
from functions.authorizer import handler as authorizer_handler
from functions.core import schema
from tests.helpers import sdk_client
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


def test_any_accept_gets_the_bytes_inline_and_no_accept_gets_a_redirect(raw, client):
    """curl's ``*/*``, a browser's ``text/html, ...``, ``application/json``: every first ``Accept``
    matches the API's ``*/*`` binary media type, so the inline answer reaches them as bytes. A
    request with no ``Accept`` would get the base64 text, so it gets a presigned URL instead."""
    data = b'{"a": 1}\n\x00\xff'
    f = client.files.create(file=("small.jsonl", data), purpose="batch")
    for accept in (
        "*/*",
        "application/json",
        "text/html, application/xhtml+xml, */*;q=0.8",
        "application/octet-stream",
    ):
        inline = raw.get(f"/files/{f.id}/content", headers={"Accept": accept})
        assert (inline.status_code, inline.content) == (200, data), accept
    bare = raw.build_request("GET", f"/files/{f.id}/content")
    del bare.headers["accept"]
    response = raw.send(bare)
    assert response.status_code == 307
    assert urlsplit(response.headers["location"]).path.endswith(schema.file_key("acme", f.id))


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
        sdk_client(api_url, "sk-wrong", max_retries=0).files.list()
    assert bad_key.value.request_id  # the authorizer's 401 is API Gateway's UNAUTHORIZED response
    assert authorizer_handler.logger.get_correlation_id() == bad_key.value.request_id  # and its log lines
    assert bad_key.value.body["code"] == "invalid_api_key"


class ManualClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def throttled(aws, keys):
    """The front with API Gateway's stage throttling on: 1 request per second, a burst of 2."""
    import threading

    from functions.authorizer import handler as authorizer_handler
    from infra.local.front import LocalApi, make_server

    clock = ManualClock()
    server = make_server(
        LocalApi(api_handler.handler, authorizer_handler.handler, throttle=(1.0, 2), clock=clock), "127.0.0.1", 0
    )
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True).start()
    yield sdk_client(f"http://127.0.0.1:{server.server_address[1]}/v1", keys["acme"], max_retries=0), clock
    server.shutdown()
    server.server_close()


def test_api_gateways_throttling_reaches_the_sdk_as_a_rate_limit_error_with_retry_after(throttled):
    client, clock = throttled
    client.files.list()
    client.files.list()  # the burst
    with pytest.raises(openai.RateLimitError) as limited:
        client.files.list()
    error = limited.value
    assert error.status_code == 429 and error.request_id
    assert error.body == {
        "message": error.body["message"],
        "type": "rate_limit_error",
        "param": None,
        "code": "rate_limit_exceeded",
    }
    assert error.response.headers["retry-after"] == "1"
    clock.now += 1.0  # the bucket refills one request per second
    assert client.files.list()._request_id


def test_the_largest_inline_file_fits_lambdas_6_mb_answer_and_comes_back_exact(client):
    """4 MiB (the inline limit, README) is about 5.6 MB once base64-encoded in the Lambda's answer:
    under Lambda's 6 MB, so the front (which 502s an answer over it) hands the SDK the exact bytes."""
    import os

    payload = os.urandom(4 * 1024 * 1024)
    f = client.files.create(file=("edge.bin", payload), purpose="user_data")
    response = client.files.with_raw_response.content(f.id)
    assert response.http_response.status_code == 200  # inline, not a redirect
    assert response.content == payload
