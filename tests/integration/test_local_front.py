"""The local front (infra/local/front.py) and the Lambda front (infra/local/lambda_front.py)
answer whatever their handler returns or raises: never a dropped connection. A header value
http.server cannot send (CR/LF, NUL, not Latin-1) is API Gateway's 502 for a malformed Lambda
response, not an exception mid-response."""

import json
import socket
import threading

import httpx2
import pytest

from infra.local.front import LocalApi, make_server
from infra.local.lambda_front import invoke


def allow(event, context):
    return {"principalId": "acme", "policyDocument": {"Statement": [{"Effect": "Allow"}]}, "context": {"tenant": "acme"}}


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
        assert response.status_code == 502 and response.json() == {"message": "Internal server error"}
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
