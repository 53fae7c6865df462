"""One line through the engine, and many lines in input order: the code path shared by the SQS
worker (``chunk``) and the offline ``batchctl run-batch`` (``offline``).

A line becomes exactly one result line: the engine's answer (2xx to the output part, any other
status to the error part, with the engine's status code and body), or an error when the engine
never answered or the line is not a valid request. Results keep input order.
"""

from __future__ import annotations

import asyncio
import json
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import Any, TypeVar

from functions.core import limits, results
from functions.core.lines import LineError, RawLine, check_request, parse_request
from functions.core.ports import Engine, EngineReply
from functions.core.wire import BatchOutputLine
from functions.core.work import Spend, answered_spend, unread_spend, work_of

from .engine_client import UNREAD_ANSWERS
from .media import DATA_URLS_ONLY, MediaFetchError, MediaPolicy, fetch_audio, filename_of
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
    media: MediaPolicy = DATA_URLS_ONLY,
) -> LineResult:
    """One input line -> one result line. ``endpoint`` is the batch's (every line must use it);
    None (offline mode) accepts a line's own ``url`` if it is one of ``endpoints``. ``guard``: the
    checks of the tenant's prompt and output policy (the work message's snapshot, bound to the
    worker's check processes; None: none): a refused prompt
    never reaches the engine, a redacted one is what is sent, a blocked result is not written.
    ``prepare``: what the body sent becomes after the policy (``shaping.preparer``: the tenant's
    cache salt, the output bound). ``media``: where an audio line's ``file_url`` may be fetched
    from (``send``)."""
    custom_id = results.custom_id_of(None, raw)
    try:
        obj = parse_request(raw)
        custom_id = results.custom_id_of(obj, raw)
        url = obj.get("url")
        if endpoint is None:
            if url not in set(endpoints):
                raise LineError("invalid_url", f"The url {url!r} is not one of {sorted(endpoints)}.", "url")
            endpoint = url
        check_request(obj, endpoint=endpoint, allowed_media_domains=media.allowed_domains)
    except LineError as exc:
        return LineResult(results.error_line(custom_id, exc.code, exc.message))
    body, violation = await guard.check_prompt(obj["body"]) if guard is not None else (obj["body"], None)
    if violation is not None:
        return LineResult(results.error_line(custom_id, violation.code, violation.message))
    if prepare is not None:
        body = prepare(body)
    try:
        reply = await send(engine, endpoint, body, media)
    except MediaFetchError as exc:
        return LineResult(results.error_line(custom_id, exc.code, str(exc)))
    if reply.status is None:
        spent = (
            unread_spend(work_of(endpoint, body), len(raw.text), reply.attempts)
            if reply.error_code in UNREAD_ANSWERS
            else Spend()
        )
        return LineResult(results.error_line(custom_id, reply.error_code, reply.error_message), spent=spent)
    answer = reply.body
    if endpoint in limits.AUDIO_ENDPOINTS and isinstance(answer, str) and 200 <= reply.status < 300:
        answer = {"text": answer}  # a text/srt/vtt answer (text/plain), as OpenAI's SDK wraps it
    spent = answered_spend(answer.get("usage") if isinstance(answer, dict) else None)
    line = results.response_line(custom_id, reply.status, answer, reply.request_id)
    usage = answer.get("usage") if results.succeeded(line) and isinstance(answer, dict) else None
    if usage is not None and not isinstance(usage, dict):
        usage = None
    if guard is not None and results.succeeded(line) and (violation := await guard.check_output(answer)) is not None:
        # No usage (an error line), but the engine did the work: it is charged.
        return LineResult(results.error_line(custom_id, violation.code, violation.message), spent=spent)
    return LineResult(line, usage, spent)


async def send(engine: Engine, endpoint: str, body: dict[str, Any], media: MediaPolicy) -> EngineReply:
    """A line's body to the engine: as JSON; an audio line's as ``multipart/form-data`` (its
    ``file_url`` fetched in a thread first, ``media.py``; ``MediaFetchError`` if it cannot be)."""
    if endpoint not in limits.AUDIO_ENDPOINTS:
        return await engine.post(endpoint, body)
    url = body["file_url"]
    audio = await asyncio.to_thread(
        fetch_audio,
        url,
        allowed_domains=media.allowed_domains,
        max_bytes=media.max_bytes,
        timeout=media.timeout,
        resolver=media.resolver,
    )
    return await engine.post_form(endpoint, audio_fields(body), [("file", filename_of(url), audio)])


def audio_fields(body: dict[str, Any]) -> list[tuple[str, str]]:
    """An audio body's fields but ``file_url`` as form fields, as vLLM's server parses them: a
    list as repeated ``name[]`` fields (its ``timestamp_granularities[]``), booleans as
    ``true``/``false``, numbers and objects as JSON, nulls left out."""
    fields: list[tuple[str, str]] = []
    for name, value in body.items():
        if name == "file_url" or value is None:
            continue
        if isinstance(value, list):
            listed = name if name.endswith("[]") else f"{name}[]"
            fields.extend((listed, _form_value(item)) for item in value)
        else:
            fields.append((name, _form_value(value)))
    return fields


def _form_value(value: Any) -> str:
    if isinstance(value, str):
        return value
    return json.dumps(value, separators=(",", ":"))


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
