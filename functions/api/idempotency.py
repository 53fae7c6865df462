"""Idempotent batch create, OpenAI's way (powertools idempotency), and the persistence it keeps its
records in.

Only a create that sends an ``Idempotency-Key`` header is idempotent: the same tenant, key and body
return the first batch for 24 hours; the same key with another body raises powertools'
``IdempotencyValidationError`` (the payload hash differs), and the same key while the first create is
still running raises ``IdempotencyAlreadyInProgressError``; ``errors`` renders both as 409. Without
the header every create is a new batch, as on OpenAI (the SDK's automatic retries send no key).
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
from functions.core.settings import Settings
from functions.core.wire import Batch

from . import batches
from .protocol import CreateBatchBody

KEYED_IDEMPOTENCY_SECONDS = 86_400


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
    """A create: the tenant and key make its idempotency key, the body its payload hash."""

    tenant: str
    key: str | None = None
    body: CreateBatchBody


def _create(request: CreateBatchRequest) -> Batch:
    return batches.create_batch(deps.stores(), deps.settings(), request.tenant, request.body, now=deps.now())


@deps.per_process
def _keyed() -> tuple[Callable[..., Batch], IdempotencyConfig]:
    """The create wrapped once: keyed by ``[tenant, key]``, the body validated against the record."""
    config = IdempotencyConfig(
        event_key_jmespath="[tenant, key]",
        payload_validation_jmespath="body",
        expires_after_seconds=KEYED_IDEMPOTENCY_SECONDS,
    )
    function = idempotent_function(
        _create,
        data_keyword_argument="request",
        persistence_store=persistence_layer(deps.settings(), "create_batch#key"),
        config=config,
        output_serializer=PydanticSerializer(Batch),
    )
    return function, config


def create_batch(request: CreateBatchRequest, lambda_context: Any) -> Batch:
    """A new batch, unless ``request.key`` was used by this tenant in the last 24 hours."""
    if request.key is None:
        return _create(request)
    function, config = _keyed()
    config.register_lambda_context(lambda_context)
    return function(request=request)
