"""An async client of the OpenAI-compatible engine in the same task (vLLM's ``vllm serve``), on
loopback. (The local CPU engine itself, its install and serve scripts, is ``gpu_worker/engine/``:
docs/engine.md.)

- One global cap on requests in flight (a semaphore shared by every chunk), so the engine's
  continuous batching stays full without an unbounded queue in front of it.
- Timeouts and connection errors: retried with exponential backoff and jitter, up to
  ``max_attempts``; then, if the engine's /health still answers, the line gets an error (the
  request itself is the problem); if it does not, ``EngineDown`` is raised (an infrastructure
  failure: the chunk is released, not failed).
- Overload (429, 503): every request pauses (one shared gate, honouring ``Retry-After``) and the
  line is retried, for up to ``overload_max_seconds``; no line fails because of a burst.
- Any other status (2xx, 4xx, 5xx) is the line's result, with the engine's body.
- An answer larger than ``max_response_bytes`` (limits.MAX_ENGINE_RESPONSE_BYTES) is not read
  further: the line gets the error ``response_too_large`` and is not retried (the same request
  would get the same answer). The worker's memory per answer is bounded whatever the engine sends.
"""

from __future__ import annotations

import asyncio
import json
import random
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Literal
from urllib.parse import urlencode

import pydantic_core

from functions.core import limits

from .config import WorkerConfig
from .engine_http import Answer, AnswerTooLarge, EngineConnectionError, EngineHttp

OVERLOAD_STATUSES = frozenset({429, 503})
#: The error codes of a line whose request reached the engine but whose answer was never read.
ENGINE_TIMEOUT, ENGINE_CONNECTION_ERROR, RESPONSE_TOO_LARGE = (
    "engine_timeout",
    "engine_connection_error",
    "response_too_large",
)
UNREAD_ANSWERS = frozenset({ENGINE_TIMEOUT, ENGINE_CONNECTION_ERROR, RESPONSE_TOO_LARGE})
#: The most a health or metrics request may take (seconds; at least the connect timeout).
PROBE_SECONDS = 5.0


def _quoted(value: str) -> str:
    """A multipart parameter value (a field or file name) in quotes: quotes and line breaks
    percent-encoded as browsers do (WHATWG), so a client's field name cannot end the header."""
    return '"' + value.replace('"', "%22").replace("\r", "%0D").replace("\n", "%0A") + '"'


def encode_multipart(fields: list[tuple[str, str]], files: list[tuple[str, str, bytes]]) -> tuple[bytes, str]:
    """A ``multipart/form-data`` body and its Content-Type, built once (a retry resends the same
    bytes): ``fields`` (name, value), ``files`` (field name, file name, bytes). The boundary is
    random, so no value can contain it but by chance (2^-128)."""
    boundary = f"batchapi-{uuid.uuid4().hex}"
    out = bytearray()
    for name, value in fields:
        out += f"--{boundary}\r\nContent-Disposition: form-data; name={_quoted(name)}\r\n\r\n".encode()
        out += value.encode("utf-8") + b"\r\n"
    for name, filename, content in files:
        out += (
            f"--{boundary}\r\nContent-Disposition: form-data; name={_quoted(name)}; "
            f"filename={_quoted(filename)}\r\nContent-Type: application/octet-stream\r\n\r\n"
        ).encode()
        out += content + b"\r\n"
    out += f"--{boundary}--\r\n".encode()
    return bytes(out), f"multipart/form-data; boundary={boundary}"


def decode_answer(raw: bytes) -> Any:
    """An answer's JSON, or its text if it is not JSON. pydantic-core's parser (Rust): an
    embeddings answer's floats parse about eight times faster than with ``json.loads``
    (docs/benchmarks.md, "Worker ceiling"). It is also stricter where ``json.loads`` would hand on
    something no result line can hold: a lone UTF-16 surrogate, or nesting past its depth limit,
    makes the answer text (``json.loads`` gave an unwritable string, or a ``RecursionError``)."""
    try:
        return pydantic_core.from_json(raw)
    except ValueError:
        return raw.decode("utf-8", "replace")


class EngineDown(Exception):
    """The engine does not answer (not even /health): an infrastructure failure, not a line's."""


@dataclass(frozen=True)
class Reply:
    """The outcome of one line's request. ``status`` is None when the engine never answered
    (``error_code``/``error_message`` say why)."""

    status: int | None
    body: Any
    request_id: str
    attempts: int = 1
    error_code: str = ""
    error_message: str = ""

    @property
    def ok(self) -> bool:
        return self.status is not None and 200 <= self.status < 300


@dataclass
class EngineStats:
    """Counters since start (the metrics module reads differences)."""

    requests: int = 0
    answered: dict[int, int] = field(default_factory=dict)  # status -> count
    retries: int = 0
    timeouts: int = 0
    connection_errors: int = 0
    overloaded: int = 0
    overload_wait_seconds: float = 0.0
    too_large: int = 0


