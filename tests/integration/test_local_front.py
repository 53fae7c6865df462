"""The local front (infra/local/front.py) and the Lambda front (infra/local/lambda_front.py)
answer whatever their handler returns or raises: never a dropped connection. A header value
http.server cannot send (CR/LF, NUL, not Latin-1) is API Gateway's 502 for a malformed Lambda
response, not an exception mid-response.

Then API Gateway's rules, one test (at least) per row of docs/local.md: binary media types both
ways, payload quotas, the integration timeout, multi-value headers and query strings, header names
as sent, its own rejections in OpenAI's envelope with x-request-id."""

import base64
import json
import socket
import threading

import httpx2
import pytest

from functions.core import http as http_contract
from infra.local.front import LocalApi, make_server
from infra.local.lambda_front import invoke


def allow(event, context):
    return {
        "principalId": "acme",
        "policyDocument": {"Statement": [{"Effect": "Allow"}]},
        "context": {"tenant": "acme"},
    }


@pytest.fixture
def serve():
    servers = []

    def start(api_handler):
        server = make_server(LocalApi(api_handler, allow), "127.0.0.1", 0)
        threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True).start()
        servers.append(server)
        return f"http://127.0.0.1:{server.server_address[1]}"

    yield start
    for server in servers:
        server.shutdown()
        server.server_close()


def returning(headers, status=200):
    return lambda event, context: {"statusCode": status, "headers": headers, "body": "ok"}


def raising(event, context):
    raise RuntimeError("the handler failed")


@pytest.mark.parametrize(
    "handler",
    [
        returning({"Content-Disposition": 'attachment; filename="a\r\nSet-Cookie: x=1"'}),
        returning({"Content-Disposition": 'attachment; filename="日本語.jsonl"'}),
        returning({"X-Nul": "a\x00b"}),
        returning({"X-Bad\r\nName": "v"}),
        returning({}, status=1000),
        lambda event, context: {"headers": {}},  # no statusCode
        lambda event, context: None,
        raising,
    ],
    ids=["crlf", "non-latin-1", "nul", "bad-name", "bad-status", "no-status", "none", "raises"],
)
def test_a_handler_result_that_cannot_be_sent_is_a_502_on_a_live_connection(serve, handler):
    url = serve(handler)
    with httpx2.Client(base_url=url, headers={"Authorization": "Bearer k"}, timeout=10) as http:
        response = http.get("/v1/files")
        # API Gateway's 502 for a failed or malformed Lambda, through the stack's DEFAULT_5XX response
        assert response.status_code == 502 and response.json() == {
            "error": {"message": "Internal server error", "type": "server_error", "param": None, "code": None}
        }
        assert response.headers["x-request-id"]
        assert "set-cookie" not in response.headers
        again = http.get("/v1/files")  # the same keep-alive connection still answers
        assert again.status_code == 502


def test_a_sendable_result_is_passed_through(serve):
    url = serve(returning({"Content-Disposition": 'attachment; filename="caf\xe9.jsonl"', "X-A": "b"}))
    response = httpx2.get(f"{url}/v1/files", headers={"Authorization": "Bearer k"}, timeout=10)
    assert response.status_code == 200 and response.text == "ok" and response.headers["x-a"] == "b"


def test_the_lambda_front_reports_a_result_that_is_not_json_as_a_function_error():
    status, headers, body = invoke({"f": lambda event, context: {"x": object()}}, "f", b"{}")
    assert status == 200 and ("X-Amz-Function-Error", "Unhandled") in headers
    assert json.loads(body)["errorType"] == "TypeError"


def test_a_malformed_content_length_is_answered_400(serve):
    url = serve(returning({}))
    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(b"POST /v1/files HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer k\r\nContent-Length: abc\r\n\r\n")
        answer = b""
        while piece := sock.recv(65536):  # the front closes the connection after answering
            answer += piece
    assert answer.startswith(b"HTTP/1.1 400 ") and b'{"message": "Bad Request"}' in answer


# --- API Gateway's rules (docs/local.md) ------------------------------------------------------------


class Recorder:
    """An api handler that records its events and answers what the test tells it."""

    def __init__(self, answer=None):
        self.events = []
        self.answer = answer or (
            lambda event: {"statusCode": 200, "headers": {"Content-Type": "application/json"}, "body": "{}"}
        )

    def __call__(self, event, context):
        self.events.append(event)
        return self.answer(event)


def front(handler, authorizer=allow, **options):
    return LocalApi(handler, authorizer, **options)


