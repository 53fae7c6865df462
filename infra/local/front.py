"""The local HTTP front: what API Gateway (REST API, Lambda proxy integration) does for the deployed
API, on 127.0.0.1, rule by rule (docs/local.md has each rule with its AWS source and its test).

Driven by the settings the stack synthesizes (``functions.core.http``: binary media types, the
integration timeout, the gateway responses; ``functions.core.limits``: payload quotas):

- only ``/v1/{proxy+}`` exists (anything else is API Gateway's MISSING_AUTHENTICATION_TOKEN);
- with ``throttle=(rate, burst)`` (off by default), the stage's token bucket: THROTTLED (429);
- a request over API Gateway's 10 MB payload quota is its REQUEST_TOO_LARGE (413);
- a REQUEST authorizer (identity source ``Authorization``) runs first: no header or "Unauthorized"
  is UNAUTHORIZED, a Deny is ACCESS_DENIED, any other failure AUTHORIZER_CONFIGURATION_ERROR;
- the proxy event carries ``headers``/``queryStringParameters`` (the last value of each name) and
  ``multiValueHeaders``/``multiValueQueryStringParameters`` (all of them), header names as sent;
- the request body is base64-encoded iff its ``Content-Type`` matches a binary media type;
- an event over Lambda's 6 MB synchronous payload is refused (413, see docs/local.md);
- the api Lambda gets the integration timeout (29 s), then INTEGRATION_TIMEOUT (504);
- a response that is not a valid proxy response, or over Lambda's 6 MB, is a 502;
- ``headers`` and ``multiValueHeaders`` of the response are merged (multi-value wins per name) and
  sent as separate header lines;
- an ``isBase64Encoded`` body is decoded to bytes only when the request's FIRST ``Accept`` media
  type matches a binary media type; otherwise the client gets the base64 text, as on AWS.

Every gateway response renders the stack's own template (``http.GATEWAY_ERRORS``: OpenAI's error
envelope, ``x-request-id``, ``Retry-After`` on 429s). Whatever the handler returns or raises, the
client gets an answer, never a dropped connection.

With ``stream`` (as the local deployment runs it), the requests the stack's distribution routes to
the streaming front (``StreamFront.takes``: ``POST /v1/files``, ``POST /v1/uploads/{id}/parts``,
``GET /v1/files/{id}/content``) go to it instead, before any rule above: their bodies are
streamed, as on the stack (docs/local.md, "The large-body path").
"""

import base64
import binascii
import json
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qsl, urlsplit

from functions.core import http, limits
from functions.core.errors import PayloadTooLarge
from functions.stream_front.routes import StreamFront
from functions.stream_front.server import write_reply

from .lambda_context import LocalLambdaContext

Handler = Callable[[dict[str, Any], Any], Any]
Headers = list[tuple[str, str]]
Answer = tuple[int, Headers, bytes]

STAGE = "local"
API_ID = "local"
ACCOUNT = "123456789012"
#: API Gateway's own messages ($context.error.messageString) for the rejections the front makes.
MISSING_TOKEN_MESSAGE = "Missing Authentication Token"
INTERNAL_ERROR_MESSAGE = "Internal server error"
TIMEOUT_MESSAGE = "Endpoint request timed out"
#: The status API Gateway gives each rejection before the stack's gateway responses apply.
_DEFAULT_STATUS = {"MISSING_AUTHENTICATION_TOKEN": 403, "API_CONFIGURATION_ERROR": 500, "INTEGRATION_FAILURE": 502}
#: Rejections the stack leaves to its DEFAULT_4XX/DEFAULT_5XX responses.
_FALLBACK = {
    "MISSING_AUTHENTICATION_TOKEN": "DEFAULT_4XX",
    "API_CONFIGURATION_ERROR": "DEFAULT_5XX",
    "INTEGRATION_FAILURE": "DEFAULT_5XX",
}


def header_pairs(headers: Mapping[str, str] | Iterable[tuple[str, str]]) -> Headers:
    return list(headers.items()) if isinstance(headers, Mapping) else list(headers)


def first_header(headers: Headers, name: str) -> str | None:
    """The first value of header ``name`` (names are case-insensitive)."""
    return next((v for k, v in headers if k.lower() == name.lower()), None)


