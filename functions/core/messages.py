"""The work message: one per chunk, everything a worker needs without reading the batch first."""

from pydantic import BaseModel, ConfigDict

from . import schema
from .budgets import BudgetCaps
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
    #: the JSON then, so a message without a policy is the same bytes whatever the deployment).
    guard: GuardPolicy | None = None
    #: The tenant's output-token budget period ("day"/"month") as ingest saw its policy: counting
    #: the chunk charges its output tokens to that period's budget item (None: no budget; absent).
    budget_period: str | None = None
    #: The budgets (tokens per ``budget_period``) when the tenant's ``budget_action`` is ``stop``
    #: (None otherwise; absent): once the period's charged tokens reach one, the worker sends no
    #: more of the batch's lines (each becomes a ``budget_exceeded`` error line).
    budget_stop: BudgetCaps | None = None
    #: The most output tokens one line may generate, all its sequences together (the batch's
    #: ``work.Bounds.max_output_tokens``; None: no bound, absent): a line that sets no output limit
    #: of its own is sent with its share of it (``Bounds.output_cap``).
    max_line_output_tokens: int | None = None
    #: The hosts an audio line may be fetched from when the tenant's policy narrowed the
    #: deployment's list (``tenants.media_domains`` as ingest snapshotted it; None: no narrowing,
    #: absent): the worker fetches only from the hosts both this and its own setting list.
    allowed_media_domains: tuple[str, ...] | None = None
    #: How many shards the batch counts its chunks on (``BatchRecord.count_shards``; None: one,
    #: the batch's own item, absent).
    count_shards: int | None = None

    @property
    def shards(self) -> int:
        return self.count_shards or 1

    def bound(self) -> bool:
        """Tenant binding: the input this message names is its own tenant's batch
        input (``schema.batch_input_key(tenant, batch_id)``). Every other read and write of a
        chunk is keyed by ``tenant`` and ``batch_id``; a message failing this (forged, misrouted)
        must read nothing: the worker and the DLQ Lambda refuse it."""
        return schema.parse_batch_input_key(self.input_key) == (self.tenant, self.batch_id)


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
    #: The tenant's policy at validation (``guard.active``), the output bound of one line and the
    #: tenant's narrowed media hosts (audio batches only): every fan-out copies them into the work
    #: messages, so a retried fan-out (ingest DLQ, sweeper) carries the same policy.
    guard: GuardPolicy | None = None
    max_line_output_tokens: int | None = None
    allowed_media_domains: tuple[str, ...] | None = None
