"""Every failure the api Lambda answers, as OpenAI's error envelope, in one place: typed errors,
request validation (the rules of ``protocol``), a reused or busy ``Idempotency-Key``, unknown routes
and unexpected exceptions."""

import json
from collections.abc import Sequence
from typing import Any

from aws_lambda_powertools import Logger
from aws_lambda_powertools.event_handler import APIGatewayRestResolver, Response
from aws_lambda_powertools.event_handler.exceptions import NotFoundError
from aws_lambda_powertools.event_handler.openapi.exceptions import RequestUnsupportedContentType, RequestValidationError
from aws_lambda_powertools.utilities.idempotency.exceptions import (
    IdempotencyAlreadyInProgressError,
    IdempotencyValidationError,
)

from functions.core.errors import ApiError, Conflict, InvalidRequest, NotFound, RateLimited, ServerError

from .protocol import MAP_FIELDS

#: The same ``Idempotency-Key`` sent with another body (powertools' payload validation failed).
KEY_REUSED = Conflict(
    "This Idempotency-Key was already used with a different request body in the last 24 hours. "
    "Send a new key for a new request, or the same body to get the batch the key created.",
    code="idempotency_key_reused",
)
#: The same ``Idempotency-Key`` (and body) while the create it started is still running.
KEY_IN_PROGRESS = Conflict(
    "A request with this Idempotency-Key is still being processed. Retry it in a moment to get its result.",
    code="idempotency_key_in_progress",
)

#: How powertools' ValueError for a multipart Content-Type without ``boundary=`` begins.
MISSING_BOUNDARY = "Missing boundary in multipart/form-data"

#: Where powertools says a value came from (the first element of an error's loc).
_SOURCES = ("body", "query", "path", "form", "header")


def envelope(error: ApiError) -> Response:
    headers = {"Retry-After": str(error.retry_after)} if isinstance(error, RateLimited) else None
    return Response(
        status_code=error.status, content_type="application/json", body=json.dumps(error.body()), headers=headers
    )


def proxy_response(error: ApiError) -> dict[str, Any]:
    """``error``'s envelope as a Lambda proxy response, shaped as the app's answers are, for a
    request refused before any route runs (``handler.admission``)."""
    response = envelope(error)
    return {
        "statusCode": response.status_code,
        "body": response.body,
        "isBase64Encoded": False,
        "multiValueHeaders": {k: [v] for k, v in response.headers.items()},
    }


def register(app: APIGatewayRestResolver, logger: Logger) -> None:
    """Install the error handlers on ``app`` (routers' errors reach them too)."""

    @app.exception_handler(ApiError)
    def handle_api_error(error: ApiError) -> Response:
        return envelope(error)

    @app.exception_handler(RequestValidationError)
    def handle_validation_error(error: RequestValidationError) -> Response:
        return envelope(validation_to_api_error(error.errors()))

    @app.exception_handler(RequestUnsupportedContentType)
    def handle_content_type(_: RequestUnsupportedContentType) -> Response:
        # a body whose Content-Type the route does not read (text/plain, octet-stream, ...)
        sent = app.current_event.headers.get("Content-Type") or ""
        return envelope(
            InvalidRequest(
                f"Unsupported Content-Type {sent[:100]!r}: send the body as application/json, or as "
                "multipart/form-data to the routes that take a file.",
                code="unsupported_content_type",
            )
        )

    @app.exception_handler(UnicodeDecodeError)
    def handle_undecodable(_: UnicodeDecodeError) -> Response:
        # powertools decodes a JSON body, and multipart part headers, as UTF-8 and lets the error through
        return envelope(
            InvalidRequest(
                "We could not parse the body of your request: its JSON, or its multipart part headers, are not valid UTF-8."
            )
        )

    @app.exception_handler(ValueError)
    def handle_value_error(error: ValueError) -> Response:
        # powertools raises a bare ValueError for a multipart Content-Type without a boundary
        if str(error).startswith(MISSING_BOUNDARY):
            return envelope(
                InvalidRequest(
                    "We could not parse the multipart/form-data body of your request: its Content-Type header has no boundary."
                )
            )
        return handle_unexpected(error)

    @app.exception_handler(IdempotencyValidationError)
    def handle_key_reused(_: IdempotencyValidationError) -> Response:
        return envelope(KEY_REUSED)

    @app.exception_handler(IdempotencyAlreadyInProgressError)
    def handle_key_in_progress(_: IdempotencyAlreadyInProgressError) -> Response:
        return envelope(KEY_IN_PROGRESS)

    @app.not_found
    def handle_not_found(_: NotFoundError) -> Response:
        event = app.current_event
        return envelope(NotFound(f"Invalid URL ({event.http_method} {event.path})"))

    @app.exception_handler(Exception)
    def handle_unexpected(_: Exception) -> Response:
        logger.exception("unhandled error")
        return envelope(ServerError("The server had an error while processing your request."))


def validation_to_api_error(errors: Sequence[Any]) -> ApiError:
    """The first validation error (pydantic's, powertools', or a ``protocol`` rule's) in OpenAI's
    words: 400 ``missing_required_parameter`` or ``invalid_value`` with the parameter's path."""
    first = errors[0] if errors else {}
    kind = first.get("type", "")
    if kind == "json_invalid":
        return InvalidRequest("We could not parse the JSON body of your request. The body must be valid JSON.")
    if kind == "multipart_invalid":
        return InvalidRequest("We could not parse the multipart/form-data body of your request.")
    loc = [str(p) for p in first.get("loc", ())]
    if len(loc) > 2 and loc[0] == "query":
        loc = loc[2:]  # query strings are flat: (query, the route's model parameter, field)
    elif loc and loc[0] in _SOURCES:
        loc = loc[1:]
    ctx = first.get("ctx") or {}
    value = first.get("input")
    if loc and loc[0] in MAP_FIELDS:
        return _map_error(loc, kind, ctx)
    param = ".".join(loc) or None
    if kind == "missing":
        return InvalidRequest(f"Missing required parameter: '{param}'.", param=param, code="missing_required_parameter")
    if kind in ("one_of", "id_of"):
        message = f"Invalid value for '{param}': {value!r}. {first['msg']}"
    elif kind == "between":
        message = f"Invalid value for '{param}': {value}. {first['msg']}"
    elif kind == "string_too_short" and ctx.get("min_length") == 1:
        message = f"Invalid value for '{param}': it must not be empty."
    else:
        message = f"Invalid value for '{param}': {first.get('msg', 'invalid')}."
    return InvalidRequest(message, param=param, code="invalid_value")


def _map_error(loc: list[str], kind: str, ctx: dict[str, Any]) -> ApiError:
    """An error in a map field (``metadata``): the parameter is the field, whatever key failed."""
    param = loc[0]
    if len(loc) == 1:
        if kind == "too_long":
            detail = f"at most {ctx.get('max_length')} key-value pairs are allowed."
        else:
            detail = "it must be an object of strings."
        return InvalidRequest(f"Invalid value for '{param}': {detail}", param=param, code="invalid_value")
    if loc[-1] == "[key]":
        detail = (
            f"keys may be at most {ctx.get('max_length')} characters."
            if kind == "string_too_long"
            else "keys must be strings."
        )
        return InvalidRequest(f"Invalid value for '{param}': {detail}", param=param, code="invalid_value")
    detail = (
        f"values may be at most {ctx.get('max_length')} characters."
        if kind == "string_too_long"
        else "values must be strings."
    )
    return InvalidRequest(f"Invalid value for '{param}.{loc[1]}': {detail}", param=param, code="invalid_value")
