"""The routes whose bodies API Gateway and Lambda cannot carry, served with the bytes streamed:
``POST /v1/files`` (a file of up to 512 MB, 200 MB for ``purpose=batch``), ``POST
/v1/uploads/{id}/parts`` (parts of up to 64 MB, OpenAI's) and ``GET /v1/files/{id}/content`` (any
size, no redirect).

The same rules as the API Lambda's routes, from the same code: the key resolved as the authorizer
resolves it, the tenant's request admission, the Files and Uploads logic (``functions.api``) with
only the byte transport different, OpenAI's error envelope, one audit intent per request. Uploads
hold a slot of the process's (``slots.Slots``): a tenant's share, and no more than the process
can hold in memory. Bytes go
from the connection to an S3 multipart upload as they arrive (memory: one S3 part, 8 MiB), and a
request that fails or whose client goes away leaves no File, no part, and no object."""

import json
import re
import uuid
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any, Final, Protocol

from aws_lambda_powertools.event_handler.openapi.exceptions import RequestValidationError
from pydantic import BaseModel

from functions.api import files, uploads
from functions.api.common import check_storage
from functions.api.errors import envelope, validation_to_api_error
from functions.api.protocol import ExpiresAfter, UploadPurpose, validate
from functions.core import audit, http, ids, limits, schema, tenants
from functions.core.auth import resolve_key
from functions.core.errors import DEACTIVATED_MESSAGE, AccountDeactivated, ApiError, InvalidRequest, ServerError
from functions.core.ports import ObjectWriter, Stores
from functions.core.settings import Settings

from . import body
from .form import MAX_FIELD_BYTES, MAX_PARTS, FormReader
from .slots import Slots

_PARTS = re.compile(r"^/v1/uploads/([^/]+)/parts$")
_CONTENT = re.compile(r"^/v1/files/([^/]+)/content$")
#: What a form may carry beside its file: its text fields and the part headers and boundaries.
FORM_OVERHEAD: Final = MAX_PARTS * (MAX_FIELD_BYTES + 1024)


def _path_id(pattern: re.Pattern[str], path: str) -> str:
    """The id ``pattern`` takes from ``path``, a path ``StreamFront.takes`` accepted."""
    match = pattern.match(path)
    if match is None:
        raise ValueError(f"not a streamed route: {path}")
    return match.group(1)


class RequestHeaders(Protocol):
    """A request's headers as read here: by name, None when absent (a mapping, or http.server's
    message of them)."""

    def get(self, name: str, /) -> str | None: ...


@dataclass
class Reply:
    """An answer: status, headers, and the body as bytes or as chunks of ``length`` bytes.
    ``close``: the request's body was not read to its end, so the connection cannot be reused."""

    status: int
    headers: list[tuple[str, str]]
    body: bytes | Iterable[bytes] = b""
    length: int | None = None
    close: bool = False
    audit_body: str | None = field(default=None, repr=False)


class _StreamedFileForm(BaseModel):
    purpose: UploadPurpose


