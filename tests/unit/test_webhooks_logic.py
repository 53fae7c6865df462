"""Webhook fan-out and delivery logic with in-memory fakes (the repo, the batches, the queue, the
POST, the clock): the backoff schedule, the attempt log, what is dropped, what is retried, the
deterministic ids a receiver dedupes on, HTTPS only unless loopback http is allowed; an event the
table does not bear out fans out nothing; the attempts of one round run at once, so a receiver
that never answers does not hold up another's delivery."""

import json
import threading
from typing import Any

import openai
import pytest

from functions.core.records import BatchRecord
from functions.webhooks import logic, signing
from functions.webhooks.store import AttemptRecord, EndpointRecord
from tests.builders import batch_record

SDK = openai.OpenAI(api_key="unused", base_url="http://127.0.0.1:9")
NOW = 1_800_000_000


class FakeRepo:
    def __init__(self) -> None:
        self.endpoints: dict[tuple[str, str], EndpointRecord] = {}
        self.log_entries: list[AttemptRecord] = []

    def add(
        self,
        tenant: str,
        endpoint_id: str,
        url: str = "https://hooks.example.com/x",
        events: tuple[str, ...] = logic.EVENT_TYPES,
    ) -> EndpointRecord:
        record = EndpointRecord(
            tenant=tenant,
            id=endpoint_id,
            url=url,
            events=list(events),
            secret=signing.new_secret(),
            created_at=NOW,
            updated_at=NOW,
        )
        self.endpoints[(tenant, endpoint_id)] = record
        return record

    def list(self, tenant: str) -> list[EndpointRecord]:
        return [e for (t, _), e in sorted(self.endpoints.items()) if t == tenant]

    def get(self, tenant: str, endpoint_id: str) -> EndpointRecord | None:
        return self.endpoints.get((tenant, endpoint_id))

    def log(self, attempt: AttemptRecord) -> None:
        self.log_entries.append(attempt)


class FakeBatches:
    """The batch reads of the fan-out: ``batch_1`` of ``acme`` completed at ``NOW``, unless a test adds others."""

    def __init__(self) -> None:
        self.records: dict[tuple[str, str], BatchRecord] = {}
        self.add("acme", "batch_1", "completed")

    def add(self, tenant: str, batch_id: str, status: str) -> BatchRecord:
        stamp = {f"{status}_at": NOW} if status in ("completed", "failed", "expired", "cancelled") else {}
        record = batch_record(
            tenant=tenant,
            id=batch_id,
            input_key="in",
            created_at=NOW - 60,
            expires_at=NOW + 86_400,
            status=status,
            **stamp,
        )
        self.records[(tenant, batch_id)] = record
        return record

    def get(self, tenant: str, batch_id: str) -> BatchRecord | None:
        return self.records.get((tenant, batch_id))


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
    return {
        "version": "0",
        "id": "eb-1",
        "detail-type": event_type,
        "source": "batch-api",
        "time": "2027-01-15T08:00:10Z",
        "detail": {"tenant": tenant, "id": batch_id, "status": event_type[6:]},
    }


def test_fan_out_one_delivery_per_subscribed_endpoint_of_the_tenant() -> None:
    repo, queue = FakeRepo(), FakeQueue()
    repo.add("acme", "we_all")
    repo.add("acme", "we_failed", events=("batch.failed",))
    repo.add("globex", "we_other")
    result = logic.fan_out(repo, FakeBatches(), queue, event(), now=NOW + 5)
    assert [m["endpoint_id"] for m in queue.sent] == ["we_all"]
    assert result.webhook_ids == [queue.sent[0]["webhook_id"]] and result.dropped is None
    assert (queue.sent[0]["attempt"], queue.sent[0]["due"]) == (1, 0)
    body = json.loads(queue.sent[0]["body"])
    assert body == {
        "id": body["id"],
        "object": "event",
        "created_at": NOW,  # when the batch completed
        "type": "batch.completed",
        "data": {"id": "batch_1"},
    }


def test_a_repeated_event_fans_out_to_the_same_ids_and_body() -> None:
    repo, batches = FakeRepo(), FakeBatches()
    repo.add("acme", "we_1")
    batches.add("acme", "batch_2", "failed")
    first, second = FakeQueue(), FakeQueue()
    logic.fan_out(repo, batches, first, event(), now=NOW)
    logic.fan_out(repo, batches, second, event() | {"time": "2027-01-15T09:00:00Z"}, now=NOW + 100)
    assert first.sent == second.sent  # the body comes from the stored batch, not from the event
    other = FakeQueue()
    logic.fan_out(repo, batches, other, event("batch.failed", batch_id="batch_2"), now=NOW)
    assert other.sent[0]["webhook_id"] != first.sent[0]["webhook_id"]
    assert other.sent[0]["event_id"] != first.sent[0]["event_id"]


@pytest.mark.parametrize("detail_type", ["batch.in_progress", "batch.validating", "Scheduled Event"])
def test_other_events_fan_out_nothing(detail_type: str) -> None:
    repo, queue = FakeRepo(), FakeQueue()
    repo.add("acme", "we_1")
    result = logic.fan_out(repo, FakeBatches(), queue, event(detail_type), now=NOW)
    assert result.webhook_ids == [] and result.dropped and queue.sent == []


