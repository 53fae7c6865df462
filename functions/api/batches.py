"""Batches API logic (and the models list): takes its stores as arguments."""

from typing import Any

from functions.core import accounting, ids, limits, schema
from functions.core.accounting import Signal
from functions.core.errors import ConditionFailed, InvalidRequest, not_found
from functions.core.models import Batch, ListPage, Model
from functions.core.records import BatchRecord
from functions.core.settings import Settings
from functions.core.ports import Stores

from .files import check_list_params

#: Statuses from which a cancel moves the batch to cancelling.
CANCELLABLE = ("validating", "in_progress")


def _check_metadata(metadata: Any) -> dict[str, str] | None:
    if metadata is None:
        return None
    if not isinstance(metadata, dict):
        raise InvalidRequest("Invalid value for 'metadata': it must be an object of strings.", param="metadata", code="invalid_value")
    if len(metadata) > limits.METADATA_MAX_PAIRS:
        raise InvalidRequest(
            f"Invalid value for 'metadata': at most {limits.METADATA_MAX_PAIRS} key-value pairs are allowed.",
            param="metadata", code="invalid_value",
        )
    for key, value in metadata.items():
        if not isinstance(value, str):
            raise InvalidRequest(f"Invalid value for 'metadata.{key}': values must be strings.", param="metadata", code="invalid_value")
        if len(key) > limits.METADATA_MAX_KEY:
            raise InvalidRequest(
                f"Invalid value for 'metadata': keys may be at most {limits.METADATA_MAX_KEY} characters.",
                param="metadata", code="invalid_value",
            )
        if len(value) > limits.METADATA_MAX_VALUE:
            raise InvalidRequest(
                f"Invalid value for 'metadata.{key}': values may be at most {limits.METADATA_MAX_VALUE} characters.",
                param="metadata", code="invalid_value",
            )
    return metadata


def _check_output_expiry(anchor: str | None, seconds: int | None) -> int | None:
    if anchor is None and seconds is None:
        return None
    if anchor != "created_at":
        raise InvalidRequest(
            f"Invalid value for 'output_expires_after.anchor': {anchor!r}. Supported values are: 'created_at'.",
            param="output_expires_after.anchor", code="invalid_value",
        )
    if seconds is None or not limits.EXPIRES_AFTER_MIN_SECONDS <= seconds <= limits.EXPIRES_AFTER_MAX_SECONDS:
        raise InvalidRequest(
            f"Invalid value for 'output_expires_after.seconds': {seconds}. It must be between "
            f"{limits.EXPIRES_AFTER_MIN_SECONDS} and {limits.EXPIRES_AFTER_MAX_SECONDS}.",
            param="output_expires_after.seconds", code="invalid_value",
        )
    return seconds


def create_batch(
    stores: Stores,
    settings: Settings,
    tenant: str,
    *,
    input_file_id: str,
    endpoint: str,
    completion_window: str,
    metadata: Any = None,
    output_expires_anchor: str | None = None,
    output_expires_seconds: int | None = None,
    now: int,
) -> Batch:
    if endpoint not in settings.allowed_endpoints:
        raise InvalidRequest(
            f"Invalid value for 'endpoint': {endpoint!r}. Supported values are: "
            + ", ".join(repr(e) for e in settings.allowed_endpoints) + ".",
            param="endpoint", code="invalid_value",
        )
    if completion_window not in settings.completion_windows:
        raise InvalidRequest(
            f"Invalid value for 'completion_window': {completion_window!r}. Supported values are: "
            + ", ".join(repr(w) for w in settings.completion_windows) + ".",
            param="completion_window", code="invalid_value",
        )
    checked_metadata = _check_metadata(metadata)
    output_expiry = _check_output_expiry(output_expires_anchor, output_expires_seconds)
    file = stores.files.get(tenant, input_file_id, now) if ids.is_valid(input_file_id, ids.FILE) else None
    if file is None:
        raise not_found("File", input_file_id, param="input_file_id")
    if file.purpose != "batch":
        raise InvalidRequest(
            f"File {input_file_id} has purpose {file.purpose!r}; a batch input file must have purpose 'batch'.",
            param="input_file_id", code="invalid_file_purpose",
        )
    batch_id = ids.new_id(ids.BATCH)
    record = BatchRecord(
        tenant=tenant,
        id=batch_id,
        input_file_id=input_file_id,
        endpoint=endpoint,
        completion_window=completion_window,
        created_at=now,
        expires_at=now + limits.window_seconds(completion_window),
        metadata=checked_metadata,
        input_key=schema.batch_input_key(tenant, batch_id),
        output_expires_after=output_expiry,
    )
    # The snapshot first, then the record that makes the batch visible: a crash in between leaves
    # only an unreferenced snapshot (ingest finds no record, retries, dead-letters it), never a
    # batch stuck in `validating`. Ingest waits briefly for a record it does not see yet.
    stores.objects.copy(file.s3_key, record.input_key)
    stores.batches.create(record)
    return record.to_wire()


def get_batch(stores: Stores, tenant: str, batch_id: str) -> Batch:
    return _get(stores, tenant, batch_id).to_wire()


def _get(stores: Stores, tenant: str, batch_id: str) -> BatchRecord:
    record = stores.batches.get(tenant, batch_id) if ids.is_valid(batch_id, ids.BATCH) else None
    if record is None:
        raise not_found("Batch", batch_id, param="batch_id")
    return record


def list_batches(stores: Stores, tenant: str, *, after: str | None, limit: int) -> ListPage[Batch]:
    check_list_params(limit, "desc", after, max_limit=limits.BATCHES_LIST_MAX_LIMIT, id_prefix=ids.BATCH, kind="batch")
    records, has_more = stores.batches.list(tenant, after=after, limit=limit)
    return ListPage[Batch].of([r.to_wire() for r in records], has_more)


def cancel_batch(stores: Stores, tenant: str, batch_id: str, *, now: int) -> Batch:
    """validating/in_progress -> cancelling (the workflow, or ingest, finishes it as cancelled).
    Like OpenAI, cancelling a batch that is already cancelling, finalizing or terminal returns it
    unchanged."""
    record = _get(stores, tenant, batch_id)
    if record.status not in CANCELLABLE:
        return record.to_wire()
    try:
        record = stores.batches.update(
            record.tenant, record.id, values={"status": "cancelling", "cancelling_at": now}, expect={"status": CANCELLABLE}
        )
    except ConditionFailed:
        return _get(stores, tenant, batch_id).to_wire()  # it moved on meanwhile
    if record.task_token:
        accounting.signal(stores.workflows, record.task_token, Signal.CANCEL)
    return record.to_wire()


def list_models(settings: Settings, *, created: int) -> dict[str, Any]:
    """GET /v1/models: the models this deployment serves."""
    data = [Model(id=name, created=created, owned_by="batch-api").model_dump() for name in sorted(settings.models)]
    return {"object": "list", "data": data}


def get_model(settings: Settings, model_id: str, *, created: int) -> Model:
    if model_id not in settings.models:
        raise not_found("Model", model_id, param="model")
    return Model(id=model_id, created=created, owned_by="batch-api")


