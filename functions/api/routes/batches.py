"""/v1/batches"""

from typing import Annotated

from aws_lambda_powertools.event_handler.api_gateway import Router
from aws_lambda_powertools.event_handler.openapi.params import Body, Query

from functions.core import deps
from functions.core.wire import Batch, ListPage

from .. import batches, idempotency
from ..protocol import BatchListQuery, CreateBatchBody
from . import tenant

router = Router()


@router.post("/v1/batches")
def create_batch(body: Annotated[CreateBatchBody, Body()]) -> Batch:
    headers = router.current_event.headers
    key = headers.get("idempotency-key") or headers.get("Idempotency-Key")
    request = idempotency.CreateBatchRequest(tenant=tenant(router), key=key or None, body=body)
    return idempotency.create_batch(request, router.lambda_context)


@router.get("/v1/batches")
def list_batches(query: Annotated[BatchListQuery, Query()]) -> ListPage[Batch]:
    return batches.list_batches(deps.stores(), tenant(router), query)


@router.get("/v1/batches/<batch_id>")
def get_batch(batch_id: str) -> Batch:
    return batches.get_batch(deps.stores(), tenant(router), batch_id)


@router.post("/v1/batches/<batch_id>/cancel")
def cancel_batch(batch_id: str) -> Batch:
    return batches.cancel_batch(deps.stores(), tenant(router), batch_id, now=deps.now())
