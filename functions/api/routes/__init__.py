"""The API's routes: one powertools ``Router`` per resource, included by the handler's app."""

from aws_lambda_powertools.event_handler.api_gateway import Router

from functions.core.errors import AuthenticationFailed


def tenant(router: Router) -> str:
    """The tenant the authorizer resolved for the current request; the only identity the API
    trusts (none: 401, as if the key were missing)."""
    context = (router.current_event.raw_event.get("requestContext") or {}).get("authorizer") or {}
    value = context.get("tenant")
    if not value:
        raise AuthenticationFailed("Incorrect or missing API key.")
    return value
