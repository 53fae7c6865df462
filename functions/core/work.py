"""The work one request line asks of the engine, and the bounds a deployment and a tenant put on it.

A line is one request, but not one unit of engine work: ``n`` completions of each of a list of
prompts are ``n x prompts`` sequences, an embeddings line with 500 inputs is 500, and each sequence
may generate up to the line's output limit. ``Work`` measures that from the body alone (no
tokenizer); ``Bounds`` caps it. Ingest refuses a line over a bound with its line number and
OpenAI's own codes (``integer_above_max_value``, ``array_above_max_length``) before anything runs,
the enqueued-request cap counts sequences, and a token cap can reserve the output a line asks for
(docs/governance.md, "Work a line may ask for").
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from . import limits
from .lines import LineError

#: Bytes of UTF-8 request body per estimated prompt token (docs/governance.md, "Enqueued caps").
BYTES_PER_TOKEN = 4


def estimate_tokens(body_bytes: int) -> int:
    """The prompt-token estimate of one request line: ceil(UTF-8 bytes of the line / 4). No
    tokenizer in the ingest Lambda (no model files, no heavy import on every cold start); the line's
    JSON syntax makes it an overestimate, so a cap errs on the side of fewer tokens, never more."""
    return -(-body_bytes // BYTES_PER_TOKEN)


#: The body fields that cap a line's output tokens per sequence, by endpoint (the first present wins).
OUTPUT_LIMIT_FIELDS: dict[str, tuple[str, ...]] = {
    "/v1/chat/completions": ("max_completion_tokens", "max_tokens"),
    "/v1/completions": ("max_tokens",),
    "/v1/responses": ("max_output_tokens",),
}
#: The body field holding a line's list of inputs (each a sequence of its own), by endpoint.
INPUT_FIELDS: dict[str, str] = {
    "/v1/completions": "prompt",
    "/v1/embeddings": "input",
    "/v1/rerank": "documents",
    "/v1/score": "text_2",
}
#: Endpoints whose lines generate tokens (the others only encode their inputs).
GENERATING = frozenset(OUTPUT_LIMIT_FIELDS)


def _integer(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def count_inputs(value: Any) -> int:
    """How many inputs a prompt/input/documents value holds: a string, or a list of token ids, is
    one; a list of strings or of token-id lists is its length (the engine judges anything else)."""
    if isinstance(value, list) and value and not all(_integer(v) is not None for v in value):
        return len(value)
    return 1


@dataclass(frozen=True)
class Work:
    """What one line asks: ``n`` sequences per input (``best_of`` where larger), ``inputs`` inputs
    (prompts, embedding inputs, documents, pairs), at most ``output_limit`` generated tokens per
    sequence (None: the line sets none; 0: the endpoint generates nothing)."""

    n: int
    inputs: int
    output_limit: int | None
    #: Which body field set ``n`` and the output limit (for the error's ``param``).
    n_field: str = "n"
    output_field: str | None = None

    @property
    def sequences(self) -> int:
        """The engine sequences the line makes: what the enqueued-request cap counts."""
        return self.n * self.inputs

    @property
    def output_tokens(self) -> int | None:
        """The most output tokens the line may generate (None: unbounded by the line)."""
        return None if self.output_limit is None else self.output_limit * self.sequences


def work_of(endpoint: str, body: dict[str, Any]) -> Work:
    """The work a request body asks of the engine at ``endpoint``."""
    n_field, n = "n", max(1, _integer(body.get("n")) or 1)
    best_of = _integer(body.get("best_of"))
    if best_of is not None and best_of > n:
        n_field, n = "best_of", best_of
    field = INPUT_FIELDS.get(endpoint)
    inputs = count_inputs(body.get(field)) if field is not None else 1
    if endpoint == "/v1/score":
        inputs = max(inputs, count_inputs(body.get("text_1")))
    if endpoint not in GENERATING:
        return Work(n=1, inputs=inputs, output_limit=0)
    for name in OUTPUT_LIMIT_FIELDS[endpoint]:
        if (limit := _integer(body.get(name))) is not None:
            return Work(n=n, inputs=inputs, output_limit=max(0, limit), n_field=n_field, output_field=name)
    return Work(n=n, inputs=inputs, output_limit=None, n_field=n_field)


@dataclass(frozen=True)
class Spend:
    """What the engine spent on one line in one attempt: input (prompt) and output tokens."""

    input_tokens: int = 0
    output_tokens: int = 0

    def __add__(self, other: Spend) -> Spend:
        return Spend(self.input_tokens + other.input_tokens, self.output_tokens + other.output_tokens)

    def __sub__(self, other: Spend) -> Spend:
        return Spend(self.input_tokens - other.input_tokens, self.output_tokens - other.output_tokens)


def token_count(usage: dict[str, Any], *names: str) -> int:
    """The first of ``names`` in ``usage`` that is a non-negative number, as an int (0 if none):
    an answer's usage of an unknown shape (a transcription's ``{"type": "duration", "seconds"}``,
    strings, nulls) counts no tokens and never raises."""
    for name in names:
        value = usage.get(name)
        if isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0:
            return int(value)
    return 0


def answered_spend(usage: Any) -> Spend:
    """What an engine answer's ``usage`` says was spent, whatever its status (chat, completions,
    embeddings, responses or an audio answer's tokens shape; nothing without one, or in seconds)."""
    if not isinstance(usage, dict):
        return Spend()
    return Spend(
        token_count(usage, "prompt_tokens", "input_tokens"), token_count(usage, "completion_tokens", "output_tokens")
    )