def single_and_multi(pairs: Headers) -> tuple[dict[str, str] | None, dict[str, list[str]] | None]:
    """API Gateway's two views of repeated names: the last value of each, and all values in order."""
    multi: dict[str, list[str]] = {}
    for k, v in pairs:
        multi.setdefault(k, []).append(v)
    if not multi:
        return None, None
    return {k: values[-1] for k, values in multi.items()}, multi


def response_headers(result: dict[str, Any]) -> Headers:
    """``headers`` and ``multiValueHeaders`` merged as API Gateway does: a name present in
    ``multiValueHeaders`` keeps only those values; each value is its own header line."""
    multi = {str(k): [str(v) for v in values] for k, values in (result.get("multiValueHeaders") or {}).items()}
    lowered = {k.lower() for k in multi}
    merged: Headers = [
        (str(k), str(v)) for k, v in (result.get("headers") or {}).items() if str(k).lower() not in lowered
    ]
    for k, values in multi.items():
        merged.extend((k, v) for v in values)
    return merged


class TokenBucket:
    """API Gateway's stage throttling: a bucket of ``burst`` requests refilled at ``rate`` per second
    (its documented token-bucket algorithm); a request finding it empty is THROTTLED (429)."""

    def __init__(self, rate: float, burst: int, clock: Callable[[], float]):
        self.rate, self.burst, self._clock = rate, burst, clock
        self._tokens, self._last = float(burst), clock()
        self._lock = threading.Lock()

    def take(self) -> bool:
        with self._lock:
            now = self._clock()
            self._tokens = min(self.burst, self._tokens + (now - self._last) * self.rate)
            self._last = now
            if self._tokens < 1:
                return False
            self._tokens -= 1
            return True


@dataclass(frozen=True)
class _Allowed:
    """What an authorizer that allows a call returned."""

    principal: Any
    policy: Any