class StreamFront:
    """Serves the streamed routes. ``stores`` and ``settings`` are the deployment's; ``now`` its
    clock (seconds)."""

    def __init__(
        self,
        stores: Callable[[], Stores],
        settings: Settings,
        now: Callable[[], int],
        policies: tenants.PolicyCache | None = None,
        slots: Slots | None = None,
    ):
        self._stores, self._settings, self._now = stores, settings, now
        self._policies = policies
        self.slots = slots or Slots()

    @staticmethod
    def takes(method: str, path: str) -> bool:
        """Whether ``method path`` is one of the streamed routes (any other request to the same
        paths, such as ``GET /v1/files``, is the API Lambda's)."""
        return (method == "POST" and (path == "/v1/files" or _PARTS.match(path) is not None)) or (
            method == "GET" and _CONTENT.match(path) is not None
        )

    def serve(self, method: str, path: str, headers: RequestHeaders, stream: body.Stream) -> Reply | None:
        """The answer to the request, its body read from ``stream``; None when the client went
        away before its body ended (there is no one to answer)."""
        request_id = str(uuid.uuid4())
        stores = self._stores()
        tenant = None
        try:
            tenant = self._admit(stores, headers)
            reply = self._route(stores, tenant, method, path, headers, stream)
        except body.ClientGone:
            return None
        except RequestValidationError as exc:
            reply = _error(validation_to_api_error(exc.errors()), close=True)
        except ApiError as exc:
            reply = _error(exc, close=True)
        except Exception:  # noqa: BLE001 - answered as the API answers an unexpected error
            reply = _error(ServerError("The server had an error while processing your request."), close=True)
        reply.headers.append((http.REQUEST_ID_HEADER, request_id))
        if tenant is not None and stores.audit_log is not None:
            audit.record_api_request(
                stores.audit_log,
                tenant,
                method=method,
                path=path,
                status=reply.status,
                body=reply.audit_body,
                authorization=headers.get(http.AUTH_HEADER),
                request_id=request_id,
                at=self._now(),
            )
        return reply

    def _admit(self, stores: Stores, headers: RequestHeaders) -> str:
        record = resolve_key(stores.keys, headers.get(http.AUTH_HEADER))
        if record.disabled:
            raise AccountDeactivated(DEACTIVATED_MESSAGE)
        policies = self._policies or tenants.PolicyCache(stores.tenants, self._settings.policy_cache_seconds)
        self._policies = policies
        tenants.admit_request(stores.tenants, policies.get(record.tenant), now=self._now())
        return record.tenant

    def _route(
        self, stores: Stores, tenant: str, method: str, path: str, headers: RequestHeaders, stream: body.Stream
    ) -> Reply:
        if method == "GET":
            return self._content(stores, tenant, _path_id(_CONTENT, path))
        with self.slots.hold(tenant):
            return self._upload(stores, tenant, path, headers, stream)

    def _upload(self, stores: Stores, tenant: str, path: str, headers: RequestHeaders, stream: body.Stream) -> Reply:
        chunks = body.chunks(
            stream,
            content_length=headers.get("Content-Length"),
            transfer_encoding=headers.get("Transfer-Encoding"),
            limit=self._body_limit(path),
            what="request body",
        )
        if path == "/v1/files":
            return self._create_file(stores, tenant, headers.get("Content-Type"), chunks)
        upload_id = _path_id(_PARTS, path)
        return self._add_part(stores, tenant, upload_id, headers.get("Content-Type"), chunks)

    def _body_limit(self, path: str) -> int:
        if path == "/v1/files":
            return max(self._settings.max_file_bytes, self._settings.max_batch_file_bytes) + FORM_OVERHEAD
        return limits.MAX_STREAMED_PART_BYTES + FORM_OVERHEAD

    # --- the routes ---------------------------------------------------------------------------
    def _create_file(self, stores: Stores, tenant: str, content_type: str | None, chunks: Iterator[bytes]) -> Reply:
        file_id = ids.new_id(ids.FILE)
        key = schema.file_key(tenant, file_id)
        form = _stream_form(stores, key, content_type, "file", chunks)
        try:
            if not form.has_file:
                raise InvalidRequest(
                    "Missing required parameter: 'file'.", param="file", code="missing_required_parameter"
                )
            purpose = validate(_StreamedFileForm, {"purpose": form.fields.get("purpose")}, loc=("form",)).purpose
            # pydantic reads the seconds field's text as the form route does
            expires_after = ExpiresAfter.from_form(
                form.fields.get("expires_after[anchor]"), form.fields.get("expires_after[seconds]")
            )
            filename = form.filename or "file"
            files.check_file(self._settings, filename, purpose, form.file_bytes, expires_after)
            quota = check_storage(stores, tenant, form.file_bytes)
        except BaseException:
            stores.objects.delete(key)
            raise
        created = files.register_file(
            stores,
            tenant,
            file_id,
            filename=filename,
            purpose=purpose,
            size=form.file_bytes,
            expires_after=expires_after,
            quota=quota,
            now=self._now(),
        )
        return _json(created.model_dump(mode="json"))

    def _add_part(
        self, stores: Stores, tenant: str, upload_id: str, content_type: str | None, chunks: Iterator[bytes]
    ) -> Reply:
        upload = uploads.pending_upload(stores, tenant, upload_id, self._now())
        part_id = ids.new_id(ids.PART)
        key = schema.upload_part_key(tenant, upload_id, part_id)
        form = _stream_form(stores, key, content_type, "data", chunks, limit=limits.MAX_STREAMED_PART_BYTES)
        try:
            if not form.has_file:
                raise InvalidRequest(
                    "Missing required parameter: 'data'.", param="data", code="missing_required_parameter"
                )
            uploads.check_part(form.file_bytes, limits.MAX_STREAMED_PART_BYTES)
            part = uploads.register_part(stores, upload, part_id, size=form.file_bytes, now=self._now())
        except BaseException:
            stores.objects.delete(key)
            raise
        return _json(part.model_dump(mode="json"))

    def _content(self, stores: Stores, tenant: str, file_id: str) -> Reply:
        record = files.stored_file(stores, tenant, file_id, self._now())
        return Reply(
            200,
            [
                ("Content-Type", "application/octet-stream"),
                ("Content-Disposition", http.content_disposition(record.filename)),
            ],
            body=stores.objects.iter_bytes(record.s3_key),
            length=record.bytes,
        )


def _stream_form(
    stores: Stores,
    key: str,
    content_type: str | None,
    file_field: str,
    chunks: Iterator[bytes],
    limit: int | None = None,
):  # a Form
    """Read the form, its ``file_field`` streamed into the object ``key`` (at most ``limit``
    bytes): on any failure the object is never completed (its multipart upload aborted)."""
    writer: ObjectWriter | None = None

    def open_file(_: str | None) -> Any:
        nonlocal writer
        writer = stores.objects.writer(key).__enter__()
        return _Bounded(writer, limit, file_field) if limit is not None else writer

    reader = FormReader(content_type, file_field, open_file)
    try:
        for chunk in chunks:
            reader.feed(chunk)
        form = reader.finish()
    except BaseException as exc:
        if writer is not None:
            writer.__exit__(type(exc), exc, None)
        raise
    if writer is not None:
        writer.__exit__(None, None, None)
    return form


class _Bounded:
    """A sink that refuses more than ``limit`` bytes (413, on the field)."""

    def __init__(self, sink: ObjectWriter, limit: int, param: str):
        self._sink, self._limit, self._param = sink, limit, param

    def write(self, data: bytes) -> None:
        if self._sink.bytes + len(data) > self._limit:
            raise body.too_large(self._sink.bytes + len(data), self._limit, f"'{self._param}' field")
        self._sink.write(data)


def _json(payload: dict[str, Any]) -> Reply:
    text = json.dumps(payload)
    return Reply(200, [("Content-Type", "application/json")], body=text.encode(), audit_body=text)


def _error(error: ApiError, *, close: bool) -> Reply:
    """``error`` in OpenAI's envelope, as the API Lambda renders it (``Retry-After`` on a 429)."""
    rendered = envelope(error)
    text = str(rendered.body)
    headers = [(k, str(v)) for k, v in rendered.headers.items() if k.lower() != "content-type"]
    return Reply(
        error.status, [("Content-Type", "application/json"), *headers], body=text.encode(), close=close, audit_body=text
    )
