"""The streaming front's HTTP server: the process the deployed stack runs as a Fargate service
behind its distribution (``python -m functions.stream_front``), and whose reply writer the local
front shares.

The distribution sends it every request on the streamed paths (``/v1/files``,
``/v1/files/*/content``, ``/v1/uploads/*/parts``): CloudFront's path patterns cannot tell methods
apart, so a request there that is not a streamed route (``GET /v1/files``, a ``HEAD`` of a file's
content) is relayed as it came to the API (``api_origin``), whose answer goes back as it is. Such
requests carry no large body: the relay takes at most the API's own payload quota.
``GET /healthz`` answers the load balancer's health check.
"""

import http.client
import json
import uuid
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Final
from urllib.parse import urlsplit

from functions.core import http as api_http
from functions.core import limits

from .routes import Reply, StreamFront

#: The port the container listens on (the target group's and the health check's).
PORT: Final = 8080
HEALTH_PATH: Final = "/healthz"
#: How long a connection may sit idle between reads before the server gives up on it: longer
#: than the load balancer's idle timeout, so the balancer always closes first.
SOCKET_TIMEOUT_SECONDS: Final = 120
#: How long the relay waits on the API (its integration timeout, and a margin).
RELAY_TIMEOUT_SECONDS: Final = api_http.INTEGRATION_TIMEOUT_SECONDS + 5
#: Headers that describe one hop, never relayed (RFC 9110, section 7.6.1).
_HOP_HEADERS: Final = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-connection",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
        "host",
        "content-length",
    }
)


def write_reply(handler: BaseHTTPRequestHandler, reply: Reply) -> None:
    """Send ``reply`` on ``handler``'s connection, its body as it comes (chunks of a stored
    object: never the whole of it at once)."""
    handler.close_connection = handler.close_connection or reply.close
    handler.send_response(reply.status)
    for k, v in reply.headers:
        handler.send_header(k, v)
    payload = reply.body if isinstance(reply.body, bytes) else None
    handler.send_header("Content-Length", str(len(payload) if payload is not None else reply.length))
    if reply.close:
        handler.send_header("Connection", "close")
    handler.end_headers()
    if handler.command == "HEAD":
        return
    if isinstance(reply.body, bytes):
        handler.wfile.write(reply.body)
        return
    for chunk in reply.body:
        handler.wfile.write(chunk)


def relay(
    api_origin: str,
    method: str,
    target: str,
    headers: list[tuple[str, str]],
    body: bytes,
    timeout: float = RELAY_TIMEOUT_SECONDS,
) -> Reply:
    """``method target`` sent to the API at ``api_origin`` (``https://host[/stage]``) with the
    request's end-to-end headers; its answer as a Reply."""
    origin = urlsplit(api_origin)
    connection_type = http.client.HTTPSConnection if origin.scheme == "https" else http.client.HTTPConnection
    connection = connection_type(origin.netloc, timeout=timeout)
    try:
        connection.request(
            method,
            origin.path.rstrip("/") + target,
            body=body or None,
            headers={k: v for k, v in headers if k.lower() not in _HOP_HEADERS},
        )
        answer = connection.getresponse()
        payload = answer.read()
    finally:
        connection.close()
    out = [(k, v) for k, v in answer.getheaders() if k.lower() not in _HOP_HEADERS]
    return Reply(answer.status, out, body=payload)


def make_server(
    front: StreamFront,
    api_origin: str,
    host: str = "0.0.0.0",  # a container's port, reached only through the load balancer
    port: int = PORT,
    relay_to: Callable[..., Reply] = relay,
) -> ThreadingHTTPServer:
    """A threaded server: a streamed route goes to ``front``, anything else to the API."""

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        timeout = SOCKET_TIMEOUT_SECONDS

        def _serve(self) -> None:
            path = urlsplit(self.path).path
            if path == HEALTH_PATH and self.command == "GET":
                write_reply(self, Reply(200, [("Content-Type", "text/plain")], body=b"ok"))
                return
            try:
                if front.takes(self.command, path):
                    reply = front.serve(self.command, path, self.headers, self.rfile)
                    if reply is None:  # the client went away mid-body: no one to answer
                        self.close_connection = True
                        return
                else:
                    reply = self._relayed()
                write_reply(self, reply)
            except (TimeoutError, ConnectionError):
                self.close_connection = True

        def _relayed(self) -> Reply:
            length = self.headers.get("Content-Length") or "0"
            if (
                "chunked" in (self.headers.get("Transfer-Encoding") or "").lower()
                or not length.isdigit()
                or int(length) > limits.API_GATEWAY_PAYLOAD_LIMIT
            ):
                return _front_error(413, "This request's body cannot be relayed to the API.", close=True)
            body = self.rfile.read(int(length)) if int(length) else b""
            try:
                return relay_to(api_origin, self.command, self.path, list(self.headers.items()), body)
            except OSError:
                return _front_error(502, "The API could not be reached; try again.", close=False)

        do_GET = do_POST = do_DELETE = do_PUT = do_PATCH = do_HEAD = do_OPTIONS = _serve

        def log_message(self, format: str, *args: Any) -> None:  # http.server's signature
            pass  # each request is in the audit trail and the load balancer's logs

    server = ThreadingHTTPServer((host, port), Handler)
    server.daemon_threads = True
    return server


def _front_error(status: int, message: str, *, close: bool) -> Reply:
    body = json.dumps(
        {
            "error": {
                "message": message,
                "type": "invalid_request_error" if status < 500 else "server_error",
                "param": None,
                "code": None,
            }
        }
    ).encode()
    return Reply(
        status,
        [("Content-Type", "application/json"), (api_http.REQUEST_ID_HEADER, str(uuid.uuid4()))],
        body=body,
        close=close,
    )
