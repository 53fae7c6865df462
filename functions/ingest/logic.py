"""Ingest: validate a batch's input snapshot line by line (OpenAI's rules), cut it into chunks and
fan them out to the model's work queue, then start the batch's workflow.

Every step is safe to repeat: the state moves with conditional writes, the chunk manifest and the
work messages are deterministic, and the workflow execution is named after the batch."""

import math
from array import array
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from functions.core import chunk_lifecycle, guard, lifecycle, limits, schema, tenants
from functions.core.guard import GuardPolicy
from functions.core.lines import LineError, RawLine, check_request, iter_lines, parse_request, shown
from functions.core.messages import Chunk, ChunkManifest
from functions.core.ports import Objects, Stores
from functions.core.records import BatchRecord, CountShardRecord
from functions.core.settings import Settings
from functions.core.tenants import TenantPolicy
from functions.core.work import Bounds, Work, work_of


class BatchNotVisibleYet(Exception):
    """The snapshot exists but its batch record does not (yet): retry the event later."""


@dataclass
class Validation:
    errors: list[dict[str, Any]] = field(default_factory=list)
    model: str | None = None
    total: int = 0
    #: The prompt-token estimate of the valid lines (``tenants.estimate_tokens`` per line).
    tokens: int = 0
    #: The engine sequences the valid lines make (``work.Work.sequences``: what the enqueued-request
    #: cap counts), and the output tokens they may generate (their own limits, or the line bound a
    #: line without one is given; what a token cap reserves with ``reserve_output_tokens``).
    sequences: int = 0
    output_tokens: int = 0
    chunks: list[Chunk] = field(default_factory=list)
    #: The tenant's prompt and output policy, snapshotted into the manifest (``guard.active``).
    guard: GuardPolicy | None = None
    #: The bounds on one line's work (the deployment's, tightened by the tenant's policy).
    bounds: Bounds = field(default_factory=Bounds)
    #: An audio batch's media hosts when the tenant's policy narrows the deployment's
    #: (``tenants.media_domains``; None: the deployment's), snapshotted into the manifest.
    allowed_media_domains: tuple[str, ...] | None = None

    def media_domains(self, settings: Settings) -> tuple[str, ...]:
        """The hosts an audio line's ``file_url`` may name."""
        narrowed = self.allowed_media_domains
        return settings.allowed_media_domains if narrowed is None else narrowed


def validate(
    objects: Objects, settings: Settings, batch: BatchRecord, policy: TenantPolicy | None = None
) -> Validation:
    """Stream the input once: every line checked, chunks cut; memory is one line plus the set of
    custom_ids and three integers a valid line (bounded by the line limit). ``policy`` is the tenant's (None: no record, every
    served model allowed)."""
    result = Validation(
        guard=guard.active(policy.guard if policy is not None else None),
        bounds=settings.line_bounds.tighter(policy.line_bounds if policy is not None else None),
        allowed_media_domains=(
            tenants.media_domains(policy, settings.allowed_media_domains)
            if batch.endpoint in limits.AUDIO_ENDPOINTS
            else None
        ),
    )

    def fail(code: str, message: str, param: str | None = None, line: int | None = None) -> bool:
        result.errors.append({"code": code, "message": message, "param": param, "line": line})
        return len(result.errors) >= limits.MAX_REPORTED_ERRORS

    size = objects.size(batch.input_key)
    if size > settings.max_batch_file_bytes:
        fail("file_too_large", f"The input file is {size} bytes; at most {settings.max_batch_file_bytes} are allowed.")
        return result
    seen: set[str] = set()
    cutter = _Cutter(settings)
    for line in iter_lines(objects.iter_bytes(batch.input_key), max_line_bytes=settings.max_line_bytes):
        if line.blank:
            continue
        result.total += 1
        if result.total > settings.max_batch_lines:
            fail("too_many_tasks", f"The batch has more than {settings.max_batch_lines} requests.", line=line.number)
            break
        try:
            asked = _check_line(line, settings, batch, policy, result, seen)
        except LineError as error:
            if fail(error.code, error.message, error.param, line.number):
                break
            continue
        if result.errors:
            continue  # keep validating, but no chunks will be sent
        _count(result, line, asked)
        cutter.add(line)
    if not result.errors:
        route = settings.models.get(result.model or "")
        result.chunks = cutter.chunks(result.total, route.max_engines if route else 1)
    if result.total == 0 and not result.errors:
        fail("empty_file", "The input file has no requests.")
    return result