class LocalApi:
    """Turns HTTP requests into authorizer + proxy events and Lambda results into responses."""

    def __init__(
        self,
        api_handler: Handler,
        authorizer_handler: Handler,
        *,
        binary_media_types: tuple[str, ...] = http.BINARY_MEDIA_TYPES,
        integration_timeout: float = http.INTEGRATION_TIMEOUT_SECONDS,
        payload_limit: int = limits.API_GATEWAY_PAYLOAD_LIMIT,
        lambda_payload_limit: int = limits.LAMBDA_PAYLOAD_LIMIT,
        throttle: tuple[float, int] | None = None,
        clock: Callable[[], float] = time.monotonic,
        stream: StreamFront | None = None,
    ):
        self._api = api_handler
        #: The large-body front, where the stack's distribution routes the streamed routes
        #: (None: every request is API Gateway's, as in a stack with that path turned off).
        self.stream = stream
        self._authorizer = authorizer_handler
        self._bucket = TokenBucket(*throttle, clock) if throttle else None
        self.binary_media_types = binary_media_types
        self.integration_timeout = integration_timeout
        self.payload_limit = payload_limit
        self.lambda_payload_limit = lambda_payload_limit

    def handle(
        self, method: str, target: str, headers: Mapping[str, str] | Iterable[tuple[str, str]], body: bytes
    ) -> Answer:
        pairs = header_pairs(headers)
        request_id = str(uuid.uuid4())
        answer = self._handle(method, target, pairs, body, request_id)
        status, out, payload = answer
        # API Gateway names every response with its request id (x-amzn-RequestId).
        return status, [*out, ("x-amzn-RequestId", request_id)], payload

    def _handle(self, method: str, target: str, pairs: Headers, body: bytes, request_id: str) -> Answer:
        split = urlsplit(target)
        path = split.path
        refused = self._refused(path, pairs, body, request_id)
        if refused is not None:
            return refused
        query_single, query_multi = single_and_multi(parse_qsl(split.query, keep_blank_values=True))
        headers_single, headers_multi = single_and_multi(pairs)
        # What API Gateway passes of the request to both the REQUEST authorizer and the proxy.
        request = {
            "resource": "/v1/{proxy+}",
            "path": path,
            "httpMethod": method,
            "headers": headers_single,
            "multiValueHeaders": headers_multi,
            "queryStringParameters": query_single,
            "multiValueQueryStringParameters": query_multi,
            "pathParameters": {"proxy": path.removeprefix(http.API_PREFIX + "/")},
            "stageVariables": None,
        }
        allowed = self._authorize(method, path, request, request_id)
        if not isinstance(allowed, _Allowed):
            return allowed
        binary = http.is_binary_media_type(first_header(pairs, "Content-Type"), self.binary_media_types)
        event = {
            **request,
            "requestContext": {
                "resourcePath": "/v1/{proxy+}",
                "httpMethod": method,
                "path": f"/{STAGE}{path}",
                "stage": STAGE,
                "requestId": request_id,
                "requestTimeEpoch": int(time.time() * 1000),
                "accountId": ACCOUNT,
                "apiId": API_ID,
                "identity": {"sourceIp": "127.0.0.1"},
                "authorizer": {"principalId": allowed.principal, **(allowed.policy.get("context") or {})},
            },
            "body": (base64.b64encode(body).decode() if binary else body.decode("utf-8", "replace")) if body else None,
            "isBase64Encoded": bool(body) and binary,
        }
        if len(json.dumps(event)) > self.lambda_payload_limit:
            error = PayloadTooLarge(
                f"The request is larger than the {self.lambda_payload_limit} bytes a Lambda request can carry (after "
                "base64). Upload large files with the Uploads API (client.uploads.upload_file_chunked(..., "
                f"part_size={limits.MAX_UPLOAD_PART_BYTES}))."
            )
            return error.status, self._json_headers(request_id), json.dumps(error.body()).encode()

        outcome = self._invoke(event)
        if outcome is None:
            return self.gateway("INTEGRATION_TIMEOUT", request_id, TIMEOUT_MESSAGE)
        return self._response(outcome, pairs, request_id)

    def _refused(self, path: str, pairs: Headers, body: bytes, request_id: str) -> Answer | None:
        """API Gateway's answer to a request it refuses before the authorizer (None: it goes on)."""
        if not path.startswith(http.API_PREFIX + "/") or path == http.API_PREFIX + "/":
            return self.gateway("MISSING_AUTHENTICATION_TOKEN", request_id, MISSING_TOKEN_MESSAGE)
        if self._bucket is not None and not self._bucket.take():
            return self.gateway("THROTTLED", request_id, "Too Many Requests")
        if len(body) > self.payload_limit:
            return self.gateway("REQUEST_TOO_LARGE", request_id, "Request Too Long")
        if not first_header(pairs, http.AUTH_HEADER):  # the identity source is missing: no authorizer call
            return self.gateway("UNAUTHORIZED", request_id, "Unauthorized")
        return None

    def _authorize(self, method: str, path: str, request: dict[str, Any], request_id: str) -> _Allowed | Answer:
        """The REQUEST authorizer's principal and policy when it allows the call, else API Gateway's
        answer."""
        auth_event = {
            "type": "REQUEST",
            "methodArn": f"arn:aws:execute-api:us-east-1:{ACCOUNT}:{API_ID}/{STAGE}/{method}{path}",
            **request,
            "requestContext": {"requestId": request_id, "stage": STAGE, "apiId": API_ID, "httpMethod": method},
        }
        try:
            policy = self._authorizer(auth_event, LocalLambdaContext("authorizer"))
            effect = policy["policyDocument"]["Statement"][0]["Effect"]
            principal = policy["principalId"]
        except Exception as exc:  # noqa: BLE001 - "Unauthorized" is the 401 contract; anything else a 500
            if str(exc) == "Unauthorized":
                return self.gateway("UNAUTHORIZED", request_id, "Unauthorized")
            return self.gateway("AUTHORIZER_CONFIGURATION_ERROR", request_id, INTERNAL_ERROR_MESSAGE)
        if effect != "Allow":
            return self.gateway("ACCESS_DENIED", request_id, "User is not authorized to access this resource")
        return _Allowed(principal, policy)

    def _response(self, outcome: Callable[[], Any], pairs: Headers, request_id: str) -> Answer:
        """The api Lambda's proxy result as API Gateway answers it (its own 5xx for a failed,
        malformed or oversized one)."""
        try:
            result = outcome()
            status = int(result["statusCode"])
            out_headers = response_headers(result)
            raw = result.get("body") or ""
            if not isinstance(raw, str) or len(json.dumps(result)) > self.lambda_payload_limit:
                raise ValueError("not a proxy response Lambda can return")
        except Exception:  # noqa: BLE001 - a failed, malformed or oversized Lambda response
            return self.gateway("INTEGRATION_FAILURE", request_id, INTERNAL_ERROR_MESSAGE)
        if result.get("isBase64Encoded") and http.is_binary_media_type(
            first_header(pairs, "Accept"), self.binary_media_types
        ):
            try:
                payload = base64.b64decode(raw, validate=True)
            except (binascii.Error, ValueError):
                return self.gateway("API_CONFIGURATION_ERROR", request_id, INTERNAL_ERROR_MESSAGE)
        else:
            payload = raw.encode()  # text, or the base64 text itself when the Accept type is not binary
        if not all(sendable(k) and sendable(v) for k, v in out_headers) or not 100 <= status <= 599:
            return self.gateway("INTEGRATION_FAILURE", request_id, INTERNAL_ERROR_MESSAGE)
        return status, out_headers, payload

    def _invoke(self, event: dict[str, Any]) -> Callable[[], Any] | None:
        """Call the api handler, waiting at most the integration timeout: a callable giving its result
        (or raising its exception), or None when it did not answer in time (it runs on, as a Lambda
        would until its own timeout)."""
        box: dict[str, Any] = {}
        done = threading.Event()

        def run() -> None:
            try:
                box["result"] = self._api(event, LocalLambdaContext("api", timeout_seconds=self.integration_timeout))
            except BaseException as exc:  # noqa: BLE001 - handed back to the caller
                box["error"] = exc
            finally:
                done.set()

        threading.Thread(target=run, name="api-lambda", daemon=True).start()
        if not done.wait(self.integration_timeout):
            return None

        def outcome() -> Any:
            if "error" in box:
                raise box["error"]
            return box["result"]

        return outcome

    def gateway(self, response_type: str, request_id: str, gateway_message: str) -> Answer:
        """API Gateway's own answer of this type, rendered from the stack's gateway response."""
        error = http.GATEWAY_ERRORS.get(response_type) or http.GATEWAY_ERRORS[_FALLBACK[response_type]]
        status = error.status or _DEFAULT_STATUS[response_type]
        headers = self._json_headers(request_id)
        if error.retry_after_seconds is not None:
            headers.append(("Retry-After", str(error.retry_after_seconds)))
        return status, headers, json.dumps(error.body(gateway_message)).encode()

    @staticmethod
    def _json_headers(request_id: str) -> Headers:
        return [("Content-Type", "application/json"), (http.REQUEST_ID_HEADER, request_id)]


