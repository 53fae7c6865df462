"""HTTP-level API contract shared by the CDK api construct and the local front."""

import json
from dataclasses import dataclass
from fnmatch import fnmatchcase
from typing import Final
from urllib.parse import quote

from . import limits
from .errors import DEACTIVATED_BODY, UNAUTHORIZED_BODY

#: Every route lives under this path; clients use ``https://<host>[/<stage>]/v1`` as base_url.
API_PREFIX: Final = "/v1"
#: The REST API's ``binaryMediaTypes`` (docs/local.md): ``*/*``, every media type. A request body
#: with any ``Content-Type`` reaches the Lambda base64-encoded (powertools decodes it for the routes),
#: and an ``isBase64Encoded`` response (a file's content) reaches the client as bytes whatever its
#: first ``Accept`` media type: the SDK's ``application/binary``, curl's ``*/*``, a browser's
#: ``text/html,...``. API Gateway's documentation gives ``*/*`` for exactly this, "to return binary
#: media when you can't control the order of Accept header values" (Binary media types for REST
#: APIs in API Gateway). Text responses (every JSON answer) are not base64-encoded and pass as text.
BINARY_MEDIA_TYPES: Final = ("*/*",)
#: API Gateway's REST integration timeout (its default maximum): the api Lambda gets no longer.
INTEGRATION_TIMEOUT_SECONDS: Final = 29
#: The header carrying API Gateway's request id (``$context.requestId``) on every response: the
#: official SDK reads it into ``_request_id``.
REQUEST_ID_HEADER: Final = "x-request-id"
#: The header the authorizer reads (its identity source).
AUTH_HEADER: Final = "Authorization"

#: RFC 5987 attr-char besides letters and digits: what ``filename*`` carries unencoded.
_ATTR_CHARS: Final = "!#$&+-.^_`|~"


def content_disposition(filename: str) -> str:
    """The ``Content-Disposition`` of a download of ``filename`` (RFC 6266), whatever the name.

    ``filename="..."`` is an ASCII fallback: printable ASCII except ``"``, ``\\`` and ``%``
    (RFC 6266 appendix D), everything else (controls, CR/LF, non-ASCII) becomes ``_``. When that
    differs from the name, ``filename*=UTF-8''...`` (RFC 5987 percent-encoding of the UTF-8 bytes)
    carries the exact name; clients that understand it prefer it. The result is always printable
    ASCII: it cannot split a header or fail to encode as Latin-1.
    """
    fallback = "".join(c if " " <= c <= "~" and c not in '"\\%' else "_" for c in filename) or "file"
    header = f'attachment; filename="{fallback}"'
    if filename and fallback != filename:
        header += "; filename*=UTF-8''" + quote(filename, safe=_ATTR_CHARS, encoding="utf-8", errors="replace")
    return header


def media_type(header_value: str | None) -> str:
    """The first media type of a ``Content-Type`` or ``Accept`` value, lowercased, without parameters
    (``"Application/JSON; charset=utf-8, */*"`` -> ``"application/json"``); ``""`` for none."""
    if not header_value:
        return ""
    return header_value.split(",", 1)[0].split(";", 1)[0].strip().lower()


def is_binary_media_type(value: str | None, binary_media_types: tuple[str, ...] = BINARY_MEDIA_TYPES) -> bool:
    """Whether the first media type of ``value`` matches an entry of ``binaryMediaTypes`` (entries may
    hold ``*`` wildcards, as API Gateway allows: ``image/*``, ``*/*``). A wildcard in ``value`` itself
    (``Accept: */*``) is a literal here: it matches only a ``*/*`` entry (docs/local.md)."""
    media = media_type(value)
    return bool(media) and any(fnmatchcase(media, entry.lower()) for entry in binary_media_types)


# --- API Gateway's own answers (gateway responses), shared by the stack and the local front -------

#: What ``$context.error.messageString`` becomes in a template: API Gateway's own message.
GATEWAY_MESSAGE: Final = "$context.error.messageString"


