"""Batches API logic: takes its stores as arguments."""

from functions.core import ids, lifecycle, limits, schema, tenants
from functions.core.errors import InvalidRequest, not_found
from functions.core.ports import Stores
from functions.core.records import BatchRecord
from functions.core.settings import Settings
from functions.core.wire import Batch, BatchRequestCounts, ListPage

from .files import ready
from .protocol import BatchListQuery, CreateBatchBody


def create_batch(stores: Stores, settings: Settings, tenant: str, body: CreateBatchBody, *, now: int) -> Batch:
    """A batch in ``validating`` over a snapshot of its input file (ingest takes it from there)."""
    served = settings.served_endpoints()  # allowed, and answered by a model of this deployment
    if body.endpoint not in served:
        raise InvalidRequest(
            f"Invalid value for 'endpoint': {body.endpoint!r}. Supported values are: "
            + ", ".join(repr(e) for e in served)
            + ".",
            param="endpoint",
            code="invalid_value",
        )
    if body.completion_window not in settings.completion_windows:
        raise InvalidRequest(
            f"Invalid value for 'completion_window': {body.completion_window!r}. Supported values are: "
            + ", ".join(repr(w) for w in settings.completion_windows)
            + ".",
            param="completion_window",
            code="invalid_value",
        )
    input_file_id = body.input_file_id
    file = stores.files.get(tenant, input_file_id, now) if ids.is_valid(input_file_id, ids.FILE) else None
    if file is None:
        raise not_found("File", input_file_id, param="input_file_id")
    if file.purpose != "batch":
        raise InvalidRequest(
            f"File {input_file_id} has purpose {file.purpose!r}; a batch input file must have purpose 'batch'.",
            param="input_file_id",
            code="invalid_file_purpose",
        )
    ready(file, param="input_file_id")  # an Upload still being assembled is a clear 400 (docs/uploads.md)
    # Last: only a create that would otherwise succeed counts against the hourly limit (429).
    tenants.admit_creation(stores.tenants, tenant, now=now, budget_used=stores.batches.budget_used)
    batch_id = ids.new_id(ids.BATCH)
    record = BatchRecord(
        tenant=tenant,
        id=batch_id,
        input_file_id=input_file_id,
        endpoint=body.endpoint,
        completion_window=body.completion_window,
        created_at=now,
        expires_at=now + limits.window_seconds(body.completion_window),
        metadata=body.metadata,
        input_key=schema.batch_input_key(tenant, batch_id),
        output_expires_after=body.output_expires_after.seconds if body.output_expires_after else None,
    )
    # The snapshot first, then the record that makes the batch visible: a crash in between leaves
    # only an unreferenced snapshot (ingest finds no record, retries, dead-letters it), never a
    # batch stuck in `validating`. Ingest waits briefly for a record it does not see yet.
    stores.objects.copy(file.s3_key, record.input_key)
    stores.batches.create(record)
    return record.to_wire()


def get_batch(stores: Stores, tenant: str, batch_id: str) -> Batch:
    return wire(stores, _get(stores, tenant, batch_id))


def live_counts(stores: Stores, record: BatchRecord) -> BatchRequestCounts:
    """The lines finished so far (``ChunkProgress.lines``): the counted chunks', plus the
    checkpointed lines of each chunk not counted yet; the batch's own counters (folded shards only)
    are a floor. Each chunk's share only grows (segments are only added; a chunk is counted with at
    least its checkpointed lines, and its counters are read before the run records), so
    successive reads never go down."""
    completed, failed = stores.batches.chunk_progress(record).lines()
    return BatchRequestCounts(
        completed=max(record.completed, completed), failed=max(record.failed, failed), total=record.total
    )


def wire(stores: Stores, record: BatchRecord) -> Batch:
    """The batch as the API shows it: live request_counts while it is open."""
    batch = record.to_wire()
    if record.status in lifecycle.LIVE:
        batch = batch.model_copy(update={"request_counts": live_counts(stores, record)})
    return batch


def _get(stores: Stores, tenant: str, batch_id: str) -> BatchRecord:
    record = stores.batches.get(tenant, batch_id) if ids.is_valid(batch_id, ids.BATCH) else None
    if record is None:
        raise not_found("Batch", batch_id, param="batch_id")
    return record


def list_batches(stores: Stores, tenant: str, query: BatchListQuery) -> ListPage[Batch]:
    records, has_more = stores.batches.list(tenant, after=query.after, limit=query.limit)
    return ListPage[Batch].of([wire(stores, r) for r in records], has_more)


def cancel_batch(stores: Stores, tenant: str, batch_id: str, *, now: int) -> Batch:
    """validating/in_progress -> cancelling (the workflow, or ingest, finishes it as cancelled).
    Like OpenAI, cancelling a batch that is already cancelling, finalizing or terminal returns it
    unchanged."""
    return wire(stores, lifecycle.request_cancel(stores, _get(stores, tenant, batch_id), now))  # live counts, as a GET
