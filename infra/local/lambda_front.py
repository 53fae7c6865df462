"""What the Lambda service does for moto's Step Functions interpreter: its SDK calls go to
``localhost:$MOTO_PORT``; this front answers ``POST /2015-03-31/functions/{name}/invocations``
with our real handler (errors reported like the Lambda runtime: 200 + ``X-Amz-Function-Error``)
and forwards every other request to moto unchanged."""

import http.client
import json
import re
import traceback
import uuid
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import unquote, urlsplit

from .lambda_context import LocalLambdaContext
from .served import ServedHttp

Handler = Callable[[dict[str, Any], Any], Any]
_INVOKE = re.compile(r"^/2015-03-31/functions/(?P<name>[^/]+)/invocations$")
_HOP = {
    "connection",
    "keep-alive",
    "transfer-encoding",
    "proxy-connection",
    "upgrade",
    "te",
    "trailer",
    "content-length",
}


def function_name(raw: str) -> str:
    """``name``, ``name:qualifier`` or an (URL-encoded) function ARN -> the function's name."""
    name = unquote(raw)
    if name.startswith("arn:"):
        name = name.split(":")[6]
    return name.split(":")[0]


def invoke(handlers: dict[str, Handler], name: str, body: bytes) -> tuple[int, list[tuple[str, str]], bytes]:
    handler = handlers.get(name)
    if handler is None:
        headers = [("Content-Type", "application/json"), ("x-amzn-ErrorType", "ResourceNotFoundException")]
        return 404, headers, json.dumps({"Type": "User", "Message": f"Function not found: {name}"}).encode()
    headers = [("Content-Type", "application/json"), ("X-Amz-Executed-Version", "$LATEST")]
    try:
        result = handler(json.loads(body) if body else {}, LocalLambdaContext(name))
        answer = json.dumps(result).encode()  # a result that is not JSON fails like the runtime's
    except Exception as exc:  # noqa: BLE001 - reported to the caller as the Lambda runtime does
        headers.append(("X-Amz-Function-Error", "Unhandled"))
        payload = {
            "errorMessage": str(exc),
            "errorType": type(exc).__name__,
            "stackTrace": traceback.format_tb(exc.__traceback__),
        }
        return 200, headers, json.dumps(payload, default=str).encode("utf-8", "replace")
    return 200, headers, answer


class LambdaFront:
    """A local component: the front on ``host:port`` (0 = a free port) in a thread."""

    name = "lambda-front"

    def __init__(self, host: str, port: int, moto_port: Callable[[], int], handlers: dict[str, Handler]):
        self._host, self._port, self._moto_port, self._handlers = host, port, moto_port, handlers
        self._served = ServedHttp()

    @property
    def port(self) -> int:
        return self._port

    def start(self) -> None:
        handlers, host, moto_port = self._handlers, self._host, self._moto_port()

        class Front(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *_: Any) -> None:
                pass

            def _send(self, status: int, headers: list[tuple[str, str]], body: bytes) -> None:
                self.send_response(status)
                if not any(k.lower() == "x-amzn-requestid" for k, _ in headers):
                    self.send_header("x-amzn-RequestId", str(uuid.uuid4()))  # botocore reads it
                for k, v in headers:
                    if k.lower() not in _HOP:
                        self.send_header(k, v)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def _handle(self) -> None:
                try:
                    self._forward()
                except Exception as exc:  # noqa: BLE001 - the front answers whatever failed behind it
                    answer = json.dumps({"message": f"lambda front: {type(exc).__name__}"}).encode()
                    self._send(502, [("Content-Type", "application/json")], answer)

            def _forward(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else b""
                match = _INVOKE.match(urlsplit(self.path).path)
                if self.command == "POST" and match:
                    self._send(*invoke(handlers, function_name(match.group("name")), body))
                    return
                conn = http.client.HTTPConnection(host, moto_port, timeout=300)
                try:
                    headers = {k: v for k, v in self.headers.items() if k.lower() not in _HOP}
                    conn.request(self.command, self.path, body=body, headers=headers)
                    response = conn.getresponse()
                    self._send(response.status, response.getheaders(), response.read())
                finally:
                    conn.close()

            do_GET = do_POST = do_PUT = do_DELETE = do_HEAD = do_PATCH = _handle

        self._port = self._served.serve(ThreadingHTTPServer((self._host, self._port), Front), self.name)

    def stop(self) -> None:
        self._served.shutdown()
