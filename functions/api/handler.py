"""The api Lambda: glue between API Gateway (REST proxy) and the Files/Uploads/Batches logic.

Each route reads the tenant the authorizer put in the request context, calls one logic function
and returns its wire model. Typed errors become OpenAI's error envelope in one place.
"""

import json
import time
from typing import Annotated, Any

from aws_lambda_powertools import Logger
from aws_lambda_powertools.event_handler import APIGatewayRestResolver, Response
from aws_lambda_powertools.event_handler.exceptions import NotFoundError
from aws_lambda_powertools.event_handler.openapi.exceptions import RequestValidationError
from aws_lambda_powertools.event_handler.openapi.params import Body, File, Form, Query, UploadFile
from pydantic import BaseModel, ConfigDict

from aws_lambda_powertools.utilities.idempotency import DynamoDBPersistenceLayer, IdempotencyConfig, idempotent_function

from functions.core import clients, deps, limits, schema
from functions.core.errors import ApiError, AuthenticationFailed, InvalidRequest, NotFound, ServerError
from functions.core.models import Batch, FileDeleted, FileObject, ListPage, Model, Upload, UploadPart

from . import batches, files, uploads

logger = Logger(service="batch-api")
app = APIGatewayRestResolver(enable_validation=True)

stores = deps.stores


def now() -> int:
    return int(time.time())


def tenant() -> str:
    """The tenant the authorizer resolved; the only identity this handler trusts."""
    context = (app.current_event.raw_event.get("requestContext") or {}).get("authorizer") or {}
    value = context.get("tenant")
    if not value:
        raise AuthenticationFailed("Incorrect or missing API key.")
    return value


# --- Errors -----------------------------------------------------------------------------------
def _envelope(error: ApiError) -> Response:
    return Response(status_code=error.status, content_type="application/json", body=json.dumps(error.body()))


@app.exception_handler(ApiError)
def handle_api_error(error: ApiError) -> Response:
    return _envelope(error)


@app.exception_handler(RequestValidationError)
def handle_validation_error(error: RequestValidationError) -> Response:
    return _envelope(validation_to_api_error(error.errors()))


@app.not_found
def handle_not_found(_: NotFoundError) -> Response:
    event = app.current_event
    return _envelope(NotFound(f"Invalid URL ({event.http_method} {event.path})"))


@app.exception_handler(Exception)
def handle_unexpected(error: Exception) -> Response:
    logger.exception("unhandled error")
    return _envelope(ServerError("The server had an error while processing your request."))


def validation_to_api_error(errors: list[dict[str, Any]]) -> ApiError:
    """The first pydantic/powertools validation error, in OpenAI's words."""
    first = errors[0] if errors else {}
    loc = [str(p) for p in first.get("loc", ()) if p not in ("body", "query", "path", "form")]
    kind = first.get("type", "")
    if kind == "json_invalid":
        return InvalidRequest("We could not parse the JSON body of your request. The body must be valid JSON.")
    if kind == "multipart_invalid":
        return InvalidRequest("We could not parse the multipart/form-data body of your request.")
    param = ".".join(loc) or None
    if kind == "missing":
        return InvalidRequest(f"Missing required parameter: '{param}'.", param=param, code="missing_required_parameter")
    return InvalidRequest(f"Invalid value for '{param}': {first.get('msg', 'invalid')}.", param=param, code="invalid_value")


# --- Files ------------------------------------------------------------------------------------
@app.post("/v1/files")
def create_file(
    file: Annotated[UploadFile, File()],
    purpose: Annotated[str, Form()],
    expires_anchor: Annotated[str | None, Form(alias="expires_after[anchor]")] = None,
    expires_seconds: Annotated[int | None, Form(alias="expires_after[seconds]")] = None,
) -> FileObject:
    return files.create_file(
        stores(), deps.settings(), tenant(),
        filename=file.filename or "file", content=file.content, purpose=purpose,
        expires_anchor=expires_anchor, expires_seconds=expires_seconds, now=now(),
    )


@app.get("/v1/files")
def list_files(
    purpose: Annotated[str | None, Query()] = None,
    limit: Annotated[int, Query()] = limits.FILES_LIST_DEFAULT_LIMIT,
    order: Annotated[str, Query()] = "desc",
    after: Annotated[str | None, Query()] = None,
) -> ListPage[FileObject]:
    return files.list_files(stores(), tenant(), purpose=purpose, limit=limit, order=order, after=after, now=now())


@app.get("/v1/files/<file_id>")
def get_file(file_id: str) -> FileObject:
    return files.get_file(stores(), tenant(), file_id, now())


@app.get("/v1/files/<file_id>/content")
def get_file_content(file_id: str):  # noqa: ANN201 - a raw Response (bytes or a redirect)
    content = files.get_file_content(stores(), deps.settings(), tenant(), file_id, now())
    if content.redirect is not None:
        return Response(status_code=307, headers={"Location": content.redirect}, body="")
    return Response(
        status_code=200,
        content_type="application/octet-stream",
        headers={"Content-Disposition": f'attachment; filename="{content.filename}"'},
        body=content.body,
    )


@app.delete("/v1/files/<file_id>")
def delete_file(file_id: str) -> FileDeleted:
    return files.delete_file(stores(), tenant(), file_id, now())


# --- Uploads ----------------------------------------------------------------------------------
class ExpiresAfter(BaseModel):
    anchor: str
    seconds: int