def _check_line(
    line: RawLine,
    settings: Settings,
    batch: BatchRecord,
    policy: TenantPolicy | None,
    result: Validation,
    seen: set[str],
) -> Work:
    """One line's request checked (its custom_id unique, its model the batch's one, its work within
    the bounds): the work it asks for. Raises ``LineError``."""
    request = parse_request(line)
    custom_id, model = check_request(
        request, endpoint=batch.endpoint, allowed_media_domains=result.media_domains(settings)
    )
    if custom_id in seen:
        raise LineError("duplicate_custom_id", f"The custom_id {shown(custom_id)} appears more than once.", "custom_id")
    seen.add(custom_id)
    if result.model is None:
        _check_model(model, settings, batch, policy)
        result.model = model
    elif model != result.model:
        raise LineError(
            "mismatched_model",
            f"The model {shown(model)} differs from the model {shown(result.model)} of the first request; "
            "a batch uses one model.",
            "body.model",
        )
    asked = work_of(batch.endpoint, request["body"])
    result.bounds.check(asked, batch.endpoint)
    return asked


def _check_model(model: str, settings: Settings, batch: BatchRecord, policy: TenantPolicy | None) -> None:
    """The first request's model: served for the batch's endpoint and allowed for the tenant."""
    route = settings.models.get(model)
    if route is None or batch.endpoint not in route.endpoints:
        raise LineError(
            "model_not_found",
            f"The model {shown(model)} is not served for {batch.endpoint} by this deployment.",
            "body.model",
        )
    if policy is not None and not policy.allows(model):
        raise LineError(
            "model_not_allowed",
            f"The model {shown(model)} is not allowed for this organization.",
            "body.model",
        )


def _count(result: Validation, line: RawLine, asked: Work) -> None:
    """A valid line's share of the batch's estimates (prompt tokens, sequences, output tokens)."""
    result.tokens += tenants.estimate_tokens(line.end - line.start)
    result.sequences += asked.sequences
    cap = result.bounds.output_cap(asked)
    result.output_tokens += asked.output_tokens or (cap * asked.sequences if cap is not None else 0)


class _Cutter:
    """The valid lines' offsets as they stream (three machine integers a line: at most
    ``max_batch_lines`` x 24 bytes, 1.2 MB at OpenAI's 50,000), cut into chunks once the total is
    known (``chunk_lines``), each also within ``chunk_max_bytes``."""

    def __init__(self, settings: Settings) -> None:
        self.max_lines = settings.chunk_max_lines
        self.max_bytes = settings.chunk_max_bytes
        self.starts, self.ends, self.numbers = array("q"), array("q"), array("q")

    def add(self, line: RawLine) -> None:
        self.starts.append(line.start)
        self.ends.append(line.end)
        self.numbers.append(line.number)

    def chunks(self, total: int, fleet: int = 1) -> list[Chunk]:
        """The chunks of the ``total`` lines added, for a model served by up to ``fleet`` engines."""
        lines = zip(self.starts, self.ends, self.numbers, strict=True)
        return _cut(lines, chunk_lines(total, self.max_lines, fleet), self.max_bytes)


def chunk_lines(total: int, chunk_max_lines: int, fleet: int = 1) -> int:
    """Lines per chunk (docs/lifecycle.md, "Chunking rule"): a small batch is spread over up to
    TARGET_CHUNKS chunks of at least MIN_CHUNK_LINES lines (so several GPUs share it and its
    progress moves chunk by chunk); a large one over CHUNKS_PER_ENGINE chunks for each engine of its
    model's ``fleet`` (at least TARGET_CHUNKS, at most LARGE_BATCH_CHUNKS), of at least
    ``chunk_max_lines`` and at most MAX_CHUNK_LINES lines, so the requests a chunk costs are spread
    over more lines as the batch grows. A fleet of more engines than LARGE_BATCH_CHUNKS gets at
    least CHUNKS_PER_GPU chunks per engine (of at least MIN_CHUNK_LINES lines), so that its whole
    fleet can work on one batch."""
    if total > limits.TARGET_CHUNKS * chunk_max_lines:
        chunks = max(limits.TARGET_CHUNKS, min(limits.LARGE_BATCH_CHUNKS, fleet * limits.CHUNKS_PER_ENGINE))
        size = max(chunk_max_lines, min(limits.MAX_CHUNK_LINES, math.ceil(total / chunks)))
    else:
        size = min(chunk_max_lines, max(limits.MIN_CHUNK_LINES, math.ceil(total / limits.TARGET_CHUNKS)))
    spread = math.ceil(total / (fleet * limits.CHUNKS_PER_GPU))
    return max(limits.MIN_CHUNK_LINES, min(size, spread)) if spread < size else size