def call(api, method="GET", target="/v1/files", headers=(("Authorization", "Bearer k"),), body=b""):
    status, headers_out, payload = api.handle(method, target, list(headers), body)
    return status, headers_out, payload


def header(headers_out, name):
    values = [v for k, v in headers_out if k.lower() == name.lower()]
    return values


#: Specific binary media types, to hold the two conversion rules apart from the stack's ``*/*``.
SPECIFIC = ("multipart/form-data", "application/octet-stream", "application/binary")


@pytest.mark.parametrize(
    ("content_type", "encoded"),
    [
        ("application/json", False),
        ("text/plain; charset=utf-8", False),
        ("application/octet-stream", True),
        ("Multipart/Form-Data; boundary=xyz", True),
        ("application/binary", True),
        (None, False),
    ],
)
def test_the_request_body_is_base64_iff_its_content_type_is_a_binary_media_type(content_type, encoded):
    recorder = Recorder()
    headers = [("Authorization", "Bearer k")] + ([("Content-Type", content_type)] if content_type else [])
    body = b"\x00\xff{}"
    call(front(recorder, binary_media_types=SPECIFIC), "POST", "/v1/files", headers, body)
    (event,) = recorder.events
    assert event["isBase64Encoded"] is encoded
    assert event["body"] == (base64.b64encode(body).decode() if encoded else body.decode("utf-8", "replace"))


@pytest.mark.parametrize("content_type", ["application/json", "text/plain", "multipart/form-data; boundary=b"])
def test_under_the_stacks_media_types_every_body_with_a_content_type_is_base64(content_type):
    recorder = Recorder()
    call(front(recorder), "POST", "/v1/batches", [("Authorization", "Bearer k"), ("Content-Type", content_type)], b"{}")
    (event,) = recorder.events
    assert (event["isBase64Encoded"], event["body"]) == (True, base64.b64encode(b"{}").decode())


BINARY = bytes(range(256))


def binary_answer(event):
    return {
        "statusCode": 200,
        "multiValueHeaders": {"Content-Type": ["application/octet-stream"]},
        "body": base64.b64encode(BINARY).decode(),
        "isBase64Encoded": True,
    }


@pytest.mark.parametrize(
    ("accept", "gets_bytes"),
    [
        ("application/binary", True),  # what the official SDK sends for files.content
        ("application/octet-stream;q=0.9", True),
        ("application/binary, */*", True),
        ("*/*", False),  # a wildcard Accept matches only a */* entry
        ("application/json, application/binary", False),  # only the FIRST Accept type counts
        (None, False),
    ],
)
def test_a_base64_response_is_bytes_only_when_the_first_accept_type_is_binary(accept, gets_bytes):
    headers = [("Authorization", "Bearer k")] + ([("Accept", accept)] if accept else [])
    status, _, payload = call(front(Recorder(binary_answer), binary_media_types=SPECIFIC), headers=headers)
    assert status == 200
    assert payload == (BINARY if gets_bytes else base64.b64encode(BINARY))


@pytest.mark.parametrize(
    ("accept", "gets_bytes"),
    [
        ("application/binary", True),
        ("*/*", True),
        ("text/html, application/xhtml+xml, */*;q=0.8", True),
        ("application/json", True),
        (None, False),
    ],
)
def test_under_the_stacks_media_types_a_base64_response_is_bytes_for_any_accept(accept, gets_bytes):
    headers = [("Authorization", "Bearer k")] + ([("Accept", accept)] if accept else [])
    status, _, payload = call(front(Recorder(binary_answer)), headers=headers)
    assert status == 200
    assert payload == (BINARY if gets_bytes else base64.b64encode(BINARY))


def test_a_response_with_both_header_maps_is_merged_and_repeated_names_are_separate_lines(serve):
    def answer(event):
        return {
            "statusCode": 200,
            "headers": {"X-One": "1", "Set-Cookie": "ignored=1"},
            "multiValueHeaders": {"Set-Cookie": ["a=1", "b=2"]},
            "body": "ok",
        }

    status, headers_out, _ = call(front(Recorder(answer)))
    assert status == 200
    assert header(headers_out, "X-One") == ["1"]
    assert header(headers_out, "Set-Cookie") == ["a=1", "b=2"]  # multiValueHeaders wins for a name in both
    url = serve(Recorder(answer))
    response = httpx2.get(f"{url}/v1/files", headers={"Authorization": "Bearer k"}, timeout=10)
    assert response.headers.get_list("set-cookie") == ["a=1", "b=2"]


