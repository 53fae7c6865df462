"""The work message: one per chunk, everything a worker needs without reading the batch first."""

from pydantic import BaseModel, ConfigDict


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
