"""API Gateway REQUEST authorizer: ``Authorization: Bearer <key>`` -> tenant.

Allows the whole API for a known key (so API Gateway may cache the answer per key) and passes the
tenant in the authorizer context. Any failure raises ``Unauthorized``, which API Gateway answers
with 401 and the OpenAI error envelope (its UNAUTHORIZED gateway response)."""

import time
from typing import Any

from aws_lambda_powertools import Logger

from functions.core import deps
from functions.core.auth import resolve_tenant
from functions.core.errors import AuthenticationFailed
from functions.core.ports import Stores

logger = Logger(service="batch-api-authorizer")

def authorize(stores: Stores, headers: dict[str, str], method_arn: str) -> dict[str, Any]:
    """The authorizer's answer for a request with these headers (AuthenticationFailed if none)."""
    authorization = next((v for k, v in (headers or {}).items() if k.lower() == "authorization"), None)
    tenant = resolve_tenant(stores.keys, authorization)
    # arn:aws:execute-api:region:account:api-id/stage/METHOD/path -> allow every method and path.
    api_arn = "/".join(method_arn.split("/")[:2]) + "/*"
    return {
        "principalId": tenant,
        "policyDocument": {
            "Version": "2012-10-17",
            "Statement": [{"Action": "execute-api:Invoke", "Effect": "Allow", "Resource": api_arn}],
        },
        "context": {"tenant": tenant, "authorized_at": int(time.time())},
    }


@logger.inject_lambda_context(clear_state=True)
def handler(event: dict[str, Any], context: Any) -> dict[str, Any]:
    try:
        return authorize(deps.stores(), event.get("headers") or {}, event.get("methodArn", ""))
    except AuthenticationFailed as exc:
        logger.info("rejected", extra={"reason": exc.message})
        raise Exception("Unauthorized") from None  # API Gateway's contract for a 401
