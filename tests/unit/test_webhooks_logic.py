"""Webhook fan-out and delivery logic with in-memory fakes (the repo, the queue, the POST, the
clock): the backoff schedule, the attempt log, what is dropped, what is retried, the deterministic
ids a receiver dedupes on, HTTPS only unless loopback http is allowed."""

import json
from typing import Any

import openai
import pytest

from functions.webhooks import logic, signing
from functions.webhooks.store import AttemptRecord, EndpointRecord

SDK = openai.OpenAI(api_key="unused", base_url="http://127.0.0.1:9")
NOW = 1_800_000_000


class FakeRepo:
    def __init__(self) -> None:
        self.endpoints: dict[tuple[str, str], EndpointRecord] = {}
        self.log_entries: list[AttemptRecord] = []

    def add(self, tenant: str, endpoint_id: str, url: str = "https://hooks.example.com/x",
            events: tuple[str, ...] = logic.EVENT_TYPES) -> EndpointRecord:
        record = EndpointRecord(tenant=tenant, id=endpoint_id, url=url, events=list(events),
                                secret=signing.new_secret(), created_at=NOW, updated_at=NOW)
        self.endpoints[(tenant, endpoint_id)] = record
        return record

    def list(self, tenant: str) -> list[EndpointRecord]:
        return [e for (t, _), e in sorted(self.endpoints.items()) if t == tenant]

    def get(self, tenant: str, endpoint_id: str) -> EndpointRecord | None:
        return self.endpoints.get((tenant, endpoint_id))

    def log(self, attempt: AttemptRecord) -> None:
        self.log_entries.append(attempt)


class FakeQueue:
    def __init__(self) -> None:
        self.sent: list[dict[str, Any]] = []

    def send(self, bodies: list[str]) -> None:
        self.sent += [json.loads(b) for b in bodies]


class Receiver:
    """The POST: answers ``script`` in turn (an int status, or an exception to raise)."""

    def __init__(self, *script: Any):
        self.script, self.calls = list(script), []

    def __call__(self, url: str, body: bytes, headers: dict[str, str], timeout: float) -> int:
        self.calls.append((url, body, headers, timeout))
        answer = self.script.pop(0) if self.script else 200
        if isinstance(answer, BaseException):
            raise answer
        return answer


def event(event_type: str = "batch.completed", batch_id: str = "batch_1", tenant: str = "acme") -> dict[str, Any]:
    return {"version": "0", "id": "eb-1", "detail-type": event_type, "source": "batch-api",
            "time": "2027-01-15T08:00:10Z", "detail": {"tenant": tenant, "id": batch_id, "status": event_type[6:]}}


def test_fan_out_one_delivery_per_subscribed_endpoint_of_the_tenant() -> None:
    repo, queue = FakeRepo(), FakeQueue()
    repo.add("acme", "we_all")
    repo.add("acme", "we_failed", events=("batch.failed",))
    repo.add("globex", "we_other")
    ids = logic.fan_out(repo, queue, event(), now=NOW)
    assert [m["endpoint_id"] for m in queue.sent] == ["we_all"]
    assert ids == [queue.sent[0]["webhook_id"]]
    body = json.loads(queue.sent[0]["body"])
    assert body == {"id": body["id"], "object": "event", "created_at": 1_800_000_010,  # the event's time
                    "type": "batch.completed", "data": {"id": "batch_1"}}


def test_a_repeated_event_fans_out_to_the_same_ids_and_body() -> None:
    repo = FakeRepo()
    repo.add("acme", "we_1")
    first, second = FakeQueue(), FakeQueue()
    logic.fan_out(repo, first, event(), now=NOW)
    logic.fan_out(repo, second, event(), now=NOW + 100)
    assert first.sent == second.sent
    other = FakeQueue()
    logic.fan_out(repo, other, event("batch.failed"), now=NOW)
    assert other.sent[0]["webhook_id"] != first.sent[0]["webhook_id"]
    assert other.sent[0]["event_id"] != first.sent[0]["event_id"]


@pytest.mark.parametrize("detail_type", ["batch.in_progress", "batch.validating", "Scheduled Event"])
def test_other_events_fan_out_nothing(detail_type: str) -> None:
    repo, queue = FakeRepo(), FakeQueue()
    repo.add("acme", "we_1")
    assert logic.fan_out(repo, queue, event(detail_type), now=NOW) == [] and queue.sent == []


def message(repo: FakeRepo, endpoint_id: str = "we_1") -> dict[str, Any]:
    queue = FakeQueue()
    logic.fan_out(repo, queue, event(), now=NOW)
    [msg] = [m for m in queue.sent if m["endpoint_id"] == endpoint_id]
    return msg


def test_a_delivery_is_signed_for_the_sdk_and_logged() -> None:
    import time

    repo = FakeRepo()
    endpoint = repo.add("acme", "we_1")
    post, now = Receiver(204), int(time.time())
    outcome = logic.deliver(repo, message(repo), attempt=1, post=post, now=now, allow_loopback_http=False)
    assert outcome.retry_in is None and not outcome.give_up
    [(url, body, headers, timeout)] = post.calls
    assert url == endpoint.url and timeout == 10
    assert SDK.webhooks.unwrap(body, headers, secret=endpoint.secret).data.id == "batch_1"
    assert headers["webhook-timestamp"] == str(now)
    [log] = repo.log_entries
    assert (log.outcome, log.status_code, log.attempt, log.at) == ("delivered", 204, 1, now)