def sendable(value: str) -> bool:
    """A header name or value http.server can send as it is: Latin-1, no CR, LF or NUL (anything
    else would raise mid-response or split the header)."""
    try:
        value.encode("latin-1")
    except UnicodeEncodeError:
        return False
    return not any(c in value for c in "\r\n\x00")


def read_body(stream: Any, headers: Any, limit: int) -> bytes | None:
    """The request's body, by ``Content-Length`` or ``Transfer-Encoding: chunked`` (what the Node
    SDK sends for a streamed upload; API Gateway takes either, its payload quota applying to the
    whole body): None when it is malformed. At most ``limit + 1`` bytes of a chunked body are
    read (over the quota: the caller's 413)."""
    if "chunked" in (headers.get("Transfer-Encoding") or "").lower():
        body = bytearray()
        while True:
            size_line = stream.readline(1024).split(b";", 1)[0].strip()
            try:
                size = int(size_line, 16)
            except ValueError:
                return None
            if size == 0:
                while stream.readline(8192).strip():  # trailers, up to the blank line
                    pass
                return bytes(body)
            if len(body) + size > limit:
                return bytes(body) + stream.read(min(size, limit + 1 - len(body)))
            chunk = stream.read(size)
            if len(chunk) < size or stream.readline(8) not in (b"\r\n", b"\n"):
                return None
            body += chunk
    length = headers.get("Content-Length") or "0"
    if not length.isdigit():
        return None
    return stream.read(int(length)) if int(length) else b""