def test_repeated_headers_and_query_parameters_reach_the_lambda_in_both_views():
    recorder = Recorder()
    headers = [("Authorization", "Bearer k"), ("X-Multi", "1"), ("X-Multi", "2"), ("X-MiXeD-Case", "v")]
    call(front(recorder), target="/v1/files?a=1&a=2&b=&c=x%20y", headers=headers)
    (event,) = recorder.events
    assert event["headers"]["X-Multi"] == "2"  # the last value
    assert event["multiValueHeaders"]["X-Multi"] == ["1", "2"]
    assert event["headers"]["X-MiXeD-Case"] == "v"  # header names as the client sent them
    assert event["queryStringParameters"] == {"a": "2", "b": "", "c": "x y"}
    assert event["multiValueQueryStringParameters"] == {"a": ["1", "2"], "b": [""], "c": ["x y"]}
    assert event["pathParameters"] == {"proxy": "files"}
    assert event["requestContext"]["authorizer"]["tenant"] == "acme"


def test_no_query_string_is_null_in_both_views():
    recorder = Recorder()
    call(front(recorder))
    assert recorder.events[0]["queryStringParameters"] is None
    assert recorder.events[0]["multiValueQueryStringParameters"] is None


def envelope(payload):
    body = json.loads(payload)
    assert set(body) == {"error"} and set(body["error"]) == {"message", "type", "param", "code"}
    return body["error"]


def test_a_request_over_api_gateways_10_mb_is_its_413_and_never_reaches_the_lambda():
    recorder = Recorder()
    api = front(recorder)
    assert api.payload_limit == 10 * 1024 * 1024
    headers = [("Authorization", "Bearer k"), ("Content-Type", "application/octet-stream")]
    status, headers_out, payload = call(api, "POST", "/v1/files", headers, b"x" * (10 * 1024 * 1024 + 1))
    assert status == 413 and recorder.events == []
    error = envelope(payload)
    assert error["code"] == "request_too_large" and error["type"] == "invalid_request_error"
    assert str(10 * 1024 * 1024) in error["message"] and "upload_file_chunked" in error["message"]
    assert header(headers_out, "x-request-id")


def test_an_event_over_lambdas_6_mb_is_refused_before_the_lambda():
    recorder = Recorder()
    headers = [("Authorization", "Bearer k"), ("Content-Type", "application/octet-stream")]
    # 4.5 MiB of bytes: under API Gateway's 10 MB, but 6 MiB once base64-encoded in the event
    status, _, payload = call(front(recorder), "POST", "/v1/files", headers, b"x" * (4608 * 1024))
    assert status == 413 and recorder.events == []
    assert envelope(payload)["code"] == "request_too_large"


@pytest.mark.parametrize(("extra", "status"), [(-1024, 200), (1, 502)])
def test_a_lambda_response_over_6_mb_is_a_502(extra, status):
    def answer(event):
        response = {"statusCode": 200, "headers": {}, "body": ""}
        overhead = len(json.dumps(response))
        response["body"] = "x" * (6 * 1024 * 1024 - overhead + extra)
        return response

    got, _, payload = call(front(Recorder(answer)))
    assert got == status
    if status == 502:
        assert envelope(payload) == {
            "message": "Internal server error",
            "type": "server_error",
            "param": None,
            "code": None,
        }


def test_the_lambda_gets_29_s_then_the_client_gets_504_endpoint_request_timed_out():
    assert front(Recorder()).integration_timeout == 29
    release = threading.Event()

    def slow(event, context):
        release.wait(30)
        return {"statusCode": 200, "body": "late"}

    try:
        status, headers_out, payload = call(front(slow, integration_timeout=0.2))
    finally:
        release.set()
    assert status == 504
    assert envelope(payload) == {
        "message": "Endpoint request timed out",
        "type": "server_error",
        "param": None,
        "code": "timeout",
    }
    assert header(headers_out, "x-request-id")


def deny(event, context):
    return {"principalId": "x", "policyDocument": {"Statement": [{"Effect": "Deny"}]}}


def unauthorized(event, context):
    raise Exception("Unauthorized")


def broken(event, context):
    raise RuntimeError("the key table is throttled")