def _cut(lines: Iterable[tuple[int, int, int]], size: int, max_bytes: int) -> list[Chunk]:
    """Chunks of consecutive (start, end, number) lines: at most ``size`` lines and ``max_bytes``
    bytes each (always at least one line)."""
    chunks: list[Chunk] = []
    current: dict[str, int] | None = None
    for start, end, number in lines:
        if current is not None and (current["line_count"] >= size or end - current["byte_start"] > max_bytes):
            chunks.append(Chunk(chunk=len(chunks), **current))
            current = None
        if current is None:
            current = {"byte_start": start, "byte_end": end, "first_line": number, "line_count": 0}
        current["line_count"] += 1
        current["byte_end"] = end
    if current is not None:
        chunks.append(Chunk(chunk=len(chunks), **current))
    return chunks


def ingest(
    stores: Stores,
    settings: Settings,
    tenant: str,
    batch_id: str,
    *,
    now: int,
    wait: Callable[[], None] = lambda: None,
    attempts: int = 1,
) -> str:
    """Ingest the snapshot of one batch at time ``now``; returns the batch's status afterwards.
    A batch record not visible yet is read again up to ``attempts`` times (``wait`` between), then
    BatchNotVisibleYet: the event is redelivered."""
    batch = None
    for attempt in range(attempts):
        batch = stores.batches.get(tenant, batch_id)
        if batch is not None:
            break
        if attempt + 1 < attempts:
            wait()
    if batch is None:
        raise BatchNotVisibleYet(f"no record for batch {batch_id} of tenant {tenant}")

    if batch.status == "validating":
        batch = _validate_and_move(stores, settings, batch, now)
    return resume(stores, settings, batch, now)


#: What a tenant reads on a batch whose input could not be processed: its ingest kept failing
#: until its event was dead-lettered, or the batch stayed ``validating`` past its deadline (the
#: sweeper). Short and true; the cause is in the logs, never here.
INGEST_FAILED_ERROR: dict[str, Any] = {
    "code": "ingest_failed",
    "message": "The batch's input file could not be processed. Submit the batch again; "
    "if this keeps happening, check that the file is a valid JSONL batch input.",
    "param": None,
    "line": None,
}


def fail_validating(stores: Stores, batch: BatchRecord, now: int) -> BatchRecord:
    """End a batch stuck ``validating`` as ``failed`` with ``INGEST_FAILED_ERROR`` and publish its
    status (only the writer that moved it publishes). A batch no longer validating is returned as
    stored, untouched: safe to call twice, and against a concurrent ingest."""
    return lifecycle.apply(stores, batch, lifecycle.refuse(now, [INGEST_FAILED_ERROR])).batch


def resume(stores: Stores, settings: Settings, batch: BatchRecord, now: int) -> str:
    """What follows validation, for a batch past it; returns its status afterwards. A batch
    cancelled before it started ends ``cancelled``; one moved on but not ``enqueued`` gets its work
    messages (duplicates are harmless: a chunk is counted once) and its workflow started (an
    execution named after the batch: starting it again is a no-op). Anything else: nothing."""
    if batch.status == "cancelling" and batch.in_progress_at is None:
        return _cancel_before_start(stores, batch, now)
    if batch.status in ("in_progress", "cancelling") and not batch.enqueued:
        _fan_out(stores, settings, batch, now)
    return batch.status


