"""Typed errors. Each carries what OpenAI's error envelope needs; one handler renders them."""

from typing import ClassVar


class ApiError(Exception):
    """An error the API reports to the caller as ``{"error": {message, type, param, code}}``."""

    status: ClassVar[int] = 400
    type: ClassVar[str] = "invalid_request_error"
    default_code: ClassVar[str | None] = None

    def __init__(self, message: str, *, param: str | None = None, code: str | None = None):
        super().__init__(message)
        self.message = message
        self.param = param
        self.code = code if code is not None else self.default_code

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


class InvalidRequest(ApiError):
    status = 400


class AuthenticationFailed(ApiError):
    status = 401
    default_code = "invalid_api_key"


class AccountDeactivated(AuthenticationFailed):
    """A key of a disabled tenant (``batchctl tenants disable``): OpenAI's answer for a key of a
    deactivated account, 401 ``invalid_request_error`` with code ``account_deactivated``."""

    default_code = "account_deactivated"


#: OpenAI's words for a key of a deactivated account, with this deployment's operator in place of
#: OpenAI's help center.
DEACTIVATED_MESSAGE = (
    "This key is associated with a deactivated account. If you feel this is an error, contact the "
    "operator of this deployment."
)


class NotFound(ApiError):
    status = 404


class Conflict(ApiError):
    status = 409


class PayloadTooLarge(ApiError):
    status = 413
    default_code = "request_too_large"


class RateLimited(ApiError):
    """A tenant's rate limit (``functions.core.tenants``): 429 ``rate_limit_error`` with a
    ``Retry-After`` header of ``retry_after`` seconds (rendered by ``functions.api.errors``)."""

    status = 429
    type = "rate_limit_error"
    default_code = "rate_limit_exceeded"

    def __init__(self, message: str, *, retry_after: int, param: str | None = None, code: str | None = None):
        super().__init__(message, param=param, code=code)
        self.retry_after = retry_after


class RequestRateLimited(RateLimited):
    """A tenant's ``requests_per_minute``: OpenAI's request-rate answer, 429 with ``type``
    ``requests`` (its tokens-per-minute answer says ``tokens``) and code ``rate_limit_exceeded``."""

    type = "requests"


class QuotaExceeded(ApiError):
    """A tenant's output-token budget is used up (``budget_action="reject"``): 429 with OpenAI's
    quota shape, ``type`` and ``code`` ``insufficient_quota``; no ``Retry-After`` (it lasts until
    the period ends or an operator raises the budget)."""

    status = 429
    type = "insufficient_quota"
    default_code = "insufficient_quota"


class ServerError(ApiError):
    status = 500
    type = "server_error"


class Throttled(ApiError):
    """The backing store throttled us: retryable, so 503 like OpenAI's overload answer."""

    status = 503
    type = "server_error"
    default_code = "service_unavailable"


class TransactionConflict(Throttled):
    """DynamoDB kept refusing a write because another transaction held the same item, after the
    adapter's own retries: retryable, answered like ``Throttled``."""


def not_found(kind: str, object_id: str, param: str = "id") -> NotFound:
    """OpenAI's wording for an unknown (or another tenant's) object."""
    return NotFound(f"No such {kind} object: {object_id}", param=param)


class StorageQuotaExceeded(InvalidRequest):
    """A file or upload that would take the tenant past its ``max_stored_bytes``: OpenAI's answer
    when an organization's file storage is full is a 400 ``invalid_request_error`` (with a null
    code); the code here names the case."""

    default_code = "storage_quota_exceeded"


#: The body API Gateway (and the local front) answers when the authorizer rejects a request.
UNAUTHORIZED_BODY = AuthenticationFailed(
    "Incorrect or missing API key. Send it as 'Authorization: Bearer <key>'."
).body()


#: The body of the authorizer's Deny (a disabled tenant's key): API Gateway's ACCESS_DENIED.
DEACTIVATED_BODY = AccountDeactivated(DEACTIVATED_MESSAGE).body()


class ConditionFailed(Exception):
    """A conditional write lost (the item exists, or is not in the expected state). Internal.
    ``items``: of a transaction, the positions of the items whose condition did not hold (empty
    when not known)."""

    def __init__(self, *args: object, items: tuple[int, ...] = ()):
        super().__init__(*args)
        self.items = items


class ChunksStopped(ConditionFailed):
    """A chunk's attempt was not opened: its batch (or the chunk's counting shard) takes no new
    chunks any more (cancelled, expiring, finished)."""