class RequestHandler(BaseHTTPRequestHandler):
    """The front's HTTP side: each request to the api (or, on a streamed route, to the streaming
    front); ``make_server`` gives each server its subclass naming its ``api``."""

    protocol_version = "HTTP/1.1"
    api: LocalApi

    def _serve(self) -> None:
        api = self.api
        if api.stream is not None and api.stream.takes(self.command, urlsplit(self.path).path):
            self._stream(api.stream)
            return
        body = read_body(self.rfile, self.headers, api.payload_limit)
        if body is None:  # API Gateway's answer to a malformed request
            status, out_headers, payload = (
                400,
                [("Content-Type", "application/json")],
                json.dumps({"message": "Bad Request"}).encode(),
            )
            self.close_connection = True  # the body's end is unknown: nothing more can be read
        else:
            if len(body) > api.payload_limit:
                self.close_connection = True  # the rest of an oversized body is never read
            status, out_headers, payload = self._answer(body)
        self._send(status, out_headers, payload)

    def _answer(self, body: bytes) -> Answer:
        # API Gateway de-chunks the body and drops Transfer-Encoding before the integration
        # (a header it "may drop, remap or modify": its "Important notes" for REST APIs).
        headers = [(k, v) for k, v in self.headers.items() if k.lower() != "transfer-encoding"]
        try:
            return self.api.handle(self.command, self.path, headers, body)
        except Exception:  # noqa: BLE001 - the front answers, whatever went wrong behind it
            return self.api.gateway("INTEGRATION_FAILURE", str(uuid.uuid4()), INTERNAL_ERROR_MESSAGE)

    def _stream(self, stream: StreamFront) -> None:
        """The distribution's large-body behaviour: the request goes to the streaming front,
        its body read from the connection as it arrives, the answer's body sent as it comes."""
        reply = stream.serve(self.command, urlsplit(self.path).path, self.headers, self.rfile)
        if reply is None:  # the client went away mid-body
            self.close_connection = True
            return
        write_reply(self, reply)

    def _send(self, status: int, out_headers: Headers, payload: bytes) -> None:
        self.send_response(status)
        for k, v in out_headers:
            if k.lower() not in ("content-length", "connection", "transfer-encoding"):
                self.send_header(k, v)
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        if self.command != "HEAD":  # a HEAD answer has the headers of its GET, never a body
            self.wfile.write(payload)

    # The methods an ANY method covers on API Gateway ("Set up a method request": DELETE, GET,
    # HEAD, OPTIONS, PATCH, POST, PUT) reach the api Lambda.
    do_GET = do_POST = do_DELETE = do_PUT = do_PATCH = do_HEAD = do_OPTIONS = _serve

    def __getattr__(self, name: str) -> Any:
        """Any other method is API Gateway's MISSING_AUTHENTICATION_TOKEN (403, "including the
        cases when the client attempts to invoke an unsupported API method": "Gateway response
        types"), in the stack's envelope, never http.server's 501 HTML page."""
        if not name.startswith("do_"):
            raise AttributeError(name)
        return self._unsupported

    def _unsupported(self) -> None:
        read_body(self.rfile, self.headers, self.api.payload_limit)
        self.close_connection = True
        self._send(*self.api.gateway("MISSING_AUTHENTICATION_TOKEN", str(uuid.uuid4()), MISSING_TOKEN_MESSAGE))

    def log_message(self, format: str, *args: Any) -> None:  # stdlib signature
        pass


def make_server(api: LocalApi, host: str, port: int) -> ThreadingHTTPServer:
    handler = type("RequestHandler", (RequestHandler,), {"api": api})
    return FrontServer((host, port), handler)


class FrontServer(ThreadingHTTPServer):
    """A thread per connection, kept alive between requests (HTTP/1.1), as many as clients open.
    The listen backlog is the system's maximum (socketserver's default of 5 makes the kernel drop
    or reset connections when a few dozen clients connect at once)."""

    daemon_threads = True
    request_queue_size = socket.SOMAXCONN
