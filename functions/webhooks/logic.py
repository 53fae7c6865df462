"""Fan-out and delivery (docs/webhooks.md). Logic only: the table, the queues, the HTTP POST and
the clock come in as arguments.

One queue carries two kinds of message: the batch lifecycle events EventBridge routes to it (an
EventBridge envelope: ``detail-type``, ``detail``), which ``fan_out`` turns into one delivery
message per subscribed endpoint, after reading the batch back from the table (only a batch that
exists under the event's tenant and is in the event's terminal status is fanned out: a forged or
stale event is dropped); and those delivery messages (``Delivery``), each one attempt.

A delivery message names its attempt and the time it is ``due``. A message received before it is
due goes back, invisible until then (SQS ChangeMessageVisibility): that is not an attempt. A failed
attempt sends the next attempt's message (due after the next delay of ``SCHEDULE_SECONDS``); the
last one's message goes to the dead-letter queue. So only a POST that was made counts as an
attempt: a message that could not be handled (a crash, a throttled read, an invocation out of
time) comes back after the queue's visibility with the same attempt number.

``deliver_all`` runs the attempts of one invocation at once, each bounded by its own deadline
(``POST_DEADLINE_SECONDS`` for the whole exchange: the HTTP port enforces it), so a slow receiver
never spends another delivery's attempt or time.
"""

from __future__ import annotations

import hashlib
import ipaddress
import json
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Final, Literal, Protocol, cast
from urllib.parse import urlsplit

from pydantic import BaseModel

from functions.core.lifecycle import event_type as status_event_type
from functions.core.names import EVENT_SOURCE
from functions.core.records import TENANT_PATTERN, BatchRecord

from .signing import headers
from .store import AttemptRecord, EndpointRecord, WebhookRepo

#: The batch events a webhook endpoint may subscribe to (OpenAI's batch webhook event types).
EVENT_TYPES: Final = ("batch.completed", "batch.failed", "batch.expired", "batch.cancelled")
#: Delay before attempt i+1 (Standard Webhooks' suggested schedule): at once, 5 s, 5 min, 30 min,
#: 2 h, 5 h, 10 h, 10 h: 8 attempts over 27 h 35 min 5 s.
SCHEDULE_SECONDS: Final = (0, 5, 5 * 60, 30 * 60, 2 * 3600, 5 * 3600, 10 * 3600, 10 * 3600)
ATTEMPTS: Final = len(SCHEDULE_SECONDS)
#: One attempt's whole exchange (name lookup, connect, TLS, the request, the answer's status line,
#: headers and the first bytes of its body: ``http.RESPONSE_READ_BYTES``) ends within this, however
#: the receiver paces its bytes; past it the attempt has failed.
POST_DEADLINE_SECONDS: Final = 10
#: The EMF metric (namespace ``names.METRICS_NAMESPACE``) counting events the fan-out dropped: a
#: forged or stale event (an alarm: infra/constructs/monitoring.py).
DROPPED_METRIC: Final = "WebhookEventsDropped"
#: A delivery message is one of these; anything else on the queue is an EventBridge event.
DELIVERY_KIND: Final = "webhook.delivery"

#: The queue's visibility: six times the function's timeout (AWS's guidance for SQS event
#: sources); a message whose handling failed comes back after it.
FUNCTION_TIMEOUT_SECONDS: Final = 60
QUEUE_VISIBILITY_SECONDS: Final = 6 * FUNCTION_TIMEOUT_SECONDS
#: Messages per invocation (SQS's most without a batching window). Their attempts run at once,
#: so an invocation lasts about one deadline, whatever its receivers do.
BATCH_SIZE: Final = 10
#: An attempt starts only while the invocation has this long left (its deadline, then the log
#: write and the next message); otherwise its message goes back at once, not attempted.
ATTEMPT_RESERVE_SECONDS: Final = POST_DEADLINE_SECONDS + 10
#: SQS's longest visibility timeout: a message not yet due waits at most this long per receive.
MAX_VISIBILITY_SECONDS: Final = 12 * 3600
#: Receives of one message before SQS moves it to the dead-letter queue. Not the attempts (each
#: attempt is a message of its own, received once or twice: early, then when due): a message that
#: could not be handled this many times (6 min apart) is poison.
MAX_RECEIVES: Final = 20


def event_pattern() -> dict[str, Any]:
    """The EventBridge rule that routes batch events to the webhook queue."""
    return {"source": [EVENT_SOURCE], "detail-type": list(EVENT_TYPES)}


_LOOPBACK_HOSTS: Final = frozenset({"localhost"})


class Sender(Protocol):
    def send(self, bodies: list[str]) -> None: ...


class BatchReader(Protocol):
    """The one read of the batches the fan-out makes (GetItem by tenant and id)."""

    def get(self, tenant: str, batch_id: str) -> BatchRecord | None: ...


#: POST ``body`` with ``headers`` to ``url`` within ``deadline`` seconds for the whole exchange;
#: returns the HTTP status (raises when there is none in time: refused, reset, TLS, the deadline).
Post = Callable[[str, bytes, dict[str, str], float], int]


