"""What a DynamoDB request names, read from the parameters a boto3 call was made with (botocore's
``provide-client-params`` event: native values, boto3 ``Key`` conditions): the items it reads or
writes, with the action IAM authorizes each by. Shared by the rights tests (tests/infra) and the
partition-limit meter (tests/fakes/partition_limits.py)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from functions.core import schema

#: A transaction's item kinds and the action each is authorized by.
TRANSACT_ACTIONS = {
    "Put": "PutItem",
    "Update": "UpdateItem",
    "Delete": "DeleteItem",
    "ConditionCheck": "ConditionCheckItem",
}


@dataclass(frozen=True)
class Touch:
    """One item (or, for a Query, one partition: ``sk`` None) a request reads or writes, and the
    IAM action that authorizes it (a transaction's items each by their own operation's)."""

    action: str
    pk: str
    sk: str | None
    transactional: bool = False

    @property
    def writes(self) -> bool:
        return self.action in ("PutItem", "UpdateItem", "DeleteItem", "ConditionCheckItem")


def _value(value: Any) -> str:
    return value["S"] if isinstance(value, dict) else value


def partition_of(condition: Any) -> str:
    """The table partition key value a Query's key condition (boto3 ``Key`` objects) names."""
    expression = condition.get_expression()
    if expression["operator"] == "AND":
        found = [partition_of(c) for c in expression["values"] if c.get_expression()["operator"] in ("=", "AND")]
        (value,) = [f for f in found if f]
        return value
    left, right = expression["values"]
    return right if expression["operator"] == "=" and left.name == schema.PK else ""


def touches(operation: str, params: dict[str, Any]) -> list[Touch]:
    """The items a request names (a Query on an index: none of the table's partitions)."""
    if operation == "TransactWriteItems":
        out = []
        for entry in params["TransactItems"]:
            ((kind, body),) = entry.items()
            keys = body["Item"] if kind == "Put" else body["Key"]
            out.append(Touch(TRANSACT_ACTIONS[kind], _value(keys[schema.PK]), _value(keys[schema.SK]), True))
        return out
    if operation in ("GetItem", "DeleteItem", "UpdateItem"):
        return [Touch(operation, _value(params["Key"][schema.PK]), _value(params["Key"][schema.SK]))]
    if operation == "PutItem":
        return [Touch(operation, _value(params["Item"][schema.PK]), _value(params["Item"][schema.SK]))]
    if operation == "BatchGetItem":
        return [
            Touch("BatchGetItem", _value(key[schema.PK]), _value(key[schema.SK]))
            for request in params["RequestItems"].values()
            for key in request["Keys"]
        ]
    if operation == "Query" and "IndexName" not in params:
        return [Touch("Query", partition_of(params["KeyConditionExpression"]), None)]
    return []
