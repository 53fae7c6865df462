"""The api Lambda: API Gateway (REST proxy) -> one router per resource -> the logic.

Before any route, ``admission`` applies the tenant's policy to the request (its
``requests_per_minute`` and disabled state: ``tenants.admit_request``, the policy cached for
``policy_cache_seconds``). Routes read the tenant the authorizer put in the request context, bind
the request to the models of ``protocol`` and return the wire models of ``functions.core.wire``;
``errors`` renders every failure as OpenAI's error envelope. Every response carries
``x-request-id``: API Gateway's request id (``requestContext.requestId``, ``$context.requestId``
in its access log and gateway responses), which is also every log line's ``correlation_id``.
"""

from typing import Any

from aws_lambda_powertools import Logger
from aws_lambda_powertools.event_handler import APIGatewayRestResolver
from aws_lambda_powertools.logging import correlation_paths

from functions.core import audit, deps, http, tenants
from functions.core.errors import ApiError, ServerError

from . import errors
from .routes import batches, files, models, uploads

logger = Logger(service="batch-api")
app = APIGatewayRestResolver(enable_validation=True)
for resource in (files, uploads, batches, models):
    app.include_router(resource.router)
errors.register(app, logger)


def with_request_id(response: dict[str, Any], request_id: str | None) -> dict[str, Any]:
    """``response`` with ``x-request-id`` set (in ``multiValueHeaders``, which API Gateway prefers)."""
    if request_id:
        multi = dict(response.get("multiValueHeaders") or {})
        multi[http.REQUEST_ID_HEADER] = [request_id]
        response["multiValueHeaders"] = multi
        headers = response.get("headers")
        if headers:
            response["headers"] = {k: v for k, v in headers.items() if k.lower() != http.REQUEST_ID_HEADER}
    return response


@deps.per_process
def policies() -> tenants.PolicyCache:
    return tenants.PolicyCache(deps.stores().tenants, deps.settings().policy_cache_seconds)


def admission(event: dict[str, Any]) -> dict[str, Any] | None:
    """The answer to a request its tenant's policy refuses (429 over ``requests_per_minute``, 401
    for a disabled tenant), or None to route it. Every request of a tenant is counted, whatever
    its route (an unknown one too); a request without a tenant is left to the routes (401)."""
    tenant = ((event.get("requestContext") or {}).get("authorizer") or {}).get("tenant")
    if not tenant:
        return None
    try:
        tenants.admit_request(deps.stores().tenants, policies().get(tenant), now=deps.now())
    except ApiError as error:
        return errors.proxy_response(error)
    except Exception:
        logger.exception("unhandled error")
        return errors.proxy_response(ServerError("The server had an error while processing your request."))
    return None


def record_audit(event: dict[str, Any], response: dict[str, Any], request_id: str | None) -> None:
    """The one audit hook of the API (docs/audit.md): after the route answered, send its mutating
    action and outcome to the audit queue (the appender adds it to the tenant's chain moments
    later). The action already happened, so a failed send is logged (``audit_append_failed``,
    alarmable) and the answer goes out unchanged."""
    log = deps.stores().audit_log
    tenant = ((event.get("requestContext") or {}).get("authorizer") or {}).get("tenant")
    if log is None or not tenant:
        return
    headers = {k.lower(): v for k, v in (event.get("headers") or {}).items()}
    try:
        audit.record_api_request(
            log,
            tenant,
            method=event.get("httpMethod") or "",
            path=event.get("path") or "",
            status=int(response.get("statusCode") or 0),
            body=None if response.get("isBase64Encoded") else response.get("body"),
            authorization=headers.get(http.AUTH_HEADER.lower()),
            request_id=request_id,
            at=deps.now(),
        )
    except Exception:
        logger.exception("audit_append_failed", extra={"tenant": tenant})


@logger.inject_lambda_context(correlation_id_path=correlation_paths.API_GATEWAY_REST, clear_state=True)
def handler(event: dict[str, Any], context: Any) -> dict[str, Any]:
    request_id = (event.get("requestContext") or {}).get("requestId")
    response = admission(event) or app.resolve(event, context)
    # A refused request is audited as the refusal it is (its status and error code), like any other.
    record_audit(event, response, request_id)
    return with_request_id(response, request_id)
