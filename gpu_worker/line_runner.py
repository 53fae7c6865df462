"""One line through the engine, and many lines in input order: the code path shared by the SQS
worker (``chunk``) and the offline ``batchctl run-batch`` (``offline``).

A line becomes exactly one result line: the engine's answer (2xx to the output part, any other
status to the error part, with the engine's status code and body), or an error when the engine
never answered or the line is not a valid request. Results keep input order.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import Any, TypeVar

from functions.core import results
from functions.core.lines import LineError, RawLine, check_request, parse_request
from functions.core.ports import Engine
from functions.core.wire import BatchOutputLine
from functions.core.work import Spend, answered_spend, unread_spend, work_of

from .engine_client import UNREAD_ANSWERS
from .policy_checks import LineChecks

T = TypeVar("T")


@dataclass(frozen=True)
class LineResult:
    line: BatchOutputLine
    #: The engine's ``usage`` of a 2xx answer (None otherwise).
    usage: dict[str, Any] | None = None
    #: What the engine spent on the line in this attempt, whatever became of its answer (a 4xx, a
    #: blocked output, an answer never read): what the tenant's budget is charged.
    spent: Spend = Spend()

    @property
    def succeeded(self) -> bool:
        return results.succeeded(self.line)

    @classmethod
    def written(cls, line: BatchOutputLine) -> LineResult:
        """A result read back from a checkpoint (its usage is in its body, as when it ran)."""
        return cls(line, results.usage_of(line))


async def run_line(
    engine: Engine,
    raw: RawLine,
    *,
    endpoint: str | None,
    endpoints: Iterable[str] = (),
    guard: LineChecks | None = None,
    prepare: Callable[[dict[str, Any]], dict[str, Any]] | None = None,
) -> LineResult:
    """One input line -> one result line. ``endpoint`` is the batch's (every line must use it);
    None (offline mode) accepts a line's own ``url`` if it is one of ``endpoints``. ``guard``: the
    checks of the tenant's prompt and output policy (the work message's snapshot, bound to the
    worker's check processes; None: none): a refused prompt
    never reaches the engine, a redacted one is what is sent, a blocked result is not written.
    ``prepare``: what the body sent becomes after the policy (``shaping.preparer``: the tenant's
    cache salt, the output bound)."""
    custom_id = results.custom_id_of(None, raw)
    try:
        obj = parse_request(raw)
        custom_id = results.custom_id_of(obj, raw)
        url = obj.get("url")
        if endpoint is None:
            if url not in set(endpoints):
                raise LineError("invalid_url", f"The url {url!r} is not one of {sorted(endpoints)}.", "url")
            endpoint = url
        check_request(obj, endpoint=endpoint)
    except LineError as exc:
        return LineResult(results.error_line(custom_id, exc.code, exc.message))
    body, violation = await guard.check_prompt(obj["body"]) if guard is not None else (obj["body"], None)
    if violation is not None:
        return LineResult(results.error_line(custom_id, violation.code, violation.message))
    if prepare is not None:
        body = prepare(body)
    reply = await engine.post(endpoint, body)
    if reply.status is None:
        spent = (
            unread_spend(work_of(endpoint, body), len(raw.text), reply.attempts)
            if reply.error_code in UNREAD_ANSWERS
            else Spend()
        )
        return LineResult(results.error_line(custom_id, reply.error_code, reply.error_message), spent=spent)
    spent = answered_spend(reply.body.get("usage") if isinstance(reply.body, dict) else None)
    line = results.response_line(custom_id, reply.status, reply.body, reply.request_id)
    usage = reply.body.get("usage") if results.succeeded(line) and isinstance(reply.body, dict) else None
    if (
        guard is not None
        and results.succeeded(line)
        and (violation := await guard.check_output(reply.body)) is not None
    ):
        # No usage (an error line), but the engine did the work: it is charged.
        return LineResult(results.error_line(custom_id, violation.code, violation.message), spent=spent)
    return LineResult(line, usage, spent)


async def run_ordered(
    lines: Iterable[RawLine], run: Callable[[RawLine], Awaitable[T]], *, window: int
) -> AsyncIterator[T]:
    """Run ``run`` on each non-blank line, at most ``window`` started ahead of the oldest
    unfinished one, and yield the results in input order (memory bounded by ``window``)."""
    pending: deque[asyncio.Task[T]] = deque()
    try:
        for raw in lines:
            if raw.blank:
                continue
            pending.append(asyncio.ensure_future(run(raw)))
            if len(pending) >= window:
                yield await pending.popleft()
        while pending:
            yield await pending.popleft()
    finally:
        for task in pending:
            task.cancel()
        if pending:
            await asyncio.gather(*pending, return_exceptions=True)
