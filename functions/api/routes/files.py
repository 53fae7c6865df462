"""/v1/files"""

from typing import Annotated

from aws_lambda_powertools.event_handler import Response
from aws_lambda_powertools.event_handler.api_gateway import Router
from aws_lambda_powertools.event_handler.openapi.params import File, Form, Query, UploadFile

from functions.core import deps, http
from functions.core.wire import FileDeleted, FileObject, ListPage

from .. import files
from ..protocol import ExpiresAfter, FileListQuery, UploadPurpose
from . import tenant

router = Router()


@router.post("/v1/files")
def create_file(
    file: Annotated[UploadFile, File()],
    purpose: Annotated[UploadPurpose, Form()],
    expires_anchor: Annotated[str | None, Form(alias="expires_after[anchor]")] = None,
    expires_seconds: Annotated[int | None, Form(alias="expires_after[seconds]")] = None,
) -> FileObject:
    return files.create_file(
        deps.stores(),
        deps.settings(),
        tenant(router),
        filename=file.filename or "file",
        content=file.content,
        purpose=purpose,
        expires_after=ExpiresAfter.from_form(expires_anchor, expires_seconds),
        now=deps.now(),
    )


@router.get("/v1/files")
def list_files(query: Annotated[FileListQuery, Query()]) -> ListPage[FileObject]:
    return files.list_files(deps.stores(), tenant(router), query, now=deps.now())


@router.get("/v1/files/<file_id>")
def get_file(file_id: str) -> FileObject:
    return files.get_file(deps.stores(), tenant(router), file_id, deps.now())


@router.get("/v1/files/<file_id>/content")
def get_file_content(file_id: str):  # a raw Response (bytes or a redirect)
    settings = deps.settings()
    if not http.is_binary_media_type(router.current_event.headers.get("Accept")):
        # No Accept header matches no binary media type: API Gateway would hand this client the
        # base64 text of an inline body, so a presigned URL gives it the bytes.
        settings = settings.model_copy(update={"inline_content_limit": -1})
    content = files.get_file_content(deps.stores(), settings, tenant(router), file_id, deps.now())
    if content.redirect is not None:
        return Response(status_code=307, headers={"Location": content.redirect}, body="")
    return Response(
        status_code=200,
        content_type="application/octet-stream",
        headers={"Content-Disposition": http.content_disposition(content.filename)},
        body=content.body,
    )


@router.delete("/v1/files/<file_id>")
def delete_file(file_id: str) -> FileDeleted:
    return files.delete_file(deps.stores(), tenant(router), file_id, deps.now())