def url_problem(url: str, *, allow_loopback_http: bool) -> str | None:
    """Why ``url`` may not receive webhooks (None: it may). HTTPS only; plain http only to a
    loopback host and only where allowed (the local deployment)."""
    parts = urlsplit(url)
    if not parts.hostname:
        return "the URL has no host"
    if parts.scheme == "https":
        return None
    if parts.scheme != "http":
        return "the URL must be https://"
    if not allow_loopback_http:
        return "the URL must be https:// (plain http is allowed only to loopback, in the local deployment)"
    host = parts.hostname
    try:
        loopback = ipaddress.ip_address(host).is_loopback
    except ValueError:
        loopback = host in _LOOPBACK_HOSTS
    return None if loopback else "plain http is allowed only to a loopback host (127.0.0.1, ::1, localhost)"


def event_id(batch_id: str, event_type: str) -> str:
    """Deterministic: a re-published status (publishing is at least once) is the same event."""
    return "evt_" + hashlib.sha256(f"{batch_id}.{event_type}".encode()).hexdigest()[:32]


def webhook_id(evt_id: str, endpoint_id: str) -> str:
    """The ``webhook-id`` of an event's message to one endpoint: the same on every attempt and on
    a duplicated fan-out, so receivers can dedupe (Standard Webhooks)."""
    return "wh_" + hashlib.sha256(f"{evt_id}.{endpoint_id}".encode()).hexdigest()[:32]


def payload(event_type: str, batch_id: str, created_at: int) -> str:
    """The body OpenAI sends for a batch event (``BatchCompletedWebhookEvent`` and siblings)."""
    return json.dumps(
        {
            "id": event_id(batch_id, event_type),
            "object": "event",
            "created_at": created_at,
            "type": event_type,
            "data": {"id": batch_id},
        },
        separators=(",", ":"),
    )


class Delivery(BaseModel):
    """A delivery message: one attempt (``attempt``, 1-based) of one event to one endpoint, not
    before ``due`` (unix seconds). ``body`` and ``webhook_id`` are the same on every attempt."""

    kind: Literal["webhook.delivery"] = DELIVERY_KIND
    tenant: str
    endpoint_id: str
    webhook_id: str
    event_id: str
    event_type: str
    body: str
    attempt: int = 1
    due: int = 0

    def wait_seconds(self, now: int) -> int:
        """How long until it is due (0: now), at most one visibility timeout's worth."""
        return min(max(0, self.due - now), MAX_VISIBILITY_SECONDS)

    def next_attempt(self, now: int) -> Delivery:
        return self.model_copy(update={"attempt": self.attempt + 1, "due": now + SCHEDULE_SECONDS[self.attempt]})


def is_delivery(message: dict[str, Any]) -> bool:
    return message.get("kind") == DELIVERY_KIND


@dataclass(frozen=True)
class FanOut:
    """What an event became: the webhook ids of its deliveries, or why it was ``dropped``."""

    webhook_ids: list[str]
    dropped: str | None = None


def _terminal_time(batch: BatchRecord, now: int) -> int:
    """When the batch reached its terminal status (``completed_at`` ...): the event's
    ``created_at``, as OpenAI's (the time the batch completed, failed, expired or was cancelled)."""
    at = getattr(batch, f"{batch.status}_at", None)
    return int(at) if at is not None else now


def verified_batch(batches: BatchReader, event: dict[str, Any]) -> tuple[BatchRecord | None, str | None]:
    """The batch an event is about, read back from the table, if the event is true: it names a
    batch that exists under the event's tenant and is in the event's terminal status (terminal
    statuses are final, so a true event stays true). Else None and why it is dropped."""
    event_type, detail = event.get("detail-type"), event.get("detail")
    if event.get("source") != EVENT_SOURCE or event_type not in EVENT_TYPES:
        return None, f"not a terminal batch event (source {event.get('source')!r}, type {event_type!r})"
    tenant = detail.get("tenant") if isinstance(detail, dict) else None
    batch_id = detail.get("id") if isinstance(detail, dict) else None
    if not (isinstance(tenant, str) and TENANT_PATTERN.fullmatch(tenant) and isinstance(batch_id, str) and batch_id):
        return None, "the event names no valid tenant and batch id"
    batch = batches.get(tenant, batch_id)
    if batch is None:
        return None, "the tenant has no such batch"
    if status_event_type(batch.status) != event_type:
        return None, f"the batch is {batch.status}, not {event_type.removeprefix('batch.')}"
    return batch, None