@dataclass(frozen=True)
class RetryPolicy:
    max_attempts: int = 4
    backoff_base_seconds: float = 0.5
    backoff_max_seconds: float = 30.0
    overload_max_seconds: float = 900.0

    def delay(self, attempt: int) -> float:
        """Backoff before retry number ``attempt`` (1-based): exponential, capped, jittered."""
        raw = min(self.backoff_max_seconds, self.backoff_base_seconds * 2 ** (attempt - 1))
        return raw * random.uniform(0.5, 1.0)


class EngineClient:
    """Use as ``async with EngineClient(...) as engine``."""

    def __init__(
        self,
        base_url: str,
        *,
        max_in_flight: int,
        request_timeout: float = 600.0,
        connect_timeout: float = 10.0,
        policy: RetryPolicy = RetryPolicy(),
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        clock: Callable[[], float] = time.monotonic,
        max_response_bytes: int = limits.MAX_ENGINE_RESPONSE_BYTES,
    ):
        self.base_url = base_url.rstrip("/")
        self.max_response_bytes = max_response_bytes
        self.max_in_flight = max_in_flight
        self.policy = policy
        self.stats = EngineStats()
        self._request_timeout = request_timeout
        self._connect_timeout = connect_timeout
        self._sleep, self._clock = sleep, clock
        self._slots = asyncio.Semaphore(max_in_flight)
        self._in_flight = 0
        self._waiting = 0
        self._resume_at = 0.0  # the overload gate: no request is sent before this (clock time)
        self._overload_streak = 0
        self._http: EngineHttp | None = None
        #: ``metrics_text`` asks for its samples alone until the engine shows it cannot answer so.
        self._filtered_metrics = True

    @classmethod
    def from_config(cls, config: WorkerConfig) -> EngineClient:
        return cls(
            config.engine_url,
            max_in_flight=config.in_flight_cap(),
            request_timeout=config.request_timeout_seconds,
            connect_timeout=config.connect_timeout_seconds,
            policy=RetryPolicy(
                max_attempts=config.max_attempts,
                backoff_base_seconds=config.backoff_base_seconds,
                backoff_max_seconds=config.backoff_max_seconds,
                overload_max_seconds=config.overload_max_seconds,
            ),
        )

    # --- lifecycle ---------------------------------------------------------------------------
    async def __aenter__(self) -> EngineClient:
        # Keep-alive shorter than uvicorn's (5 s) so a pooled connection is not reused just as the
        # server closes it; a reset that still happens is a connection error and is retried.
        self._http = EngineHttp(self.base_url, connect_timeout=self._connect_timeout, keepalive_seconds=3.0)
        return self

    async def __aexit__(self, *_: Any) -> None:
        if self._http is not None:
            self._http.close()
            self._http = None

    @property
    def http(self) -> EngineHttp:
        if self._http is None:
            raise RuntimeError("EngineClient used outside `async with`")
        return self._http

    @property
    def in_flight(self) -> int:
        return self._in_flight

    @property
    def waiting(self) -> int:
        """Requests waiting for a slot under the cap."""
        return self._waiting

    # --- health and discovery ----------------------------------------------------------------
    async def healthy(self) -> bool:
        """vLLM's ``GET /health`` is 200; an engine without /health counts if ``/v1/models`` is 200."""
        try:
            status = (await self._probe("/health")).status
            if status == 404:
                status = (await self._probe("/v1/models")).status
        except (EngineConnectionError, AnswerTooLarge, TimeoutError):
            return False
        return status == 200

    async def wait_healthy(self, timeout: float, interval: float = 1.0) -> float:
        """Wait until the engine is healthy; returns the seconds waited (EngineDown on timeout)."""
        start = self._clock()
        while not await self.healthy():
            if self._clock() - start >= timeout:
                raise EngineDown(f"the engine at {self.base_url} was not healthy within {timeout:.0f} s")
            await self._sleep(interval)
        return self._clock() - start

    async def metrics_text(self, samples: tuple[str, ...] = ()) -> str | None:
        """The engine's Prometheus text (``capacity.CapacityWatch``), None if it does not answer 200.

        With ``samples``: only those samples, through prometheus_client's ``name[]`` filter of the
        exposition app vLLM mounts under ``/metrics/`` (its plain ``GET /metrics`` renders every
        metric: 57 KB and 6.5 ms of a chat engine's API server CPU, against 0.8 KB and 0.5 ms for
        the four gauges). An engine whose ``/metrics/`` does not answer them (another server, a
        vLLM without that mount: a 404 or a redirect, or a text without them) is read whole from
        then on."""
        if samples and self._filtered_metrics:
            text = await self._metrics_at("/metrics/?" + urlencode([("name[]", name) for name in samples]))
            if text is None:
                return None  # no answer: the same question next time
            if text is not False and any(name in text for name in samples):
                return text
            self._filtered_metrics = False
        text = await self._metrics_at("/metrics")
        return text if isinstance(text, str) else None

    async def _metrics_at(self, path: str) -> str | Literal[False] | None:
        """The 200 answer's text at ``path``; None without an answer; False for another status."""
        try:
            answer = await self._probe(path)
        except (EngineConnectionError, AnswerTooLarge, TimeoutError):
            return None
        return answer.body.decode("utf-8", "replace") if answer.status == 200 else False

    async def _probe(self, path: str) -> Answer:
        timeout = max(PROBE_SECONDS, self._connect_timeout)
        return await self.http.request("GET", path, timeout=timeout, limit=self.max_response_bytes)

    # --- requests ----------------------------------------------------------------------------
    async def post(self, path: str, body: dict[str, Any]) -> Reply:
        """Send one line's body to ``path`` (e.g. ``/v1/chat/completions``) under the global cap."""
        payload = json.dumps(body, separators=(",", ":")).encode()
        return await self._post_capped(path, payload, "application/json")

    async def post_form(self, path: str, fields: list[tuple[str, str]], files: list[tuple[str, str, bytes]]) -> Reply:
        """Send one line as ``multipart/form-data`` (the audio endpoints: ``files`` the audio,
        ``fields`` the other body fields) to ``path``, with the same cap, retries, overload gate
        and bounded read as ``post``."""
        payload, content_type = encode_multipart(fields, files)
        return await self._post_capped(path, payload, content_type)

    async def _post_capped(self, path: str, payload: bytes, content_type: str) -> Reply:
        self._waiting += 1
        try:
            await self._slots.acquire()
        finally:
            self._waiting -= 1
        self._in_flight += 1
        try:
            return await self._post_with_retries(path, payload, content_type)
        finally:
            self._in_flight -= 1
            self._slots.release()

    async def _post_with_retries(self, path: str, payload: bytes, content_type: str) -> Reply:
        attempts = 0
        failures = 0  # timeouts + connection errors
        overloaded_since: float | None = None
        while True:
            await self._wait_gate()
            attempts += 1
            request_id = f"req_{uuid.uuid4().hex}"
            self.stats.requests += 1
            try:
                status, body, headers = await self._send(path, payload, request_id, content_type)
            except TimeoutError:
                self.stats.timeouts += 1
                failures += 1
                problem = (ENGINE_TIMEOUT, f"The engine did not answer within {self._request_timeout:.0f} s")
            except AnswerTooLarge as exc:
                self.stats.answered[exc.status] = self.stats.answered.get(exc.status, 0) + 1
                self.stats.too_large += 1
                return Reply(
                    None,
                    None,
                    request_id,
                    attempts,
                    RESPONSE_TOO_LARGE,
                    (
                        f"The engine answered with status {exc.status} and a body larger than {exc.limit} bytes, "
                        "the most this deployment reads of one answer; the request was not retried."
                    ),
                )
            except EngineConnectionError:
                self.stats.connection_errors += 1
                failures += 1
                problem = (ENGINE_CONNECTION_ERROR, "The connection to the engine failed: EngineConnectionError")
            else:
                self.stats.answered[status] = self.stats.answered.get(status, 0) + 1
                request_id = headers.get("x-request-id") or request_id
                if status not in OVERLOAD_STATUSES:
                    self._overload_streak = 0
                    return Reply(status, body, request_id, attempts)
                self.stats.overloaded += 1
                now = self._clock()
                overloaded_since = now if overloaded_since is None else overloaded_since
                if now - overloaded_since >= self.policy.overload_max_seconds:
                    return Reply(status, body, request_id, attempts)
                self._close_gate(headers.get("retry-after"))
                self.stats.retries += 1
                continue
            if failures >= self.policy.max_attempts:
                if not await self.healthy():
                    raise EngineDown(f"{problem[1]} and /health does not answer")
                code, message = problem
                return Reply(None, None, request_id, attempts, code, f"{message} ({attempts} attempts).")
            self.stats.retries += 1
            await self._sleep(self.policy.delay(failures))

    async def _send(self, path: str, payload: bytes, request_id: str, content_type: str) -> tuple[int, Any, Any]:
        """One request: its status, its decoded body and its headers (lowercase names). The answer is
        read up to ``max_response_bytes`` (``AnswerTooLarge`` past it: the connection is closed,
        not reused)."""
        answer = await self.http.request(
            "POST",
            path,
            body=payload,
            headers={"Content-Type": content_type, "X-Request-Id": request_id},
            timeout=self._request_timeout,
            limit=self.max_response_bytes,
        )
        return answer.status, decode_answer(answer.body), answer.headers

    # --- the overload gate -------------------------------------------------------------------
    def _close_gate(self, retry_after: str | None) -> None:
        """Pause every request: for Retry-After seconds if the engine said so, else exponentially
        longer for each overload answer in a row (reset by any other answer)."""
        self._overload_streak += 1
        delay: float | None = None
        if retry_after:
            try:
                delay = min(float(retry_after), self.policy.backoff_max_seconds)
            except ValueError:
                delay = None
        if delay is None:
            delay = self.policy.delay(min(self._overload_streak, 32))
        self._resume_at = max(self._resume_at, self._clock() + delay)

    async def _wait_gate(self) -> None:
        while (wait := self._resume_at - self._clock()) > 0:
            self.stats.overload_wait_seconds += wait
            await self._sleep(wait)