def _validate_and_move(stores: Stores, settings: Settings, batch: BatchRecord, now: int) -> BatchRecord:
    policy = stores.tenants.get(batch.tenant)  # its policy: one read
    result = validate(stores.objects, settings, batch, policy)
    if result.errors:
        return _fail_validation(stores, batch, result.errors, now)
    if (
        policy is not None
        and policy.budget_action == "stop"
        and (
            kind := tenants.over_budget(
                policy, lambda: stores.batches.budget_used(batch.tenant, tenants.budget_sk(policy.budget_period, now))
            )
        )
    ):
        return _fail_validation(stores, batch, [tenants.budget_error(policy, kind)], now)  # nothing of it runs
    # The manifest is deterministic: a repeated ingest writes the same bytes.
    manifest = (
        ChunkManifest(
            chunks=result.chunks,
            guard=result.guard,
            max_line_output_tokens=result.bounds.max_output_tokens,
            allowed_media_domains=result.allowed_media_domains,
        )
        .model_dump_json(exclude_none=True)
        .encode()
    )
    stores.objects.put(schema.batch_manifest_key(batch.tenant, batch.id), manifest, "application/json")
    values: dict[str, Any] = {
        "model": result.model,
        "total": result.total,
        "chunk_count": len(result.chunks),
        "count_shards": limits.count_shards(len(result.chunks)),
    }
    if (caps := tenants.budget_caps(policy)) is not None:  # its chunks charge the budget
        assert policy is not None
        values["budget_period"] = policy.budget_period
        if policy.budget_action == "stop":  # and its workers stop its lines at the budget
            values["budget_stop"] = caps.model_dump()
    assert result.model is not None
    reserved_tokens = result.tokens + (
        result.output_tokens if policy is not None and policy.reserve_output_tokens else 0
    )
    held = tenants.reservation(
        policy, result.model, result.sequences, reserved_tokens
    )  # None: no cap, no counter write
    # The reservation and the move in one transaction: a duplicate ingest reserves nothing twice.
    started = lifecycle.apply(stores, batch, lifecycle.start(now, values=values, reservation=held))
    if started.moved or held is None or started.batch.status != "validating":
        return started.batch  # moved, or another ingest moved it (or it was cancelled): as stored
    # Still validating: a cap refused the reservation.
    which = held.exceeded(*stores.batches.enqueued(batch.tenant, held.model))
    return _fail_validation(stores, batch, [held.error(which)], now)


def _fail_validation(stores: Stores, batch: BatchRecord, errors: list[dict[str, Any]], now: int) -> BatchRecord:
    return lifecycle.apply(stores, batch, lifecycle.refuse(now, errors)).batch


def _cancel_before_start(stores: Stores, batch: BatchRecord, now: int) -> str:
    return lifecycle.apply(stores, batch, lifecycle.cancel_unstarted(now)).batch.status


def _fan_out(stores: Stores, settings: Settings, batch: BatchRecord, now: int) -> None:
    if batch.status == "in_progress":
        assert batch.model is not None  # validation named it before the batch went in progress
        manifest = ChunkManifest.model_validate_json(
            stores.objects.get(schema.batch_manifest_key(batch.tenant, batch.id))
        )
        snapshot = {
            "guard": manifest.guard,
            "max_line_output_tokens": manifest.max_line_output_tokens,
            "allowed_media_domains": manifest.allowed_media_domains,
        }
        # Its counting shards before the first message: a chunk starts and counts on its shard.
        stores.batches.open_shards(CountShardRecord.of(batch, chunk_lifecycle.MARKER_RETENTION_SECONDS))
        messages = [
            batch.work_message(c).model_copy(update=snapshot).model_dump_json(exclude_none=True)
            for c in manifest.chunks
        ]  # the policy rides along (None: left out)
        stores.queues.queue(settings.models[batch.model].queue_url).send(messages)
    stores.workflows.start(
        batch.id,
        {
            "tenant": batch.tenant,
            "batch_id": batch.id,
            "timeout_seconds": limits.signal_wait_seconds(batch.expires_at, now, settings.reconcile_seconds),
            "poll_seconds": settings.drain_poll_seconds,
            "reconcile_seconds": settings.reconcile_seconds,
        },
    )
    stores.batches.transition(batch.tenant, batch.id, lifecycle.note_enqueued())