class CreateUploadBody(BaseModel):
    model_config = ConfigDict(extra="ignore")
    bytes: int
    filename: str
    mime_type: str
    purpose: str
    expires_after: ExpiresAfter | None = None


class CompleteUploadBody(BaseModel):
    part_ids: list[str]
    md5: str | None = None


@app.post("/v1/uploads")
def create_upload(body: Annotated[CreateUploadBody, Body()]) -> Upload:
    expires = body.expires_after
    return uploads.create_upload(
        stores(), deps.settings(), tenant(),
        filename=body.filename, purpose=body.purpose, size=body.bytes, mime_type=body.mime_type,
        expires_anchor=expires.anchor if expires else None, expires_seconds=expires.seconds if expires else None,
        now=now(),
    )


@app.post("/v1/uploads/<upload_id>/parts")
def add_upload_part(upload_id: str, data: Annotated[UploadFile, File()]) -> UploadPart:
    return uploads.add_part(stores(), deps.settings(), tenant(), upload_id, data=data.content, now=now())


@app.post("/v1/uploads/<upload_id>/complete")
def complete_upload(upload_id: str, body: Annotated[CompleteUploadBody, Body()]) -> Upload:
    return uploads.complete_upload(stores(), tenant(), upload_id, part_ids=body.part_ids, md5=body.md5, now=now())


@app.post("/v1/uploads/<upload_id>/cancel")
def cancel_upload(upload_id: str) -> Upload:
    return uploads.cancel_upload(stores(), tenant(), upload_id, now=now())


# --- Batches ----------------------------------------------------------------------------------
class CreateBatchBody(BaseModel):
    model_config = ConfigDict(extra="ignore")
    input_file_id: str
    endpoint: str
    completion_window: str
    metadata: dict[str, Any] | None = None
    output_expires_after: ExpiresAfter | None = None


#: A create retried with the same Idempotency-Key header returns the first batch for 24 hours;
#: without the header, an identical body from the same tenant within 10 minutes does (this covers
#: the SDK's automatic retries, which send no key).
KEYED_IDEMPOTENCY_SECONDS = 86_400
BODY_IDEMPOTENCY_SECONDS = 600


@deps.per_process
def _create_batch_once() -> dict[bool, tuple[Any, IdempotencyConfig]]:
    """The idempotent create, keyed by header or by body (powertools idempotency, same table)."""

    def run(request: dict[str, Any]) -> dict[str, Any]:
        body = request["body"]
        expires = body.get("output_expires_after") or {}
        return batches.create_batch(
            stores(), deps.settings(), request["tenant"],
            input_file_id=body["input_file_id"], endpoint=body["endpoint"],
            completion_window=body["completion_window"], metadata=body.get("metadata"),
            output_expires_anchor=expires.get("anchor"), output_expires_seconds=expires.get("seconds"), now=now(),
        ).model_dump()

    def once(keyed_by: str, seconds: int) -> tuple[Any, IdempotencyConfig]:
        persistence = DynamoDBPersistenceLayer(
            table_name=deps.settings().table_name,
            key_attr=schema.PK,
            sort_key_attr=schema.SK,
            static_pk_value=f"IDEMPOTENCY#create_batch#{keyed_by}",
            expiry_attr=schema.TTL,
            boto3_client=clients.client("dynamodb"),
        )
        config = IdempotencyConfig(event_key_jmespath=f"[tenant, {keyed_by}]", expires_after_seconds=seconds)
        function = idempotent_function(run, data_keyword_argument="request", persistence_store=persistence, config=config)
        return function, config

    return {True: once("key", KEYED_IDEMPOTENCY_SECONDS), False: once("body", BODY_IDEMPOTENCY_SECONDS)}


@app.post("/v1/batches")
def create_batch(body: Annotated[CreateBatchBody, Body()]) -> Batch:
    key = app.current_event.headers.get("idempotency-key") or app.current_event.headers.get("Idempotency-Key")
    request = {"tenant": tenant(), "key": key, "body": body.model_dump(mode="json")}
    function, config = _create_batch_once()[bool(key)]
    config.register_lambda_context(app.lambda_context)
    return Batch.model_validate(function(request=request))


@app.get("/v1/batches")
def list_batches(
    after: Annotated[str | None, Query()] = None,
    limit: Annotated[int, Query()] = limits.BATCHES_LIST_DEFAULT_LIMIT,
) -> ListPage[Batch]:
    return batches.list_batches(stores(), tenant(), after=after, limit=limit)


@app.get("/v1/batches/<batch_id>")
def get_batch(batch_id: str) -> Batch:
    return batches.get_batch(stores(), tenant(), batch_id)


@app.post("/v1/batches/<batch_id>/cancel")
def cancel_batch(batch_id: str) -> Batch:
    return batches.cancel_batch(stores(), tenant(), batch_id, now=now())


# --- Models -----------------------------------------------------------------------------------
@app.get("/v1/models")
def list_models() -> dict[str, Any]:
    tenant()
    return batches.list_models(deps.settings(), created=MODELS_CREATED)


@app.get("/v1/models/<model_id>")
def get_model(model_id: str) -> Model:
    tenant()
    return batches.get_model(deps.settings(), model_id, created=MODELS_CREATED)


#: When this process started: the `created` of the served models (they are served from deployment).
MODELS_CREATED = int(time.time())


@logger.inject_lambda_context(clear_state=True)
def handler(event: dict[str, Any], context: Any) -> dict[str, Any]:
    return app.resolve(event, context)
