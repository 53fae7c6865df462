"""API Gateway REQUEST authorizer: ``Authorization: Bearer <key>`` -> tenant.

Reads the key's item and nothing else (its IAM: GetItem on ``KEY#*``). Allows the whole API for a
known key (so API Gateway may cache the answer per key) and passes the tenant in the authorizer
context. An unknown or missing key raises ``Unauthorized``, which API Gateway answers with 401 and
the OpenAI error envelope (its UNAUTHORIZED gateway response). A key of a disabled tenant gets a
Deny policy, the ACCESS_DENIED gateway response: 401 ``account_deactivated`` in this stack (the
only Deny this authorizer returns). API Gateway caches a Deny as it caches an Allow
(``authorizer_cache_seconds``). Any other exception is API Gateway's 500."""

from typing import Any

from aws_lambda_powertools import Logger
from aws_lambda_powertools.logging import correlation_paths
from aws_lambda_powertools.utilities.data_classes import event_source
from aws_lambda_powertools.utilities.data_classes.api_gateway_authorizer_event import (
    APIGatewayAuthorizerRequestEvent,
    APIGatewayAuthorizerResponse,
)

from functions.core import deps
from functions.core.auth import resolve_key
from functions.core.errors import AuthenticationFailed
from functions.core.http import AUTH_HEADER
from functions.core.ports import Stores

logger = Logger(service="batch-api-authorizer")


def authorize(stores: Stores, event: APIGatewayAuthorizerRequestEvent, now: int) -> APIGatewayAuthorizerResponse:
    """The policy for this request (AuthenticationFailed if its key resolves to no tenant; a Deny
    of every route for a disabled tenant's key)."""
    headers = event.headers if event.raw_event.get("headers") else {}  # case-insensitive
    record = resolve_key(stores.keys, headers.get(AUTH_HEADER))
    tenant, allowed = record.tenant, not record.disabled
    arn = event.parsed_arn
    policy = APIGatewayAuthorizerResponse(
        principal_id=tenant,
        region=arn.region,
        aws_account_id=arn.aws_account_id,
        api_id=arn.api_id,
        stage=arn.stage,
        context={"tenant": tenant, "authorized_at": now} if allowed else None,
        partition=arn.partition,
    )
    # Every method and path of the stage: the answer is cached per key.
    if allowed:
        policy.allow_all_routes()
    else:
        policy.deny_all_routes()
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
