"""Webhooks on moto, end to end in one process: a batch's terminal status published by
``lifecycle.publish_status`` (the real EventBridge adapter) -> the EventBridge rule -> the webhook
queue -> the webhook Lambda's handler (fan-out after reading the batch back, then delivery) -> a
real HTTP receiver on 127.0.0.1, whose every request the official SDK's ``client.webhooks.unwrap``
verifies. Events forged onto the bus, as by a principal allowed PutEvents, and a receiver that
never completes its answer beside an honest one.

SQS's delays are real time (5 s, then 5 min): a retry is a message of its own, received at once
and put back invisible until it is due; a test checks the wait it was given, then makes it visible
(``change_message_visibility(0)``) and moves the handlers' clock on by that wait instead of
waiting. The clock starts far enough in the past that every attempt's ``webhook-timestamp`` is
within the 5 minutes ``unwrap`` accepts."""

import json
import time
from collections.abc import Iterator
from typing import Any

import openai
import pytest

from functions.core import clients, deps, lifecycle
from functions.core.aws.dynamodb import Table
from functions.core.aws.sqs import SqsQueue
from functions.core.names import EVENT_SOURCE
from functions.core.records import BatchRecord
from functions.core.settings import Settings
from functions.webhooks import handler, logic, signing
from functions.webhooks.store import EndpointRecord, WebhookRepo
from infra.local.pollers import poll_once
from infra.local.resources import create_webhook_queue
from tests.builders import batch_record
from tests.helpers import free_port
from tests.webhook_receivers import Receiver, StallingReceiver

SDK = openai.OpenAI(api_key="unused", base_url="http://127.0.0.1:9")
TENANT = "acme"


@pytest.fixture
def webhooks(aws: Settings, monkeypatch: pytest.MonkeyPatch) -> Iterator[Settings]:
    url, dead_letters = create_webhook_queue(clients.client, prefix="wh-test", event_bus=aws.event_bus_name)
    monkeypatch.setenv(Settings.env_name("webhook_queue_url"), url)
    monkeypatch.setenv(Settings.env_name("webhook_dead_letter_queue_url"), dead_letters)
    monkeypatch.setenv(Settings.env_name("webhook_allow_loopback_http"), "true")
    deps.reset()
    yield deps.settings()
    deps.reset()


@pytest.fixture
def repo(webhooks: Settings) -> WebhookRepo:
    return WebhookRepo(Table(clients.dynamodb_table(webhooks.table_name)))


class Releases:
    """Spies on ``SqsQueue.release``: the wait (seconds) every message not yet due was given, and
    ``elapse()``, which lets that time pass: the messages visible now, the clock moved on."""

    def __init__(self, url: str, clock: Any):
        self.url, self.clock, self.seconds, self._pending = url, clock, [], []

    def record(self, receipt: str, seconds: int) -> None:
        self.seconds.append(seconds)
        self._pending.append((receipt, seconds))

    def elapse(self) -> None:
        sqs = clients.client("sqs")
        self.clock.now += max((s for _, s in self._pending), default=0)
        while self._pending:
            receipt, _ = self._pending.pop()
            sqs.change_message_visibility(QueueUrl=self.url, ReceiptHandle=receipt, VisibilityTimeout=0)


@pytest.fixture
def releases(webhooks: Settings, clock: Any, monkeypatch: pytest.MonkeyPatch) -> Releases:
    spy, original = Releases(webhooks.webhook_queue_url, clock), SqsQueue.release

    def release(self: SqsQueue, receipt: str, after_seconds: int = 0) -> bool:
        spy.record(receipt, after_seconds)
        return original(self, receipt, after_seconds)

    monkeypatch.setattr(SqsQueue, "release", release)
    return spy


def add_endpoint(
    repo: WebhookRepo, endpoint_id: str, url: str, events: tuple[str, ...] = logic.EVENT_TYPES, tenant: str = TENANT
) -> EndpointRecord:
    now = int(time.time())
    record = EndpointRecord(
        tenant=tenant,
        id=endpoint_id,
        url=url,
        events=list(events),
        secret=signing.new_secret(),
        created_at=now,
        updated_at=now,
    )
    repo.create(record)
    return record