def fan_out(repo: WebhookRepo, batches: BatchReader, queue: Sender, event: dict[str, Any], *, now: int) -> FanOut:
    """Enqueue one delivery per endpoint of the batch's tenant subscribed to the event, if the
    event is true (``verified_batch``). The body is built from the stored batch only, so a
    duplicated or re-published event makes the same messages."""
    batch, dropped = verified_batch(batches, event)
    if batch is None:
        return FanOut([], dropped)
    event_type = status_event_type(batch.status)
    body = payload(event_type, batch.id, _terminal_time(batch, now))
    evt = event_id(batch.id, event_type)
    messages = [
        Delivery(
            tenant=batch.tenant,
            endpoint_id=e.id,
            webhook_id=webhook_id(evt, e.id),
            event_id=evt,
            event_type=event_type,
            body=body,
        )
        for e in repo.list(batch.tenant)
        if event_type in e.events
    ]
    if messages:
        queue.send([m.model_dump_json() for m in messages])
    return FanOut([m.webhook_id for m in messages])


@dataclass(frozen=True)
class Outcome:
    """What became of one attempt: ``retry`` is the next attempt's message when there is one to
    send; ``give_up`` when the schedule is spent (the message goes to the dead-letter queue)."""

    attempt: AttemptRecord
    retry: Delivery | None = None
    give_up: bool = False


@dataclass(frozen=True)
class _Ready:
    """An attempt ready to POST: where, what, signed for ``now``."""

    url: str
    body: bytes
    headers: dict[str, str]


def _log(repo: WebhookRepo, message: Delivery, now: int, **fields: Any) -> AttemptRecord:
    record = AttemptRecord(
        **message.model_dump(include={"tenant", "endpoint_id", "webhook_id", "event_id", "event_type"}),
        attempt=message.attempt,
        at=now,
        **fields,
    )
    repo.log(record)
    return record


def _prepare(repo: WebhookRepo, message: Delivery, *, now: int, allow_loopback_http: bool) -> _Ready | Outcome:
    """The endpoint, read again for this attempt (a rotation applies, a deletion drops it)."""
    endpoint: EndpointRecord | None = repo.get(message.tenant, message.endpoint_id)
    if endpoint is None:
        return Outcome(_log(repo, message, now, outcome="dropped", error="the endpoint was deleted"))
    problem = url_problem(endpoint.url, allow_loopback_http=allow_loopback_http)
    if problem:
        return Outcome(_log(repo, message, now, outcome="dropped", error=problem))
    signed = headers(endpoint.signing_secrets(now), message.webhook_id, now, message.body)
    return _Ready(endpoint.url, message.body.encode(), signed)


def _post(post: Post, ready: _Ready) -> tuple[int | None, str | None]:
    try:
        return post(ready.url, ready.body, ready.headers, POST_DEADLINE_SECONDS), None
    except Exception as exc:  # noqa: BLE001 - no answer in time: refused, reset, TLS, the deadline
        return None, f"{type(exc).__name__}: {exc}"[:500]


def _conclude(repo: WebhookRepo, message: Delivery, status: int | None, error: str | None, *, now: int) -> Outcome:
    """Log the attempt; the next attempt's message, or the end of the schedule."""
    if status is not None and 200 <= status < 300:
        return Outcome(_log(repo, message, now, outcome="delivered", status_code=status))
    if status is not None:
        error = f"HTTP {status}"
    if message.attempt >= ATTEMPTS:
        return Outcome(_log(repo, message, now, outcome="failed", status_code=status, error=error), give_up=True)
    retry = message.next_attempt(now)
    return Outcome(
        _log(repo, message, now, outcome="retry", status_code=status, error=error, next_at=retry.due), retry=retry
    )


def deliver(repo: WebhookRepo, message: Delivery, *, post: Post, now: int, allow_loopback_http: bool) -> Outcome:
    """Attempt ``message`` once (its ``attempt``); every attempt is logged in the table."""
    ready = _prepare(repo, message, now=now, allow_loopback_http=allow_loopback_http)
    if isinstance(ready, Outcome):
        return ready
    status, error = _post(post, ready)
    return _conclude(repo, message, status, error, now=now)


def deliver_all(
    repo: WebhookRepo,
    messages: list[Delivery],
    *,
    post: Post,
    now: int,
    allow_loopback_http: bool,
) -> list[Outcome | Exception]:
    """``deliver`` each message, their POSTs at once (one thread each), so every attempt has its
    whole deadline whatever the others' receivers do. Per message, in order: its outcome, or the
    exception that kept it from being attempted or logged (its message comes back, same attempt)."""
    results: list[Outcome | Exception | _Ready] = []
    for message in messages:
        try:
            results.append(_prepare(repo, message, now=now, allow_loopback_http=allow_loopback_http))
        except Exception as exc:  # noqa: BLE001 - e.g. the endpoint read throttled: not attempted
            results.append(exc)
    ready = [(i, r) for i, r in enumerate(results) if isinstance(r, _Ready)]
    if ready:
        with ThreadPoolExecutor(max_workers=len(ready), thread_name_prefix="webhook-post") as pool:
            answers = list(pool.map(lambda item: _post(post, item[1]), ready))
        for (i, _), (status, error) in zip(ready, answers, strict=True):
            try:
                results[i] = _conclude(repo, messages[i], status, error, now=now)
            except Exception as exc:  # noqa: BLE001 - the log write failed: the message comes back, the attempt is made again
                results[i] = exc
    return cast(list[Outcome | Exception], results)  # each _Ready is its outcome now