def test_failures_follow_the_schedule_then_give_up() -> None:
    repo = FakeRepo()
    repo.add("acme", "we_1")
    msg = message(repo)
    answers = [ConnectionRefusedError("down"), 500, TimeoutError("slow"), 302, 404, 503, 429, 500]
    delays, outcomes = [], []
    for attempt, answer in enumerate(answers, start=1):
        outcome = logic.deliver(repo, msg, attempt=attempt, post=Receiver(answer), now=NOW, allow_loopback_http=False)
        delays.append(outcome.retry_in)
        outcomes.append(outcome.give_up)
    # Standard Webhooks: 5 s, 5 min, 30 min, 2 h, 5 h, 10 h, 10 h, then no more
    assert delays == [5, 300, 1800, 7200, 18000, 36000, 36000, None]
    assert outcomes == [False] * 7 + [True]
    assert [e.outcome for e in repo.log_entries] == ["retry"] * 7 + ["failed"]
    assert [e.status_code for e in repo.log_entries] == [None, 500, None, 302, 404, 503, 429, 500]
    assert repo.log_entries[0].error.startswith("ConnectionRefusedError")
    assert repo.log_entries[1].next_at == NOW + 300
    assert sum(delays[:-1]) == 27 * 3600 + 35 * 60 + 5


def test_a_receiver_down_for_an_hour_still_gets_it() -> None:
    repo = FakeRepo()
    repo.add("acme", "we_1")
    msg, t, attempt = message(repo), NOW, 1
    while True:
        answer = 200 if t >= NOW + 3600 else ConnectionRefusedError("down")
        outcome = logic.deliver(repo, msg, attempt=attempt, post=Receiver(answer), now=t, allow_loopback_http=False)
        if outcome.retry_in is None:
            break
        t, attempt = t + outcome.retry_in, attempt + 1
    assert repo.log_entries[-1].outcome == "delivered" and attempt == 5  # 0, 5 s, 5 min, 35 min, 2 h 35 min


def test_a_deleted_endpoint_or_a_forbidden_url_is_dropped_without_a_post() -> None:
    repo = FakeRepo()
    repo.add("acme", "we_1", url="http://127.0.0.1:8080/x")
    msg = message(repo)
    post = Receiver()
    assert logic.deliver(repo, msg, attempt=1, post=post, now=NOW, allow_loopback_http=False).retry_in is None
    del repo.endpoints[("acme", "we_1")]
    assert logic.deliver(repo, msg, attempt=2, post=post, now=NOW, allow_loopback_http=True).retry_in is None
    assert post.calls == []
    assert [(e.outcome, e.error.split(" ")[0]) for e in repo.log_entries] == [("dropped", "the"), ("dropped", "the")]
    assert "https" in repo.log_entries[0].error and "deleted" in repo.log_entries[1].error


def test_loopback_http_only_where_allowed() -> None:
    repo = FakeRepo()
    repo.add("acme", "we_1", url="http://127.0.0.1:8080/x")
    post = Receiver(200)
    logic.deliver(repo, message(repo), attempt=1, post=post, now=NOW, allow_loopback_http=True)
    assert len(post.calls) == 1 and repo.log_entries[0].outcome == "delivered"


@pytest.mark.parametrize(("url", "allowed"), [
    ("https://hooks.example.com/x", True),
    ("https://127.0.0.1/x", True),
    ("http://hooks.example.com/x", False),
    ("http://127.0.0.1.nip.io/x", False),
    ("http://169.254.169.254/latest", False),
    ("file:///etc/passwd", False),
    ("https:///x", False),
])
def test_url_rules_on_aws(url: str, allowed: bool) -> None:
    assert (logic.url_problem(url, allow_loopback_http=False) is None) is allowed
    if url.startswith("http://127.0.0.1.nip.io") or url.startswith("http://169"):
        assert logic.url_problem(url, allow_loopback_http=True) is not None  # not loopback


def test_the_rotated_out_secret_signs_only_while_kept() -> None:
    import time

    repo = FakeRepo()
    endpoint = repo.add("acme", "we_1")
    old = endpoint.secret
    now = int(time.time())
    repo.endpoints[("acme", "we_1")] = endpoint.model_copy(update={
        "secret": signing.new_secret(), "previous_secret": old, "previous_until": now + 1})
    post = Receiver(200, 200)
    logic.deliver(repo, message(repo), attempt=1, post=post, now=now, allow_loopback_http=False)
    logic.deliver(repo, message(repo), attempt=1, post=post, now=now + 1, allow_loopback_http=False)
    (_, body, kept, _), (_, _, dropped, _) = post.calls
    assert SDK.webhooks.unwrap(body, kept, secret=old)
    with pytest.raises(openai.InvalidWebhookSignatureError):
        SDK.webhooks.unwrap(body, dropped, secret=old)