@pytest.mark.parametrize(
    ("authorizer", "headers", "status", "error_type", "code"),
    [
        (allow, [], 401, "invalid_request_error", "invalid_api_key"),  # no identity source: no authorizer call
        (unauthorized, [("Authorization", "Bearer bad")], 401, "invalid_request_error", "invalid_api_key"),
        # The authorizer denies only a disabled tenant's key: OpenAI's deactivated-account answer.
        (deny, [("Authorization", "Bearer bad")], 401, "invalid_request_error", "account_deactivated"),
        (broken, [("Authorization", "Bearer k")], 500, "server_error", None),
    ],
    ids=["missing", "unauthorized", "deny", "authorizer-fails"],
)
def test_the_authorizers_answers_are_the_stacks_gateway_responses(authorizer, headers, status, error_type, code):
    recorder = Recorder()
    got, headers_out, payload = call(front(recorder, authorizer), headers=headers)
    assert got == status and recorder.events == []
    error = envelope(payload)
    assert (error["type"], error["code"]) == (error_type, code)
    assert header(headers_out, "x-request-id") and header(headers_out, "content-type") == ["application/json"]


@pytest.mark.parametrize("target", ["/", "/v2/files", "/v1", "/v1/"])
def test_a_path_outside_v1_proxy_is_api_gateways_403_missing_authentication_token(target):
    recorder = Recorder()
    status, _, payload = call(front(recorder), target=target)
    assert status == 403 and recorder.events == []
    assert envelope(payload) == {
        "message": "Missing Authentication Token",
        "type": "invalid_request_error",
        "param": None,
        "code": None,
    }


def test_every_gateway_response_the_front_renders_is_the_stacks_template():
    """The front renders http.GATEWAY_ERRORS, which infra/constructs/api.py synthesizes: same status,
    same body (API Gateway's message substituted), Retry-After on 429s."""
    api = front(Recorder())
    for kind, error in http_contract.GATEWAY_ERRORS.items():
        if error.status is None:
            continue
        status, headers_out, payload = api.gateway(kind, "req-1", "API Gateway's message")
        rendered = json.loads(
            error.template().replace("$context.error.messageString", json.dumps("API Gateway's message"))
        )
        assert status == error.status and json.loads(payload) == rendered
        assert header(headers_out, "x-request-id") == ["req-1"]
        assert header(headers_out, "Retry-After") == (
            [str(error.retry_after_seconds)] if error.retry_after_seconds else []
        )
    status, headers_out, payload = api.gateway("THROTTLED", "req-2", "Too Many Requests")
    assert status == 429 and header(headers_out, "Retry-After") == ["1"]
    assert envelope(payload)["type"] == "rate_limit_error" and envelope(payload)["code"] == "rate_limit_exceeded"


def test_an_invalid_base64_body_for_a_binary_accept_is_api_gateways_500():
    def answer(event):
        return {"statusCode": 200, "body": "not base64!", "isBase64Encoded": True}

    status, _, payload = call(
        front(Recorder(answer)), headers=[("Authorization", "Bearer k"), ("Accept", "application/binary")]
    )
    assert status == 500 and envelope(payload)["type"] == "server_error"


def test_the_api_lambdas_context_reports_the_integration_timeout_as_its_time_left():
    seen = []

    def handler(event, context):
        seen.append(context.get_remaining_time_in_millis())
        return {"statusCode": 200, "body": ""}

    call(front(handler))
    assert 0 < seen[0] <= 29_000


def test_a_hundred_clients_connecting_at_once_are_all_answered_on_kept_alive_connections():
    # Every client connects before the server accepts anyone (serve_forever not yet running): the
    # kernel's listen backlog holds them all. socketserver's default backlog of 5 would leave the
    # rest unanswered (dropped SYNs, then resets) when a few dozen clients arrive together.
    server = make_server(LocalApi(returning({}), allow), "127.0.0.1", 0)
    port = server.server_address[1]
    sockets = []
    try:
        for _ in range(100):
            sock = socket.create_connection(("127.0.0.1", port), timeout=5)
            sockets.append(sock)
        threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True).start()
        request = b"GET /v1/files HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer k\r\n\r\n"
        for _ in range(2):  # twice on each connection: kept alive
            for sock in sockets:
                sock.sendall(request)
            for sock in sockets:
                head = b""
                while b"\r\n\r\n" not in head:
                    head += sock.recv(4096)
                assert head.startswith(b"HTTP/1.1 200"), head
                length = int(
                    next(
                        v
                        for k, v in (line.split(b": ", 1) for line in head.split(b"\r\n")[1:] if b": " in line)
                        if k.lower() == b"content-length"
                    )
                )
                body = head.split(b"\r\n\r\n", 1)[1]
                while len(body) < length:
                    body += sock.recv(4096)
                assert body == b"ok"
    finally:
        for sock in sockets:
            sock.close()
        server.shutdown()
        server.server_close()


