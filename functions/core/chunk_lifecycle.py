"""The chunk lifecycle, shared by the GPU worker, the chunk DLQ consumer, the workflow and the API:
a chunk is run in attempts (its run record: poison budget, checkpoints), the first of each
opened only while its batch takes new chunks, and counted exactly once, only while its batch
accepts chunks; whoever counts the last one (or a duplicate of it) signals the workflow. A chunk
is running while its run record has an open attempt and it is not counted. The batch's own
statuses and transitions are ``lifecycle``'s."""

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel

from . import audit, lifecycle, limits
from .errors import ChunksStopped, ConditionFailed
from .lifecycle import Signal
from .messages import WorkMessage
from .ports import Stores
from .records import BatchRecord, ChunkRecord, ChunkRunRecord
from .results import Parts
from .work import Spend, token_count


@dataclass(frozen=True)
class ChunkOutcome:
    """What recording a chunk did: ``counted`` is False for a duplicate or a late chunk;
    ``last`` is True when, after this call, every chunk of the batch is counted."""

    counted: bool
    last: bool
    #: The batch as read after the count (None when it counts on shards and this chunk did not
    #: complete its shard: then its item was not read).
    batch: BatchRecord | None
    #: The chunk's count marker (this call's; the receipt is appended from it) and the digests of
    #: the parts it counted, as written (``Parts.digests``).
    marker: ChunkRecord | None = None
    digests: dict[str, str | None] | None = None


def all_counted(batch: BatchRecord) -> bool:
    """Every chunk of the batch is counted (a batch not yet cut into chunks never is)."""
    return batch.chunk_count > 0 and batch.chunks_done >= batch.chunk_count


#: Chunk markers outlive the batch's window by this much (finalize reads them).
MARKER_RETENTION_SECONDS = 7 * 86_400


class Usage(BaseModel):
    input_tokens: int = 0
    cached_tokens: int = 0
    output_tokens: int = 0
    reasoning_tokens: int = 0

    def add_response(self, usage: dict[str, Any] | None) -> None:
        """Add an engine response's ``usage`` (chat, completions, embeddings or responses shape;
        an audio answer's in seconds adds nothing, and no unknown shape raises: ``token_count``)."""
        if not isinstance(usage, dict):
            return
        self.input_tokens += token_count(usage, "prompt_tokens", "input_tokens")
        self.output_tokens += token_count(usage, "completion_tokens", "output_tokens")
        prompt_details = usage.get("prompt_tokens_details") or usage.get("input_tokens_details")
        completion_details = usage.get("completion_tokens_details") or usage.get("output_tokens_details")
        if isinstance(prompt_details, dict):
            self.cached_tokens += token_count(prompt_details, "cached_tokens")
        if isinstance(completion_details, dict):
            self.reasoning_tokens += token_count(completion_details, "reasoning_tokens")


def record_chunk(
    stores: Stores,
    message: WorkMessage,
    *,
    parts: Parts,
    usage: Usage,
    now: int,
    receipt: bool = True,
    spent: Spend = Spend(),
) -> ChunkOutcome:
    """Count a finished chunk (the attempt that wrote ``parts``) once; if every chunk is now
    counted, resume the workflow; then append the chunk's audit receipt. ``usage`` is the counted
    lines' (the batch's usage); ``spent`` what the engine spent on the chunk in every attempt (its
    budget charge; at least ``usage``). ``receipt=False`` leaves the receipt to the caller
    (``record_receipt``, e.g. after more urgent store calls: the GPU worker runs it behind other
    chunks' commits)."""
    marker = ChunkRecord(
        tenant=message.tenant,
        batch_id=message.batch_id,
        chunk=message.chunk,
        attempt=parts.attempt,
        completed=parts.completed,
        failed=parts.failed,
        recorded_at=now,
        expires_at=message.expires_at + MARKER_RETENTION_SECONDS,
        budget_period=message.budget_period,
        spent_output_tokens=spent.output_tokens,
        spent_input_tokens=spent.input_tokens,
        count_shards=message.shards,
        **usage.model_dump(),
    )
    counted = stores.batches.count_chunk(marker)
    batch = _batch_after_count(stores, message)
    # A duplicate of the last chunk reports last too: its first delivery may have died before
    # signalling, and signalling twice is harmless.
    last = batch is not None and all_counted(batch)
    if batch is not None:
        _complete_if_all_counted(stores, batch)
    outcome = ChunkOutcome(counted=counted, last=last, batch=batch, marker=marker, digests=parts.digests or None)
    if receipt:
        record_receipt(stores, message, outcome)
    return outcome