@pytest.mark.parametrize(
    ("forged", "why"),
    [
        # a batch that is still running: nothing may be signed about a state it has not reached
        (event("batch.completed", batch_id="batch_running"), "the batch is in_progress, not completed"),
        # a terminal batch, another terminal type
        (event("batch.failed"), "the batch is completed, not failed"),
        # another tenant named for acme's batch: globex's endpoints would be told about it
        (event("batch.completed", tenant="globex"), "the tenant has no such batch"),
        (event("batch.completed", batch_id="batch_nowhere"), "the tenant has no such batch"),
        (event() | {"source": "someone-else"}, "not a terminal batch event"),
        (event() | {"detail": {"tenant": "acme#WEBHOOKS", "id": "batch_1"}}, "the event names no valid tenant"),
        (event() | {"detail": {"tenant": "acme"}}, "the event names no valid tenant"),
        (event() | {"detail": "batch_1"}, "the event names no valid tenant"),
    ],
)
def test_an_event_the_table_does_not_bear_out_is_dropped(forged: dict[str, Any], why: str) -> None:
    repo, batches, queue = FakeRepo(), FakeBatches(), FakeQueue()
    batches.add("acme", "batch_running", "in_progress")
    for tenant in ("acme", "globex"):
        repo.add(tenant, "we_1")
    result = logic.fan_out(repo, batches, queue, forged, now=NOW)
    assert result.webhook_ids == [] and queue.sent == []
    assert result.dropped.startswith(why), result.dropped


def message(repo: FakeRepo, endpoint_id: str = "we_1", attempt: int = 1) -> logic.Delivery:
    queue = FakeQueue()
    logic.fan_out(repo, FakeBatches(), queue, event(), now=NOW)
    [msg] = [m for m in queue.sent if m["endpoint_id"] == endpoint_id]
    return logic.Delivery.model_validate(msg).model_copy(update={"attempt": attempt})


def test_a_delivery_is_signed_for_the_sdk_and_logged() -> None:
    import time

    repo = FakeRepo()
    endpoint = repo.add("acme", "we_1")
    post, now = Receiver(204), int(time.time())
    outcome = logic.deliver(repo, message(repo), post=post, now=now, allow_loopback_http=False)
    assert outcome.retry is None and not outcome.give_up
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
    delays, outcomes, attempts = [], [], []
    for answer in answers:
        outcome = logic.deliver(repo, msg, post=Receiver(answer), now=NOW, allow_loopback_http=False)
        attempts.append(msg.attempt)
        delays.append(outcome.retry.due - NOW if outcome.retry else None)
        outcomes.append(outcome.give_up)
        if outcome.retry:  # the next attempt is a message of its own: same id and body, its attempt number
            assert (outcome.retry.webhook_id, outcome.retry.body) == (msg.webhook_id, msg.body)
            assert outcome.retry.attempt == msg.attempt + 1
            msg = outcome.retry
    assert attempts == list(range(1, 9))
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
    msg, t = message(repo), NOW
    while True:
        answer = 200 if t >= NOW + 3600 else ConnectionRefusedError("down")
        outcome = logic.deliver(repo, msg, post=Receiver(answer), now=t, allow_loopback_http=False)
        if outcome.retry is None:
            break
        msg, t = outcome.retry, outcome.retry.due
    assert repo.log_entries[-1].outcome == "delivered" and msg.attempt == 5  # 0, 5 s, 5 min, 35 min, 2 h 35 min


def test_a_deleted_endpoint_or_a_forbidden_url_is_dropped_without_a_post() -> None:
    repo = FakeRepo()
    repo.add("acme", "we_1", url="http://127.0.0.1:8080/x")
    msg = message(repo)
    post = Receiver()
    assert logic.deliver(repo, msg, post=post, now=NOW, allow_loopback_http=False).retry is None
    del repo.endpoints[("acme", "we_1")]
    assert logic.deliver(repo, msg, post=post, now=NOW, allow_loopback_http=True).retry is None
    assert post.calls == []
    assert [(e.outcome, e.error.split(" ")[0]) for e in repo.log_entries] == [("dropped", "the"), ("dropped", "the")]
    assert "https" in repo.log_entries[0].error and "deleted" in repo.log_entries[1].error


def test_loopback_http_only_where_allowed() -> None:
    repo = FakeRepo()
    repo.add("acme", "we_1", url="http://127.0.0.1:8080/x")
    post = Receiver(200)
    logic.deliver(repo, message(repo), post=post, now=NOW, allow_loopback_http=True)
    assert len(post.calls) == 1 and repo.log_entries[0].outcome == "delivered"


