"""/v1/uploads"""

from typing import Annotated

from aws_lambda_powertools.event_handler.api_gateway import Router
from aws_lambda_powertools.event_handler.openapi.params import Body, File, UploadFile

from functions.core import deps
from functions.core.wire import Upload, UploadPart

from .. import uploads
from ..protocol import CompleteUploadBody, CreateUploadBody
from . import tenant

router = Router()


@router.post("/v1/uploads")
def create_upload(body: Annotated[CreateUploadBody, Body()]) -> Upload:
    return uploads.create_upload(deps.stores(), deps.settings(), tenant(router), body, now=deps.now())


@router.post("/v1/uploads/<upload_id>/parts")
def add_upload_part(upload_id: str, data: Annotated[UploadFile, File()]) -> UploadPart:
    return uploads.add_part(
        deps.stores(), deps.settings(), tenant(router), upload_id, data=data.content, now=deps.now()
    )


@router.post("/v1/uploads/<upload_id>/complete")
def complete_upload(upload_id: str, body: Annotated[CompleteUploadBody, Body()]) -> Upload:
    return uploads.complete_upload(deps.stores(), deps.settings(), tenant(router), upload_id, body, now=deps.now())


@router.post("/v1/uploads/<upload_id>/cancel")
def cancel_upload(upload_id: str) -> Upload:
    return uploads.cancel_upload(deps.stores(), tenant(router), upload_id, now=deps.now())