@dataclass(frozen=True)
class GatewayError:
    """One gateway response in OpenAI's error envelope.

    ``status`` None keeps API Gateway's own status (the DEFAULT_4XX/5XX fallbacks); ``message`` None
    renders API Gateway's own message. Every one carries ``x-request-id`` (``$context.requestId``).
    """

    response_type: str
    status: int | None
    error_type: str
    code: str | None = None
    message: str | None = None
    retry_after_seconds: int | None = None

    def body(self, gateway_message: str) -> dict:
        message = self.message if self.message is not None else gateway_message
        return {"error": {"message": message, "type": self.error_type, "param": None, "code": self.code}}

    def template(self) -> str:
        """The response template: the body with API Gateway's message (a quoted JSON string) in it."""
        if self.message is not None:
            return json.dumps(self.body(""))
        placeholder = "__GATEWAY_MESSAGE__"
        return json.dumps(self.body(placeholder)).replace(json.dumps(placeholder), GATEWAY_MESSAGE)


_UNAUTHORIZED = UNAUTHORIZED_BODY["error"]
_DEACTIVATED = DEACTIVATED_BODY["error"]
_KEY_CHECK_FAILED = "We could not check your API key. Retry the request in a moment."
#: How long a client throttled by the stage's rate limit waits (the token bucket refills every second).
THROTTLE_RETRY_AFTER_SECONDS: Final = 1
#: A usage plan's quota is per day or longer; one minute keeps clients from hammering it.
QUOTA_RETRY_AFTER_SECONDS: Final = 60

GATEWAY_ERRORS: Final = {
    e.response_type: e
    for e in (
        # The authorizer raised "Unauthorized", or the Authorization header is missing.
        GatewayError("UNAUTHORIZED", 401, _UNAUTHORIZED["type"], _UNAUTHORIZED["code"], _UNAUTHORIZED["message"]),
        # The authorizer returned a Deny policy, which it does only for a disabled tenant's key:
        # OpenAI's answer for a key of a deactivated account (401, code account_deactivated).
        GatewayError("ACCESS_DENIED", 401, _DEACTIVATED["type"], _DEACTIVATED["code"], _DEACTIVATED["message"]),
        # The authorizer failed (an exception other than "Unauthorized", a timeout, a bad policy).
        GatewayError("AUTHORIZER_FAILURE", 500, "server_error", None, _KEY_CHECK_FAILED),
        GatewayError("AUTHORIZER_CONFIGURATION_ERROR", 500, "server_error", None, _KEY_CHECK_FAILED),
        # The stage's (or a usage plan's) rate limit.
        GatewayError(
            "THROTTLED",
            429,
            "rate_limit_error",
            "rate_limit_exceeded",
            "Rate limit reached for requests to this API. Retry after the number of seconds in the Retry-After header.",
            THROTTLE_RETRY_AFTER_SECONDS,
        ),
        GatewayError(
            "QUOTA_EXCEEDED",
            429,
            "rate_limit_error",
            "quota_exceeded",
            "The request quota of this API key is used up. Retry after the number of seconds in the Retry-After header.",
            QUOTA_RETRY_AFTER_SECONDS,
        ),
        # More than API Gateway's 10 MB payload quota.
        GatewayError(
            "REQUEST_TOO_LARGE",
            413,
            "invalid_request_error",
            "request_too_large",
            f"The request is larger than the {limits.API_GATEWAY_PAYLOAD_LIMIT} bytes this API accepts. Upload large "
            f"files with the Uploads API (client.uploads.upload_file_chunked(..., part_size={limits.MAX_UPLOAD_PART_BYTES})).",
        ),
        # The api Lambda did not answer within INTEGRATION_TIMEOUT_SECONDS ("Endpoint request timed out").
        GatewayError("INTEGRATION_TIMEOUT", 504, "server_error", "timeout"),
        # Every other rejection of API Gateway's own: its status and message, OpenAI's envelope.
        GatewayError("DEFAULT_4XX", None, "invalid_request_error"),
        GatewayError("DEFAULT_5XX", None, "server_error"),
    )
}