def unread_spend(work: Work, prompt_bytes: int, attempts: int) -> Spend:
    """What to charge for a line whose answers the worker never read (``attempts`` timed out, lost
    their connection, or answered too much to read): each attempt's prompt (estimated) and the most
    output it may have generated (its limit, else ``limits.UNKNOWN_OUTPUT_TOKENS_PER_SEQUENCE``)."""
    per_sequence = limits.UNKNOWN_OUTPUT_TOKENS_PER_SEQUENCE if work.output_limit is None else work.output_limit
    return Spend(estimate_tokens(prompt_bytes) * attempts, per_sequence * work.sequences * attempts)


class Bounds(BaseModel):
    """The most one line may ask. The deployment's (``Settings.line_bounds``) apply to everyone; a
    tenant's policy may set lower ones (``TenantPolicy.line_bounds``), never higher
    (``tighter``)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    #: ``n`` (or ``best_of``) per line: OpenAI's own maximum by default.
    max_n: int = Field(default=limits.MAX_LINE_N, ge=1)
    #: Inputs per line (a completions prompt list, an embeddings input list, rerank documents,
    #: score pairs): OpenAI's embeddings maximum by default.
    max_inputs: int = Field(default=limits.MAX_LINE_INPUTS, ge=1)
    #: Output tokens per line, all its sequences together (limit x n x prompts); None: the line's
    #: own limit and the model's context bound it. A line that sets no limit of its own is given
    #: one by the worker (``output_cap``), so this bound holds for every line.
    max_output_tokens: int | None = Field(default=None, ge=1)

    def tighter(self, other: PolicyBounds | None) -> Bounds:
        """These bounds with ``other``'s lower values (a tenant's override never loosens them)."""
        if other is None:
            return self
        mine = self.model_dump()
        for name, value in other.model_dump(exclude_none=True).items():
            mine[name] = value if mine[name] is None else min(mine[name], value)
        return Bounds(**mine)

    def output_cap(self, work: Work) -> int | None:
        """The output limit per sequence the worker sets on a line that sets none (None: none)."""
        return output_cap(self.max_output_tokens, work)

    def check(self, work: Work, endpoint: str) -> None:
        """LineError if ``work`` is over a bound (the first one found, OpenAI's codes)."""
        if work.n > self.max_n:
            raise LineError(
                "integer_above_max_value",
                f"Invalid 'body.{work.n_field}': integer above maximum value. Expected a value <= {self.max_n}, "
                f"but got {work.n} instead.",
                f"body.{work.n_field}",
            )
        if work.inputs > self.max_inputs:
            field = INPUT_FIELDS.get(endpoint, "input")
            raise LineError(
                "array_above_max_length",
                f"Invalid 'body.{field}': array too long. Expected an array with maximum length {self.max_inputs}, "
                f"but got an array with length {work.inputs} instead.",
                f"body.{field}",
            )
        if (
            self.max_output_tokens is not None
            and (total := work.output_tokens) is not None
            and total > self.max_output_tokens
        ):
            assert work.output_field is not None
            raise LineError(
                "integer_above_max_value",
                f"Invalid 'body.{work.output_field}': the line asks for up to {work.output_limit} output tokens "
                f"for each of its {work.sequences} sequences ({total} in all); this organization allows at most "
                f"{self.max_output_tokens} output tokens per request.",
                f"body.{work.output_field}",
            )


def output_cap(max_line_output_tokens: int | None, work: Work) -> int | None:
    """A line's share of ``max_line_output_tokens`` per sequence, when it sets no output limit of
    its own (None: it sets one, or there is no bound; what it sets was checked at ingest)."""
    if max_line_output_tokens is None or work.output_limit is not None or not work.sequences:
        return None
    return max(1, max_line_output_tokens // work.sequences)


def with_output_cap(endpoint: str, body: dict[str, Any], max_line_output_tokens: int | None) -> dict[str, Any]:
    """``body`` with its share of the line bound as its output limit, when it sets none (the
    endpoint's first limit field, e.g. ``max_completion_tokens`` for chat); as it is otherwise."""
    fields = OUTPUT_LIMIT_FIELDS.get(endpoint)
    if not fields:
        return body
    cap = output_cap(max_line_output_tokens, work_of(endpoint, body))
    return body if cap is None else {**body, fields[0]: cap}


class PolicyBounds(BaseModel):
    """A tenant's lower bounds (``TenantPolicy.line_bounds``): each None leaves the deployment's."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    max_n: int | None = Field(default=None, ge=1)
    max_inputs: int | None = Field(default=None, ge=1)
    max_output_tokens: int | None = Field(default=None, ge=1)