def _chunked(body: bytes, size: int) -> bytes:
    pieces = [body[i : i + size] for i in range(0, len(body), size)]
    return b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in pieces) + b"0\r\n\r\n"


def _post_chunked(port: int, body: bytes, size: int) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port), timeout=10)
    sock.sendall(
        b"POST /v1/files HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer k\r\nContent-Type: text/plain\r\n"
        b"Transfer-Encoding: chunked\r\n\r\n" + _chunked(body, size)
    )
    return sock


def _read_answer(sock: socket.socket) -> tuple[bytes, bytes]:
    data = b""
    while b"\r\n\r\n" not in data:
        data += sock.recv(65536)
    head, body = data.split(b"\r\n\r\n", 1)
    length = int(
        next(line.split(b":", 1)[1] for line in head.split(b"\r\n") if line.lower().startswith(b"content-length:"))
    )
    while len(body) < length:
        body += sock.recv(65536)
    return head, body


def received(event):
    """The request body as the Lambda's code reads it (powertools' ``decoded_body``)."""
    body = (event["body"] or "").encode()
    return base64.b64decode(body) if event["isBase64Encoded"] else body


def test_a_chunked_request_body_reaches_the_lambda_whole_and_the_connection_stays_usable():
    # The Node SDK streams fs.createReadStream uploads with Transfer-Encoding: chunked; API Gateway
    # hands the integration the whole body (its quota applies to it) without that header.
    seen = []

    def echo(event, context):
        seen.append(event)
        return {"statusCode": 200, "headers": {}, "body": str(len(received(event)))}

    server = make_server(LocalApi(echo, allow, payload_limit=1000), "127.0.0.1", 0)
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True).start()
    try:
        body = b"x" * 700
        sock = _post_chunked(server.server_address[1], body, 64)
        head, answer = _read_answer(sock)
        assert head.startswith(b"HTTP/1.1 200") and answer == b"700"
        assert received(seen[0]) == body
        assert "transfer-encoding" not in {k.lower() for k in seen[0]["headers"]}
        sock.sendall(b"GET /v1/files HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer k\r\n\r\n")  # kept alive
        head, answer = _read_answer(sock)
        assert head.startswith(b"HTTP/1.1 200") and answer == b"0"
        sock.close()
        over = _post_chunked(server.server_address[1], b"y" * 1500, 100)
        head, answer = _read_answer(over)
        assert head.startswith(b"HTTP/1.1 413") and json.loads(answer)["error"]["code"] == "request_too_large"
        assert len(seen) == 2  # the oversized body never reached the Lambda
        over.close()
        bad = socket.create_connection(("127.0.0.1", server.server_address[1]), timeout=10)
        bad.sendall(
            b"POST /v1/files HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer k\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n"
        )
        head, answer = _read_answer(bad)
        assert head.startswith(b"HTTP/1.1 400")
        bad.close()
    finally:
        server.shutdown()
        server.server_close()


@pytest.mark.parametrize("method", ["TRACE", "FOO", "PROPFIND"])
def test_a_method_api_gateway_does_not_have_is_its_403_json_not_a_501_page(serve, method):
    url = serve(returning({}))
    with httpx2.Client(base_url=url, headers={"Authorization": "Bearer k"}, timeout=10) as http:
        response = http.request(method, "/v1/files")
    assert response.status_code == 403 and response.headers["content-type"] == "application/json"
    assert response.json()["error"]["message"] == "Missing Authentication Token"


def test_head_and_options_reach_the_lambda_and_head_has_no_body(serve):
    methods = []

    def record(event, context):
        methods.append(event["httpMethod"])
        return {"statusCode": 200, "headers": {}, "body": "ok"}

    url = serve(record)
    with httpx2.Client(base_url=url, headers={"Authorization": "Bearer k"}, timeout=10) as http:
        head = http.head("/v1/files")
        options = http.options("/v1/files")
        after = http.get("/v1/files")  # the connection is still in step
    assert methods == ["HEAD", "OPTIONS", "GET"]
    assert (head.status_code, head.content, head.headers["content-length"]) == (200, b"", "2")
    assert (options.content, after.content) == (b"ok", b"ok")
