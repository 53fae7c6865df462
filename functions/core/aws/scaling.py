"""The scaler's adapters (ports in ``functions.scaler.logic``): ECS service task counts, SQS queue
depth, and the scaler's small state item in the table (``schema.scaler_pk``)."""

from typing import Any

from ..schema import PK, SK, scaler_pk

#: The sort key of a scaler state item.
STATE_SK = "STATE"


class EcsServices:
    def __init__(self, ecs: Any):
        self._ecs = ecs

    def counts(self, cluster: str, service: str) -> tuple[int, int]:
        found = self._ecs.describe_services(cluster=cluster, services=[service])["services"]
        if not found:
            raise LookupError(f"ECS service {service!r} not found in cluster {cluster!r}")
        return int(found[0]["desiredCount"]), int(found[0]["runningCount"])

    def set_desired(self, cluster: str, service: str, desired: int) -> None:
        self._ecs.update_service(cluster=cluster, service=service, desiredCount=desired)


class SqsDepth:
    def __init__(self, sqs: Any):
        self._sqs = sqs

    def depth(self, queue_url: str) -> tuple[int, int]:
        attributes = self._sqs.get_queue_attributes(
            QueueUrl=queue_url,
            AttributeNames=["ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible"],
        )["Attributes"]
        return int(attributes["ApproximateNumberOfMessages"]), int(attributes["ApproximateNumberOfMessagesNotVisible"])


class TableScalerState:
    """One item per model: ``{pk: SCALER#<model>, sk: STATE, idle_since?, scaled_in_at?}``."""

    def __init__(self, table: Any):
        self._table = table

    def load(self, model: str) -> dict[str, int]:
        item = self._table.get_item(Key={PK: scaler_pk(model), SK: STATE_SK}, ConsistentRead=True).get("Item") or {}
        return {k: int(v) for k, v in item.items() if k not in (PK, SK)}

    def save(self, model: str, values: dict[str, int]) -> None:
        self._table.put_item(Item={PK: scaler_pk(model), SK: STATE_SK, **values})