def _batch_after_count(stores: Stores, message: WorkMessage) -> BatchRecord | None:
    """The batch as counting the chunk left it. On shards: None while the chunk's shard has
    chunks left to count; once it has none, the shard is folded into the batch (once, whoever
    gets there first; a duplicate folds nothing) and the batch is read."""
    if message.shards > 1:
        shard = stores.batches.count_shard(
            message.tenant, message.batch_id, limits.shard_of(message.chunk, message.shards)
        )
        if shard is None or not shard.all_counted:
            return None
        if not shard.folded:
            stores.batches.fold_shard(shard)
    batch = stores.batches.get(message.tenant, message.batch_id)
    if batch is None:
        raise LookupError(f"batch {message.batch_id} of tenant {message.tenant} vanished while counting a chunk")
    return batch


def record_receipt(stores: Stores, message: WorkMessage, outcome: ChunkOutcome) -> None:
    """The chunk's audit receipt, if this attempt counted it: after the count and the signal, so
    a failed append loses neither (docs/audit.md)."""
    if outcome.counted and outcome.marker is not None:
        audit.append_receipt(stores, message, outcome.marker, at=outcome.marker.recorded_at, digests=outcome.digests)


def signal_if_all_counted(stores: Stores, message: WorkMessage) -> bool:
    """A counted chunk delivered again: its first delivery may have died between counting and
    signalling; if every chunk is counted, resume the workflow (signalling twice is harmless)."""
    batch = _batch_after_count(stores, message)
    done = batch is not None and _complete_if_all_counted(stores, batch)
    # Its first delivery may also have died before appending the chunk's audit receipt.
    marker = (
        stores.batches.counted_chunk(message.tenant, message.batch_id, message.chunk, message.shards)
        if stores.audit_log
        else None
    )
    if marker is not None:
        audit.append_receipt(stores, message, marker, at=marker.recorded_at)
    return done


def counted_batch(stores: Stores, batch: BatchRecord) -> BatchRecord:
    """The batch with every fully counted shard folded into it. The worker that counts a shard's
    last chunk folds it; if it died between the two and its message never came back (dead-lettered
    after its count), the workflow's reconciling check and the sweeper fold it here. A batch
    counted on its own item, or counted in full already, is returned as it is (no read)."""
    if batch.count_shards <= 1 or all_counted(batch):
        return batch
    folded = [
        stores.batches.fold_shard(s) for s in stores.batches.count_shards(batch) if s.all_counted and not s.folded
    ]
    return (stores.batches.get(batch.tenant, batch.id) or batch) if any(folded) else batch


def running_chunks(stores: Stores, batch: BatchRecord) -> bool:
    """Some chunk of the batch has an attempt open and is not counted (the drain waits for it):
    one Query of each of its chunk partitions."""
    markers, runs = stores.batches.chunk_states(batch.tenant, batch.id, batch.count_shards)
    return any(run.open and chunk not in markers for chunk, run in runs.items())


def _complete_if_all_counted(stores: Stores, batch: BatchRecord) -> bool:
    """Signal ``complete`` when every chunk is counted and the workflow waits (before it stored
    its token, ``register`` sees the counts and resumes itself)."""
    if not all_counted(batch) or not batch.task_token:
        return False
    return lifecycle.signal(stores.workflows, batch.task_token, Signal.COMPLETE)


# --- the chunk's run record: attempts, poison budget, checkpoints ------------------------------
#: Optimistic writes of a run record retried this often on a concurrent change (two workers on
#: one chunk), then ConditionFailed (a store error: the attempt ends benignly).
RUN_WRITE_ATTEMPTS = 5


@dataclass(frozen=True)
class RunStart:
    """What beginning an attempt found: ``record`` as now stored (this attempt open in it);
    ``died``: earlier attempts found open (real failures, counted now); ``exhausted``: the poison
    budget is spent (the unwritten lines fail with ``chunk_failed``)."""

    record: ChunkRunRecord
    died: int
    exhausted: bool


def _change_run(
    stores: Stores,
    message: WorkMessage,
    current: ChunkRunRecord | None,
    change: Callable[[ChunkRunRecord], ChunkRunRecord],
    *,
    read: bool = False,
    starting: bool = False,
) -> ChunkRunRecord:
    """Apply ``change`` to the run record and store it (optimistic: ``current`` is tried first,
    then the stored record is read again after each concurrent change). ``current`` None is read
    first, unless ``read`` says it was just read (absent). ``starting``: each write only while the
    batch takes new chunks (ChunksStopped otherwise)."""
    for attempt in range(RUN_WRITE_ATTEMPTS):
        if (current is None and not read) or attempt > 0:
            current = stores.batches.chunk_run(message.tenant, message.batch_id, message.chunk, message.shards)
        base = current or ChunkRunRecord(
            tenant=message.tenant,
            batch_id=message.batch_id,
            chunk=message.chunk,
            expires_at=message.expires_at + MARKER_RETENTION_SECONDS,
            count_shards=message.shards,
        )
        new = change(base.model_copy(deep=True)).model_copy(update={"version": base.version + 1})
        try:
            stores.batches.save_chunk_run(new, starting=starting, over=current)
        except ChunksStopped:
            raise
        except ConditionFailed:
            if attempt + 1 >= RUN_WRITE_ATTEMPTS:
                raise
            continue
        return new
    raise AssertionError("unreachable")


