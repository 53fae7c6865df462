"""AWS error codes translated into domain errors, in one place: conditional-check failures become
``ConditionFailed``; throttling ``Throttled``; transaction conflicts ``TransactionConflict`` (a
``Throttled``). Nothing above the adapters matches on AWS error text.

A ``TransactWriteItems`` that DynamoDB cancels reports why per item in ``CancellationReasons``:
one ``ConditionalCheckFailed`` makes it a ``ConditionFailed`` (whatever the other reasons say);
otherwise a ``TransactionConflict`` reason is a conflict and a throttling reason is throttling.
Throttled and conflicting writes were not applied, so the caller may retry them (the DynamoDB
adapter does: ``dynamodb.Table``; see docs/reliability.md, "Transient AWS errors")."""

from collections.abc import Iterator
from contextlib import contextmanager

from botocore.exceptions import ClientError

from ..errors import ConditionFailed, Throttled, TransactionConflict

_THROTTLING = {
    "ProvisionedThroughputExceededException",
    "ThrottlingException",
    "RequestLimitExceeded",
    "SlowDown",
}
_CONFLICT = "TransactionConflictException"
_CANCELLED = "TransactionCanceledException"
#: Cancellation reasons (per item of a transaction) that mean "busy, try again".
_THROTTLING_REASONS = {"ThrottlingError", "ProvisionedThroughputExceeded", "RequestLimitExceeded"}
_CONFLICT_REASON = "TransactionConflict"

BUSY_MESSAGE = "The service is busy; retry the request shortly."


def _cancellation_reasons(exc: ClientError) -> list[str]:
    return [str(r.get("Code")) for r in exc.response.get("CancellationReasons", []) or []]


@contextmanager
def translate() -> Iterator[None]:
    try:
        yield
    except ClientError as exc:
        code = exc.response.get("Error", {}).get("Code", "")
        if code == "ConditionalCheckFailedException":
            raise ConditionFailed(code) from exc
        if code == _CONFLICT:
            raise TransactionConflict(BUSY_MESSAGE) from exc
        if code in _THROTTLING:
            raise Throttled(BUSY_MESSAGE) from exc
        if code == _CANCELLED:
            reasons = _cancellation_reasons(exc)
            if "ConditionalCheckFailed" in reasons:
                failed = tuple(i for i, r in enumerate(reasons) if r == "ConditionalCheckFailed")
                raise ConditionFailed(",".join(reasons), items=failed) from exc
            if _CONFLICT_REASON in reasons:
                raise TransactionConflict(BUSY_MESSAGE) from exc
            if _THROTTLING_REASONS.intersection(reasons):
                raise Throttled(BUSY_MESSAGE) from exc
        raise
