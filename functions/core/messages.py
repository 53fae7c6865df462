"""The work message: one per chunk, everything a worker needs without reading the batch first."""

from pydantic import BaseModel, ConfigDict

from .guard import GuardPolicy


class WorkMessage(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    batch_id: str
    tenant: str
    chunk: int
    input_key: str
    byte_start: int
    byte_end: int
    #: Line number (1-based, the file's own) of the line at byte_start.
    first_line: int
    #: Request lines in the range (blank lines are not requests).
    line_count: int
    endpoint: str
    model: str
    expires_at: int
    #: The tenant's prompt and output policy as ingest snapshotted it (None: none; absent from
    #: the JSON then, so a message is what it was before policies existed).
    guard: GuardPolicy | None = None


class Chunk(BaseModel):
    """A chunk of the input as ingest cut it (kept in the batch's chunk manifest)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    chunk: int
    byte_start: int
    byte_end: int
    first_line: int
    line_count: int


class ChunkManifest(BaseModel):
    chunks: list[Chunk]
    #: The tenant's policy at validation (``guard.active``): every fan-out copies it into the work
    #: messages, so a retried fan-out (ingest DLQ, sweeper) carries the same policy.
    guard: GuardPolicy | None = None
