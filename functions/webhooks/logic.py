"""Fan-out and delivery (docs/webhooks.md). Logic only: the table, the queue, the HTTP POST and
the clock come in as arguments.

One queue carries two kinds of message: the batch lifecycle events EventBridge routes to it (an
EventBridge envelope: ``detail-type``, ``detail``), which ``fan_out`` turns into one delivery
message per subscribed endpoint; and those delivery messages, each attempted by ``deliver``. A
failed attempt leaves its message on the queue, invisible until the next attempt of
``SCHEDULE_SECONDS`` (SQS ChangeMessageVisibility, at most 12 h); the attempt number is the
message's receive count. After ``ATTEMPTS`` attempts the message goes to the dead-letter queue.
"""

from __future__ import annotations

import hashlib
import ipaddress
import json
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Final, Protocol
from urllib.parse import urlsplit

from functions.core.names import EVENT_SOURCE

from .signing import headers
from .store import AttemptRecord, WebhookRepo

#: The batch events a webhook endpoint may subscribe to (OpenAI's batch webhook event types).
EVENT_TYPES: Final = ("batch.completed", "batch.failed", "batch.expired", "batch.cancelled")
#: Delay before attempt i+1 (Standard Webhooks' suggested schedule): at once, 5 s, 5 min, 30 min,
#: 2 h, 5 h, 10 h, 10 h: 8 attempts over 27 h 35 min 5 s.
SCHEDULE_SECONDS: Final = (0, 5, 5 * 60, 30 * 60, 2 * 3600, 5 * 3600, 10 * 3600, 10 * 3600)
ATTEMPTS: Final = len(SCHEDULE_SECONDS)
#: One attempt waits this long for the receiver's answer (then it counts as failed).
POST_TIMEOUT_SECONDS: Final = 10
#: A delivery message is one of these; anything else on the queue is an EventBridge event.
DELIVERY_KIND: Final = "webhook.delivery"

#: The queue's visibility: six times the function's timeout (AWS's guidance for SQS event
#: sources); a handler crash retries after it.
FUNCTION_TIMEOUT_SECONDS: Final = 60
QUEUE_VISIBILITY_SECONDS: Final = 6 * FUNCTION_TIMEOUT_SECONDS
#: Messages per invocation: at most 5 x POST_TIMEOUT_SECONDS of waiting, within the timeout.
BATCH_SIZE: Final = 5


def event_pattern() -> dict[str, Any]:
    """The EventBridge rule that routes batch events to the webhook queue."""
    return {"source": [EVENT_SOURCE], "detail-type": list(EVENT_TYPES)}


_LOOPBACK_HOSTS: Final = frozenset({"localhost"})


class Sender(Protocol):
    def send(self, bodies: list[str]) -> None: ...


#: POST ``body`` with ``headers`` to ``url``; returns the HTTP status (raises on no answer).
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


def _unix(time_text: str | None, default: int) -> int:
    if not time_text:
        return default
    return int(datetime.fromisoformat(time_text.replace("Z", "+00:00")).timestamp())


def payload(event_type: str, batch_id: str, created_at: int) -> str:
    """The body OpenAI sends for a batch event (``BatchCompletedWebhookEvent`` and siblings)."""
    return json.dumps({
        "id": event_id(batch_id, event_type), "object": "event", "created_at": created_at,
        "type": event_type, "data": {"id": batch_id},
    }, separators=(",", ":"))


def is_delivery(message: dict[str, Any]) -> bool:
    return message.get("kind") == DELIVERY_KIND


def fan_out(repo: WebhookRepo, queue: Sender, event: dict[str, Any], *, now: int) -> list[str]:
    """Enqueue one delivery per endpoint of the batch's tenant subscribed to the event; returns
    their webhook ids (none for an event type no one may subscribe to)."""
    event_type, detail = event.get("detail-type"), event.get("detail") or {}
    if event_type not in EVENT_TYPES:
        return []
    tenant, batch_id = detail["tenant"], detail["id"]
    body = payload(event_type, batch_id, _unix(event.get("time"), now))
    evt = event_id(batch_id, event_type)
    messages = [
        {"kind": DELIVERY_KIND, "tenant": tenant, "endpoint_id": e.id, "webhook_id": webhook_id(evt, e.id),
         "event_id": evt, "event_type": event_type, "body": body}
        for e in repo.list(tenant) if event_type in e.events
    ]
    if messages:
        queue.send([json.dumps(m) for m in messages])
    return [m["webhook_id"] for m in messages]


@dataclass(frozen=True)
class Outcome:
    """What became of one attempt: ``retry_in`` is set when the message must come back later;
    ``give_up`` when the schedule is spent (to the dead-letter queue)."""

    attempt: AttemptRecord
    retry_in: int | None = None
    give_up: bool = False


def deliver(
    repo: WebhookRepo, message: dict[str, Any], *, attempt: int, post: Post, now: int, allow_loopback_http: bool,
) -> Outcome:
    """Attempt number ``attempt`` (1-based: the message's receive count) of one delivery message;
    every attempt is logged in the table."""
    tenant, endpoint_id = message["tenant"], message["endpoint_id"]
    base = {k: message[k] for k in ("tenant", "endpoint_id", "webhook_id", "event_id", "event_type")}

    def log(**fields: Any) -> AttemptRecord:
        record = AttemptRecord(**base, attempt=attempt, at=now, **fields)
        repo.log(record)
        return record

    endpoint = repo.get(tenant, endpoint_id)
    if endpoint is None:
        return Outcome(log(outcome="dropped", error="the endpoint was deleted"))
    problem = url_problem(endpoint.url, allow_loopback_http=allow_loopback_http)
    if problem:
        return Outcome(log(outcome="dropped", error=problem))
    body = message["body"]
    status, error = None, None
    try:
        status = post(endpoint.url, body.encode(), headers(endpoint.signing_secrets(now), message["webhook_id"], now, body),
                      POST_TIMEOUT_SECONDS)
    except Exception as exc:  # no answer: refused, reset, timed out, TLS
        error = f"{type(exc).__name__}: {exc}"[:500]
    if status is not None and 200 <= status < 300:
        return Outcome(log(outcome="delivered", status_code=status))
    if status is not None:
        error = f"HTTP {status}"
    if attempt >= ATTEMPTS:
        return Outcome(log(outcome="failed", status_code=status, error=error), give_up=True)
    delay = SCHEDULE_SECONDS[attempt]
    return Outcome(log(outcome="retry", status_code=status, error=error, next_at=now + delay), retry_in=delay)