def end_batch(batch_id: str, status: str = "completed", tenant: str = TENANT) -> BatchRecord:
    """A batch reaches a status: stored, and its event published as the workflow publishes it."""
    now = deps.now()
    stamp = {f"{status}_at": now} if status in ("completed", "failed", "expired", "cancelled") else {}
    batch = batch_record(
        tenant=tenant,
        id=batch_id,
        input_key="batches/acme/in.jsonl",
        created_at=now - 60,
        expires_at=now + 86_400,
        status=status,
        total=2,
        completed=2,
        **stamp,
    )
    deps.stores().batches.create(batch)
    lifecycle.publish_status(deps.stores().events, batch)
    return batch


def forge(settings: Settings, event_type: str, detail: dict[str, Any]) -> None:
    """An event put on the bus by someone else than the system (any principal allowed PutEvents)."""
    resp = clients.client("events").put_events(
        Entries=[
            {
                "Source": EVENT_SOURCE,
                "DetailType": event_type,
                "Detail": json.dumps(detail),
                "EventBusName": settings.event_bus_name,
            }
        ]
    )
    assert resp["FailedEntryCount"] == 0


def poll(settings: Settings) -> int:
    """One round of the event source mapping (receive, invoke the handler, delete the successes)."""
    return poll_once(clients.client("sqs"), settings.webhook_queue_url, handler.handler, name="webhooks")


def depth(url: str) -> int:
    attrs = clients.client("sqs").get_queue_attributes(
        QueueUrl=url, AttributeNames=["ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible"]
    )["Attributes"]
    return int(attrs["ApproximateNumberOfMessages"]) + int(attrs["ApproximateNumberOfMessagesNotVisible"])


def test_a_completed_batch_is_delivered_and_the_sdk_unwraps_it(webhooks: Settings, repo: WebhookRepo) -> None:
    receiver = Receiver(free_port()).up()
    try:
        ep = add_endpoint(repo, "we_a", receiver.url)
        add_endpoint(repo, "we_failed_only", "http://127.0.0.1:9/none", events=("batch.failed",))
        add_endpoint(repo, "we_other_tenant", receiver.url, tenant="globex")
        batch = end_batch("batch_wh1")
        assert poll(webhooks) == 1  # the EventBridge event: fanned out to the one subscribed endpoint
        assert poll(webhooks) == 1  # its delivery
        assert poll(webhooks) == 0
    finally:
        receiver.down()
    [(headers, body, _)] = receiver.requests
    event = SDK.webhooks.unwrap(body, headers, secret=ep.secret)
    assert (event.type, event.object, event.data.id) == ("batch.completed", "event", "batch_wh1")
    assert headers["webhook-id"].startswith("wh_") and event.id.startswith("evt_")
    assert event.created_at == batch.completed_at  # when the batch completed, as OpenAI's
    [log] = repo.attempts(TENANT, limit=10, now=int(time.time()))
    assert (log.outcome, log.status_code, log.attempt, log.endpoint_id) == ("delivered", 200, 1, "we_a")


def test_a_receiver_down_for_the_first_two_attempts_gets_the_third(
    webhooks: Settings, repo: WebhookRepo, releases: Releases
) -> None:
    releases.clock.now = int(time.time()) - 305  # the third attempt, 5 s + 5 min on, signs the real time
    receiver = Receiver(free_port())  # not listening: connection refused
    ep = add_endpoint(repo, "we_down", receiver.url)
    end_batch("batch_wh2", status="expired")
    assert poll(webhooks) == 1  # fan-out
    assert poll(webhooks) == 1  # attempt 1: refused; attempt 2's message sent, this one done
    assert poll(webhooks) == 0  # attempt 2's message, not yet due: back in 5 s (not an attempt)
    assert releases.seconds == [5]
    assert poll(webhooks) == 0  # invisible until due: nothing to receive yet
    releases.elapse()
    assert poll(webhooks) == 1  # attempt 2: refused
    assert poll(webhooks) == 0  # attempt 3's message: back in 5 min
    assert releases.seconds == [5, 5 * 60]
    releases.elapse()
    receiver.up()
    try:
        assert poll(webhooks) == 1  # attempt 3: delivered
    finally:
        receiver.down()
    [(headers, body, _)] = receiver.requests
    event = SDK.webhooks.unwrap(body, headers, secret=ep.secret)
    assert (event.type, event.data.id) == ("batch.expired", "batch_wh2")
    logs = sorted(repo.attempts(TENANT, limit=10, now=int(time.time())), key=lambda a: a.attempt)
    assert [(a.attempt, a.outcome) for a in logs] == [(1, "retry"), (2, "retry"), (3, "delivered")]
    assert {a.webhook_id for a in logs} == {headers["webhook-id"]}
    assert [a.next_at - a.at for a in logs[:2]] == [5, 300]
    assert "ConnectionRefusedError" in logs[0].error or "Connection refused" in logs[0].error
    assert depth(webhooks.webhook_queue_url) == 0


