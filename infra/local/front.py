"""The local HTTP front: what API Gateway does for the deployed API, on 127.0.0.1.

Each HTTP request becomes an API Gateway REST proxy event. The authorizer handler runs first (a
REQUEST authorizer, identity source ``Authorization``); its context lands in
``requestContext.authorizer`` as API Gateway puts it there. Binary bodies are base64-encoded as
API Gateway does for its binary media types; Lambda's payload limit is enforced. Whatever the
handler returns or raises, the client gets an answer (502 as API Gateway gives for a failed or
malformed Lambda response), never a dropped connection.
"""

import base64
import json
import time
import uuid
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

from functions.core import http, limits
from functions.core.errors import UNAUTHORIZED_BODY, PayloadTooLarge

from .lambda_context import LocalLambdaContext

Handler = Callable[[dict[str, Any], Any], Any]

STAGE = "local"
API_ID = "local"
ACCOUNT = "123456789012"
#: API Gateway's answer when the Lambda fails or returns a malformed proxy response (502).
INTERNAL_ERROR_BODY = {"message": "Internal server error"}


def _is_binary(content_type: str) -> bool:
    return any(content_type.lower().startswith(t) for t in http.BINARY_MEDIA_TYPES)


class LocalApi:
    """Turns HTTP requests into authorizer + proxy events and Lambda results into responses."""

    def __init__(self, api_handler: Handler, authorizer_handler: Handler):
        self._api = api_handler
        self._authorizer = authorizer_handler

    def handle(self, method: str, target: str, headers: dict[str, str], body: bytes) -> tuple[int, dict[str, str], bytes]:
        split = urlsplit(target)
        path = split.path
        query = parse_qs(split.query, keep_blank_values=True)
        request_id = str(uuid.uuid4())
        method_arn = f"arn:aws:execute-api:us-east-1:{ACCOUNT}:{API_ID}/{STAGE}/{method}{path}"

        authorization = next((v for k, v in headers.items() if k.lower() == http.AUTH_HEADER.lower()), None)
        if not authorization:
            return self._json(401, UNAUTHORIZED_BODY)
        auth_event = {
            "type": "REQUEST",
            "methodArn": method_arn,
            "resource": "/{proxy+}",
            "path": path,
            "httpMethod": method,
            "headers": headers,
            "queryStringParameters": {k: v[-1] for k, v in query.items()} or None,
            "requestContext": {"requestId": request_id, "stage": STAGE, "apiId": API_ID},
        }
        try:
            policy = self._authorizer(auth_event, LocalLambdaContext("authorizer"))
        except Exception:
            return self._json(401, UNAUTHORIZED_BODY)
        if policy["policyDocument"]["Statement"][0]["Effect"] != "Allow":
            return self._json(403, UNAUTHORIZED_BODY)

        content_type = next((v for k, v in headers.items() if k.lower() == "content-type"), "")
        binary = _is_binary(content_type)
        event = {
            "resource": "/{proxy+}",
            "path": path,
            "httpMethod": method,
            "headers": headers,
            "multiValueHeaders": {k: [v] for k, v in headers.items()},
            "queryStringParameters": {k: v[-1] for k, v in query.items()} or None,
            "multiValueQueryStringParameters": query or None,
            "pathParameters": {"proxy": path.lstrip("/")},
            "stageVariables": None,
            "requestContext": {
                "resourcePath": "/{proxy+}",
                "httpMethod": method,
                "path": f"/{STAGE}{path}",
                "stage": STAGE,
                "requestId": request_id,
                "requestTimeEpoch": int(time.time() * 1000),
                "accountId": ACCOUNT,
                "apiId": API_ID,
                "identity": {"sourceIp": "127.0.0.1"},
                "authorizer": {"principalId": policy["principalId"], **policy.get("context", {})},
            },
            "body": (base64.b64encode(body).decode() if binary else body.decode("utf-8", "replace")) if body else None,
            "isBase64Encoded": bool(body) and binary,
        }
        if len(json.dumps(event)) > limits.LAMBDA_PAYLOAD_LIMIT:
            error = PayloadTooLarge(
                f"The request is larger than the {limits.LAMBDA_PAYLOAD_LIMIT} bytes a Lambda request can carry; "
                "upload large files with the Uploads API in smaller parts."
            )
            return self._json(error.status, error.body())
        try:
            result = self._api(event, LocalLambdaContext("api"))
            out_headers = {k: str(v) for k, v in (result.get("headers") or {}).items()}
            for k, values in (result.get("multiValueHeaders") or {}).items():
                out_headers[k] = ", ".join(str(v) for v in values)
            raw = result.get("body") or ""
            payload = base64.b64decode(raw) if result.get("isBase64Encoded") else raw.encode()
            status = int(result["statusCode"])
        except Exception:  # noqa: BLE001 - what API Gateway answers for a failed or malformed Lambda
            return self._json(502, INTERNAL_ERROR_BODY)
        if not all(sendable(k) and sendable(v) for k, v in out_headers.items()) or not 100 <= status <= 599:
            return self._json(502, INTERNAL_ERROR_BODY)
        return status, out_headers, payload

    @staticmethod
    def _json(status: int, body: dict[str, Any]) -> tuple[int, dict[str, str], bytes]:
        return status, {"Content-Type": "application/json"}, json.dumps(body).encode()


def sendable(value: str) -> bool:
    """A header name or value http.server can send as it is: Latin-1, no CR, LF or NUL (anything
    else would raise mid-response or split the header)."""
    try:
        value.encode("latin-1")
    except UnicodeEncodeError:
        return False
    return not any(c in value for c in "\r\n\x00")


def make_server(api: LocalApi, host: str, port: int) -> ThreadingHTTPServer:
    class RequestHandler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def _serve(self) -> None:
            length = self.headers.get("Content-Length") or "0"
            if not length.isdigit():  # API Gateway's answer to a malformed request
                status, out_headers, payload = LocalApi._json(400, {"message": "Bad Request"})
                self.close_connection = True  # the body's end is unknown: nothing more can be read
            else:
                body = self.rfile.read(int(length)) if int(length) else b""
                headers = {k: v for k, v in self.headers.items()}
                try:
                    status, out_headers, payload = api.handle(self.command, self.path, headers, body)
                except Exception:  # noqa: BLE001 - the front answers, whatever went wrong behind it
                    status, out_headers, payload = LocalApi._json(502, INTERNAL_ERROR_BODY)
            self.send_response(status)
            for k, v in out_headers.items():
                if k.lower() not in ("content-length", "connection"):
                    self.send_header(k, v)
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

        do_GET = do_POST = do_DELETE = do_PUT = do_PATCH = _serve

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - stdlib signature
            pass

    server = ThreadingHTTPServer((host, port), RequestHandler)
    server.daemon_threads = True
    return server
