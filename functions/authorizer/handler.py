"""API Gateway REQUEST authorizer: ``Authorization: Bearer <key>`` -> tenant.

Allows the whole API for a known key (so API Gateway may cache the answer per key) and passes the
tenant in the authorizer context. Any failure raises ``Unauthorized``, which API Gateway answers
with 401 and the OpenAI error envelope (its UNAUTHORIZED gateway response); a Deny policy is the
ACCESS_DENIED gateway response (also 401 in this stack); any other exception is API Gateway's 500."""

from typing import Any

from aws_lambda_powertools import Logger
from aws_lambda_powertools.logging import correlation_paths
from aws_lambda_powertools.utilities.data_classes import event_source
from aws_lambda_powertools.utilities.data_classes.api_gateway_authorizer_event import (
    APIGatewayAuthorizerRequestEvent,
    APIGatewayAuthorizerResponse,
)

from functions.core import deps
from functions.core.auth import resolve_tenant
from functions.core.errors import AuthenticationFailed
from functions.core.http import AUTH_HEADER
from functions.core.ports import Stores

logger = Logger(service="batch-api-authorizer")


def authorize(stores: Stores, event: APIGatewayAuthorizerRequestEvent, now: int) -> APIGatewayAuthorizerResponse:
    """The policy for this request (AuthenticationFailed if its key resolves to no tenant)."""
    headers = event.headers if event.raw_event.get("headers") else {}  # case-insensitive
    tenant = resolve_tenant(stores.keys, headers.get(AUTH_HEADER))
    arn = event.parsed_arn
    policy = APIGatewayAuthorizerResponse(
        principal_id=tenant,
        region=arn.region,
        aws_account_id=arn.aws_account_id,
        api_id=arn.api_id,
        stage=arn.stage,
        context={"tenant": tenant, "authorized_at": now},
        partition=arn.partition,
    )
    policy.allow_all_routes()  # every method and path of the stage: the answer is cached per key
    return policy


# correlation_id: API Gateway's request id, the x-request-id the client gets (also on a 401).
@logger.inject_lambda_context(correlation_id_path=correlation_paths.API_GATEWAY_REST, clear_state=True)
@event_source(data_class=APIGatewayAuthorizerRequestEvent)
def handler(event: APIGatewayAuthorizerRequestEvent, context: Any) -> dict[str, Any]:
    try:
        return authorize(deps.stores(), event, deps.now()).asdict()
    except AuthenticationFailed as exc:
        logger.info("rejected", extra={"reason": exc.message})
        raise Exception("Unauthorized") from None  # API Gateway's contract for a 401
