"""AWS error codes translated into domain errors, in one place: conditional-check failures become
``ConditionFailed``, throttling and conflicts ``Throttled``. Nothing above the adapters matches on
AWS error text."""

from collections.abc import Iterator
from contextlib import contextmanager

from botocore.exceptions import ClientError

from ..errors import ConditionFailed, Throttled

_THROTTLING = {
    "ProvisionedThroughputExceededException",
    "ThrottlingException",
    "RequestLimitExceeded",
    "SlowDown",
    "TransactionConflictException",
}


@contextmanager
def translate() -> Iterator[None]:
    try:
        yield
    except ClientError as exc:
        code = exc.response.get("Error", {}).get("Code", "")
        if code == "ConditionalCheckFailedException":
            raise ConditionFailed(code) from exc
        if code in _THROTTLING:
            raise Throttled("The service is busy; retry the request shortly.") from exc
        raise