def test_every_attempt_carries_the_same_webhook_id_and_body(
    webhooks: Settings, repo: WebhookRepo, releases: Releases
) -> None:
    releases.clock.now = int(time.time()) - 152  # attempts at -152 s, -147 s and +153 s: all within unwrap's 5 min
    receiver = Receiver(free_port(), statuses=[500, 503]).up()
    try:
        ep = add_endpoint(repo, "we_flaky", receiver.url)
        end_batch("batch_wh3", status="failed")
        poll(webhooks)  # fan-out
        for _ in range(5):  # attempt, then the next one's early receive and its wait
            poll(webhooks)
            releases.elapse()
    finally:
        receiver.down()
    assert len(receiver.requests) == 3
    assert len({h["webhook-id"] for h, _, _ in receiver.requests}) == 1
    assert len({b for _, b, _ in receiver.requests}) == 1
    for headers, body, _ in receiver.requests:
        assert SDK.webhooks.unwrap(body, headers, secret=ep.secret).type == "batch.failed"
    attempts = sorted(repo.attempts(TENANT, limit=10, now=int(time.time())), key=lambda a: a.attempt)
    assert [(a.attempt, a.status_code) for a in attempts] == [(1, 500), (2, 503), (3, 200)]


def test_a_spent_schedule_goes_to_the_dead_letter_queue(
    webhooks: Settings, repo: WebhookRepo, releases: Releases
) -> None:
    add_endpoint(repo, "we_gone", f"http://127.0.0.1:{free_port()}/never")
    end_batch("batch_wh4", status="cancelled")
    poll(webhooks)  # fan-out
    for _ in range(16):  # 8 attempts, and the early receive of each of the 7 retries
        poll(webhooks)
        releases.elapse()
    assert releases.seconds == [5, 300, 1800, 7200, 18000, 36000, 36000]
    sqs = clients.client("sqs")
    [dead] = sqs.receive_message(QueueUrl=webhooks.webhook_dead_letter_queue_url, MaxNumberOfMessages=10).get(
        "Messages", []
    )
    assert (json.loads(dead["Body"])["endpoint_id"], json.loads(dead["Body"])["attempt"]) == ("we_gone", 8)
    outcomes = [
        a.outcome for a in sorted(repo.attempts(TENANT, limit=20, now=int(time.time())), key=lambda a: a.attempt)
    ]
    assert outcomes == ["retry"] * 7 + ["failed"]
    assert depth(webhooks.webhook_queue_url) == 0


def test_non_terminal_statuses_are_not_routed(webhooks: Settings, repo: WebhookRepo) -> None:
    add_endpoint(repo, "we_quiet", "http://127.0.0.1:9/none")
    end_batch("batch_wh5", status="in_progress")
    assert poll(webhooks) == 0


