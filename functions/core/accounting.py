"""Chunk accounting, shared by the GPU worker and the DLQ handler: a chunk is counted exactly once,
only while its batch accepts chunks, and whoever counts the last one signals the workflow."""

from typing import Any

from pydantic import BaseModel

from .errors import ConditionFailed
from .messages import WorkMessage
from .records import BatchRecord, ChunkRecord
from .results import Parts
from .stores import ChunkOutcome, Stores

#: Chunk markers outlive the batch's window by this much (finalize reads them).
MARKER_RETENTION_SECONDS = 7 * 86_400


class Usage(BaseModel):
    input_tokens: int = 0
    cached_tokens: int = 0
    output_tokens: int = 0
    reasoning_tokens: int = 0

    def add_response(self, usage: dict[str, Any] | None) -> None:
        """Add an engine response's ``usage`` (chat, completions or embeddings shape)."""
        if not usage:
            return
        self.input_tokens += int(usage.get("prompt_tokens") or usage.get("input_tokens") or 0)
        self.output_tokens += int(usage.get("completion_tokens") or usage.get("output_tokens") or 0)
        prompt_details = usage.get("prompt_tokens_details") or usage.get("input_tokens_details") or {}
        completion_details = usage.get("completion_tokens_details") or usage.get("output_tokens_details") or {}
        self.cached_tokens += int(prompt_details.get("cached_tokens") or 0)
        self.reasoning_tokens += int(completion_details.get("reasoning_tokens") or 0)


def start_chunk(stores: Stores, message: WorkMessage) -> BatchRecord | None:
    """Note that a worker started this chunk; None if the batch no longer takes new work
    (cancelled, expiring, finished), in which case the chunk is skipped."""
    batch = stores.batches.get(message.tenant, message.batch_id)
    if batch is None:
        return None
    try:
        return stores.batches.update(
            batch, add={"started_chunks": {message.chunk}}, expect={"status": "in_progress", "accepting": True}
        )
    except ConditionFailed:
        return None


def record_chunk(stores: Stores, message: WorkMessage, *, parts: Parts, usage: Usage, now: int) -> ChunkOutcome:
    """Count a finished chunk (the attempt that wrote ``parts``) once; if every chunk is now
    counted, resume the workflow."""
    marker = ChunkRecord(
        tenant=message.tenant,
        batch_id=message.batch_id,
        chunk=message.chunk,
        attempt=parts.attempt,
        completed=parts.completed,
        failed=parts.failed,
        recorded_at=now,
        expires_at=message.expires_at + MARKER_RETENTION_SECONDS,
        **usage.model_dump(),
    )
    outcome = stores.batches.record_chunk(marker)
    if outcome.last and outcome.batch.task_token:
        stores.workflows.signal(outcome.batch.task_token, {"outcome": "complete"})
    return outcome