@pytest.mark.parametrize(
    ("url", "allowed"),
    [
        ("https://hooks.example.com/x", True),
        ("https://127.0.0.1/x", True),
        ("http://hooks.example.com/x", False),
        ("http://127.0.0.1.nip.io/x", False),
        ("http://169.254.169.254/latest", False),
        ("file:///etc/passwd", False),
        ("https:///x", False),
    ],
)
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
    repo.endpoints[("acme", "we_1")] = endpoint.model_copy(
        update={"secret": signing.new_secret(), "previous_secret": old, "previous_until": now + 1}
    )
    post = Receiver(200, 200)
    logic.deliver(repo, message(repo), post=post, now=now, allow_loopback_http=False)
    logic.deliver(repo, message(repo), post=post, now=now + 1, allow_loopback_http=False)
    (_, body, kept, _), (_, _, dropped, _) = post.calls
    assert SDK.webhooks.unwrap(body, kept, secret=old)
    with pytest.raises(openai.InvalidWebhookSignatureError):
        SDK.webhooks.unwrap(body, dropped, secret=old)


# --- one round's attempts: isolated from each other -------------------------------------------
class Slow:
    """A receiver that never answers: its POST waits until ``released`` (at most ``guard``
    seconds) and then fails as the HTTP port fails at its deadline."""

    def __init__(self, guard: float = 30.0) -> None:
        self.released, self.guard = threading.Event(), guard
        self.waiting = threading.Event()

    def __call__(self) -> int:
        self.waiting.set()
        try:
            self.released.wait(self.guard)
        finally:
            self.waiting.clear()
        raise TimeoutError("no complete answer within 10 s")


def test_a_receiver_that_never_answers_does_not_hold_up_another_delivery() -> None:
    """Tenant globex's endpoint never answers; acme's, in the same round (after it), is posted
    while globex's POST is still waiting: the fast receiver itself releases the slow one, so a
    round that posted one at a time would stall here until the guard and fail the assertion."""
    repo = FakeRepo()
    repo.add("globex", "we_slow", url="https://slow.example.com/hook")
    repo.add("acme", "we_fast", url="https://fast.example.com/hook")
    slow = Slow()
    posted_while_slow_waited: list[bool] = []

    def post(url: str, body: bytes, headers: dict[str, str], deadline: float) -> int:
        assert deadline == logic.POST_DEADLINE_SECONDS
        if url.startswith("https://slow"):
            return slow()
        slow.waiting.wait(slow.guard)  # the slow POST has begun (both are under way at once) ...
        posted_while_slow_waited.append(slow.waiting.is_set())  # ... and is still waiting
        slow.released.set()
        return 200

    globex = logic.Delivery(
        tenant="globex",
        endpoint_id="we_slow",
        webhook_id="wh_g",
        event_id="evt_g",
        event_type="batch.completed",
        body="{}",
    )
    acme = logic.Delivery(
        tenant="acme",
        endpoint_id="we_fast",
        webhook_id="wh_a",
        event_id="evt_a",
        event_type="batch.completed",
        body="{}",
    )
    slow_outcome, fast_outcome = logic.deliver_all(repo, [globex, acme], post=post, now=NOW, allow_loopback_http=False)
    assert posted_while_slow_waited == [True]
    assert fast_outcome.attempt.outcome == "delivered" and fast_outcome.retry is None
    # the slow one's attempt is its own: a retry of attempt 1, its error the deadline's
    assert (slow_outcome.attempt.outcome, slow_outcome.attempt.attempt) == ("retry", 1)
    assert slow_outcome.attempt.error.startswith("TimeoutError") and slow_outcome.retry.attempt == 2


def test_a_delivery_that_could_not_be_attempted_is_not_an_attempt() -> None:
    """An endpoint read that fails keeps that one message from its POST: the round reports the
    exception for it (its message comes back with the same attempt number), logs nothing for it,
    and still attempts the others."""
    repo = FakeRepo()
    repo.add("acme", "we_ok")
    repo.add("acme", "we_throttled")
    original = repo.get

    def get(tenant: str, endpoint_id: str) -> EndpointRecord | None:
        if endpoint_id == "we_throttled":
            raise RuntimeError("ProvisionedThroughputExceededException")
        return original(tenant, endpoint_id)

    repo.get = get  # type: ignore[method-assign]
    post = Receiver(200)
    broken, ok = logic.deliver_all(
        repo,
        [message(repo, "we_throttled", attempt=3), message(repo, "we_ok")],
        post=post,
        now=NOW,
        allow_loopback_http=False,
    )
    assert isinstance(broken, RuntimeError)
    assert isinstance(ok, logic.Outcome) and ok.attempt.outcome == "delivered"
    assert [e.endpoint_id for e in repo.log_entries] == ["we_ok"] and len(post.calls) == 1


def test_a_message_not_yet_due_waits_for_its_time() -> None:
    repo = FakeRepo()
    repo.add("acme", "we_1")
    msg = message(repo).model_copy(update={"due": NOW + 300})
    assert msg.wait_seconds(NOW) == 300 and msg.wait_seconds(NOW + 300) == 0 and msg.wait_seconds(NOW + 999) == 0
    far = msg.model_copy(update={"due": NOW + 2 * logic.MAX_VISIBILITY_SECONDS})
    assert far.wait_seconds(NOW) == logic.MAX_VISIBILITY_SECONDS  # SQS's longest visibility, then again