def begin_run(
    stores: Stores,
    message: WorkMessage,
    attempt: str,
    *,
    max_strikes: int,
    max_failures: int,
    stored: ChunkRunRecord | None = None,
    read: bool = False,
) -> RunStart | None:
    """Open attempt ``attempt`` of the chunk, only while its batch takes new chunks (None if it
    does not: cancelled, expiring, finished; the chunk is skipped). Every attempt still open from
    before ended without commit and without a benign record: each is one real failure. If one of
    them was sending lines alone (careful mode) that are not written yet: a single line is blamed
    (``engine_crashed``); the lines of a larger group become suspects (each runs alone).
    ``read``: the caller just read the run record (``stored``, None if absent; ``chunk_state``),
    so it is not read again before the write (a concurrent change is, as always)."""
    found: dict[str, Any] = {}

    def change(run: ChunkRunRecord) -> ChunkRunRecord:
        died = [a for a in run.open if a != attempt]
        written = run.written()
        blamed, suspects = list(run.blamed), list(run.suspects)
        if died and run.in_flight is not None and run.in_flight_by in died:
            low, high = run.in_flight, run.in_flight_end or run.in_flight + 1
            pending = [i for i in range(max(low, written), high) if i not in blamed]
            if high - low == 1:
                blamed += pending
            else:
                suspects += [i for i in pending if i not in suspects]
        if died:
            narrowed = len(blamed) > len(run.blamed) or len(suspects) > len(run.suspects)
            run.strikes = 0 if written > run.progress or narrowed else run.strikes + len(died)
            run.failures += len(died)
        if run.in_flight_by in died or run.in_flight_by == attempt:
            run.in_flight = run.in_flight_end = run.in_flight_by = None
        run.open = [a for a in run.open if a not in died and a != attempt] + [attempt]
        run.blamed, run.suspects, run.progress = blamed, suspects, written
        found["died"] = len(died)
        return run

    try:
        record = _change_run(stores, message, stored, change, read=read, starting=True)
    except ChunksStopped:
        return None
    exhausted = record.strikes >= max_strikes or record.failures >= max_failures
    return RunStart(record, found["died"], exhausted)


def _add_spend(run: ChunkRunRecord, spent: Spend) -> None:
    run.spent_input_tokens += spent.input_tokens
    run.spent_output_tokens += spent.output_tokens


def end_run(
    stores: Stores, message: WorkMessage, attempt: str, current: ChunkRunRecord | None = None, spent: Spend = Spend()
) -> ChunkRunRecord:
    """A benign end of attempt ``attempt`` (shutdown, an engine already down, a store error): it
    does not spend the chunk's poison budget. ``spent``: what the engine spent on its lines since
    it last recorded it (they run again: the budget is charged for both runs)."""

    def change(run: ChunkRunRecord) -> ChunkRunRecord:
        _add_spend(run, spent)
        if attempt in run.open:
            run.open = [a for a in run.open if a != attempt]
            run.benign += 1
        if run.in_flight_by == attempt:
            run.in_flight = run.in_flight_end = run.in_flight_by = None
        return run

    return _change_run(stores, message, current, change)


def mark_in_flight(
    stores: Stores, message: WorkMessage, attempt: str, lines: tuple[int, int], current: ChunkRunRecord | None
) -> ChunkRunRecord:
    """Careful mode: request lines [start, end) are about to be sent, alone, to the engine."""

    def change(run: ChunkRunRecord) -> ChunkRunRecord:
        run.in_flight, run.in_flight_end, run.in_flight_by = lines[0], lines[1], attempt
        return run

    return _change_run(stores, message, current, change)


def add_segment(
    stores: Stores,
    message: WorkMessage,
    attempt: str,
    segment: tuple[int, int],
    current: ChunkRunRecord | None,
    outcomes: str | None = None,
    spent: Spend = Spend(),
) -> ChunkRunRecord:
    """Record a checkpoint written (its object exists): its lines are never run again.
    ``outcomes``: one character per line, "1" succeeded, "0" failed (the live progress);
    ``spent``: what the engine spent since the attempt last recorded it."""

    def change(run: ChunkRunRecord) -> ChunkRunRecord:
        _add_spend(run, spent)
        if list(segment) not in run.segments:
            run.segments.append(list(segment))
        if outcomes is not None:
            run.outcomes[f"{segment[0]}-{segment[1]}"] = outcomes
        if run.in_flight_by == attempt and run.in_flight is not None and segment[0] <= run.in_flight < segment[1]:
            run.in_flight = run.in_flight_end = run.in_flight_by = None
        return run

    return _change_run(stores, message, current, change)
