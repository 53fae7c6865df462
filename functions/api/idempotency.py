"""Idempotent batch create (powertools idempotency) and the persistence it keeps its records in.

A create retried with the same ``Idempotency-Key`` header returns the first batch for 24 hours;
without the header, an identical body from the same tenant within 10 minutes does (this covers
the SDK's automatic retries, which send no key).
"""

from collections.abc import Callable
from typing import Any

from aws_lambda_powertools.utilities.idempotency import (
    DynamoDBPersistenceLayer,
    IdempotencyConfig,
    idempotent_function,
)
from aws_lambda_powertools.utilities.idempotency.serialization.pydantic import PydanticSerializer
from pydantic import BaseModel

from functions.core import clients, deps, schema
from functions.core.models import Batch
from functions.core.settings import Settings

from . import batches
from .protocol import CreateBatchBody

KEYED_IDEMPOTENCY_SECONDS = 86_400
BODY_IDEMPOTENCY_SECONDS = 600


def persistence_layer(settings: Settings, scope: str) -> DynamoDBPersistenceLayer:
    """Powertools' idempotency records in the service table, under their own partition
    (``IDEMPOTENCY#<scope>``), expiring through the table's TTL attribute."""
    return DynamoDBPersistenceLayer(
        table_name=settings.table_name,
        key_attr=schema.PK,
        sort_key_attr=schema.SK,
        static_pk_value=f"IDEMPOTENCY#{scope}",
        expiry_attr=schema.TTL,
        boto3_client=clients.client("dynamodb"),
    )


class CreateBatchRequest(BaseModel):
    """What makes two creates the same: the tenant, and the key header or else the body."""

    tenant: str
    key: str | None = None
    body: CreateBatchBody


def _create(request: CreateBatchRequest) -> Batch:
    return batches.create_batch(deps.stores(), deps.settings(), request.tenant, request.body, now=deps.clock()())


@deps.per_process
def _once() -> dict[bool, tuple[Callable[..., Batch], IdempotencyConfig]]:
    """The create wrapped twice, keyed by header (True) or by body (False)."""

    def wrap(keyed_by: str, seconds: int) -> tuple[Callable[..., Batch], IdempotencyConfig]:
        config = IdempotencyConfig(event_key_jmespath=f"[tenant, {keyed_by}]", expires_after_seconds=seconds)
        function = idempotent_function(
            _create,
            data_keyword_argument="request",
            persistence_store=persistence_layer(deps.settings(), f"create_batch#{keyed_by}"),
            config=config,
            output_serializer=PydanticSerializer(Batch),
        )
        return function, config

    return {True: wrap("key", KEYED_IDEMPOTENCY_SECONDS), False: wrap("body", BODY_IDEMPOTENCY_SECONDS)}


def create_batch(request: CreateBatchRequest, lambda_context: Any) -> Batch:
    function, config = _once()[request.key is not None]
    config.register_lambda_context(lambda_context)
    return function(request=request)