# --- events the system did not publish --------------------------------------------------------
def test_a_forged_event_is_dropped_before_anything_is_signed(webhooks: Settings, repo: WebhookRepo) -> None:
    """Put straight on the bus, as by any principal allowed PutEvents: a completion of acme's batch
    that is still running, another status for a batch that ended, and acme's batch named as
    globex's. Each reaches the fan-out (the rule routes it) and is dropped there: no delivery
    message, no request, no attempt logged, for either tenant."""
    receiver = Receiver(free_port()).up()
    try:
        add_endpoint(repo, "we_acme", receiver.url)
        add_endpoint(repo, "we_globex", receiver.url, tenant="globex")
        running = end_batch("batch_running", status="in_progress")  # not routed: not terminal
        done = end_batch("batch_done", status="completed")
        assert poll(webhooks) == 1 and poll(webhooks) == 1  # the honest completion: fanned out, delivered
        receiver.requests.clear()
        forge(webhooks, "batch.completed", {"tenant": TENANT, "id": running.id})
        forge(webhooks, "batch.failed", {"tenant": TENANT, "id": done.id})
        forge(webhooks, "batch.completed", {"tenant": "globex", "id": done.id})
        assert poll(webhooks) == 3  # three events handled (dropped), none left to retry
        assert poll(webhooks) == 0 and depth(webhooks.webhook_queue_url) == 0
    finally:
        receiver.down()
    assert receiver.requests == []
    assert [a.outcome for a in repo.attempts(TENANT, limit=10, now=int(time.time()))] == ["delivered"]
    assert repo.attempts("globex", limit=10, now=int(time.time())) == []


# --- one slow receiver beside a fast one ------------------------------------------------------
def test_a_receiver_that_drips_bytes_does_not_hold_up_another_tenants_delivery(
    webhooks: Settings, repo: WebhookRepo, monkeypatch: pytest.MonkeyPatch
) -> None:
    """globex's endpoint accepts and drips a byte every 0.2 s, never finishing its answer; acme's
    is honest. Both deliveries are in one round: acme's request arrives before globex's connection
    is let go, globex's attempt fails at its deadline (closing the connection) and is its own
    attempt 1, to be retried; acme's is delivered on its attempt 1."""
    monkeypatch.setattr(logic, "POST_DEADLINE_SECONDS", 2)  # the whole exchange's deadline, shortened for the test
    slow = StallingReceiver(free_port(), mode="drip", interval=0.2)
    fast = Receiver(free_port()).up()
    try:
        add_endpoint(repo, "we_slow", slow.url, tenant="globex")
        fast_endpoint = add_endpoint(repo, "we_fast", fast.url)
        end_batch("batch_globex", tenant="globex")
        end_batch("batch_acme")
        assert poll(webhooks) == 2  # both events fanned out
        assert poll(webhooks) == 2  # both deliveries, in one round
    finally:
        fast.down()
        slow.close()
    [(headers, body, arrived)] = fast.requests
    assert SDK.webhooks.unwrap(body, headers, secret=fast_endpoint.secret).data.id == "batch_acme"
    [held] = slow.connections
    # acme's arrived before globex's exchange ended at its deadline, whichever of the two the round
    # started first (both are posted at once, so acme's may even arrive before globex's connects)
    assert arrived < held["closed"]
    [acme] = repo.attempts(TENANT, limit=10, now=int(time.time()))
    [globex] = repo.attempts("globex", limit=10, now=int(time.time()))
    assert (acme.attempt, acme.outcome) == (1, "delivered")
    assert (globex.attempt, globex.outcome, globex.next_at - globex.at) == (1, "retry", 5)
    assert globex.error.startswith("TimeoutError")


def test_delivery_messages_are_grouped_by_tenant_for_fair_queueing(webhooks: Settings, repo: WebhookRepo) -> None:
    """A delivery message carries its tenant as ``MessageGroupId``: the webhook queue then serves
    tenants as an SQS fair queue (one tenant's backlog of slow deliveries does not delay another's)."""
    add_endpoint(repo, "we_1", "http://127.0.0.1:9/none", tenant="globex")
    end_batch("batch_grouped", tenant="globex")
    assert poll(webhooks) == 1  # fan-out
    [message] = clients.client("sqs").receive_message(
        QueueUrl=webhooks.webhook_queue_url,
        MessageSystemAttributeNames=["MessageGroupId"],
    )["Messages"]
    assert message["Attributes"]["MessageGroupId"] == "globex"
    assert json.loads(message["Body"])["kind"] == logic.DELIVERY_KIND
