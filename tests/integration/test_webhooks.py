"""Webhooks on moto, end to end in one process: a batch's terminal status published by
``lifecycle.publish_status`` (the real EventBridge adapter) -> the EventBridge rule -> the webhook
queue -> the webhook Lambda's handler (fan-out, then delivery) -> a real HTTP receiver on
127.0.0.1, whose every request the official SDK's ``client.webhooks.unwrap`` verifies.

SQS's delays are real time (5 s, then 5 min): a test checks the visibility each retry set, then
makes the message visible at once (``change_message_visibility(0)``) instead of waiting."""

import http.server
import json
import threading
import time
from collections.abc import Iterator
from typing import Any

import openai
import pytest

from functions.core import lifecycle
from functions.core import accounting, clients, deps
from functions.core.aws.dynamodb import Table
from functions.core.aws.sqs import SqsQueue
from functions.core.records import BatchRecord
from functions.core.settings import Settings
from functions.webhooks import handler, logic, signing
from functions.webhooks.store import EndpointRecord, WebhookRepo
from infra.local.pollers import poll_once
from infra.local.resources import create_webhook_queue
from tests.helpers import free_port

SDK = openai.OpenAI(api_key="unused", base_url="http://127.0.0.1:9")
TENANT = "acme"


class Receiver:
    """A real HTTP receiver on 127.0.0.1: answers ``statuses`` in turn (then 200); ``up()``/``down()``."""

    def __init__(self, port: int, statuses: list[int] | None = None):
        self.port, self.statuses = port, list(statuses or [])
        self.requests: list[tuple[dict[str, str], bytes]] = []
        self._server: http.server.ThreadingHTTPServer | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/hooks"

    def up(self) -> None:
        outer = self

        class Handle(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802
                body = self.rfile.read(int(self.headers["content-length"]))
                outer.requests.append(({k.lower(): v for k, v in self.headers.items()}, body))
                self.send_response(outer.statuses.pop(0) if outer.statuses else 200)
                self.send_header("content-length", "0")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self._server = http.server.ThreadingHTTPServer(("127.0.0.1", self.port), Handle)
        threading.Thread(target=self._server.serve_forever, daemon=True).start()

    def down(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None



@pytest.fixture
def webhooks(aws: Settings, monkeypatch: pytest.MonkeyPatch) -> Iterator[Settings]:
    url = create_webhook_queue(clients.client, prefix="wh-test", event_bus=aws.event_bus_name)
    monkeypatch.setenv(Settings.env_name("webhook_queue_url"), url)
    monkeypatch.setenv(Settings.env_name("webhook_allow_loopback_http"), "true")
    deps.reset()
    yield deps.settings()
    deps.reset()


@pytest.fixture
def repo(webhooks: Settings) -> WebhookRepo:
    return WebhookRepo(Table(clients.dynamodb_table(webhooks.table_name)))


class Releases:
    """Spies on ``SqsQueue.release``: the visibility (seconds) every retry set, and ``elapse()``,
    which makes the released messages visible now (time passes) instead of after their delay."""

    def __init__(self, url: str):
        self.url, self.seconds, self._receipts = url, [], []

    def record(self, receipt: str, seconds: int) -> None:
        self.seconds.append(seconds)
        self._receipts.append(receipt)

    def elapse(self) -> None:
        sqs = clients.client("sqs")
        while self._receipts:
            sqs.change_message_visibility(QueueUrl=self.url, ReceiptHandle=self._receipts.pop(), VisibilityTimeout=0)


@pytest.fixture
def releases(webhooks: Settings, monkeypatch: pytest.MonkeyPatch) -> Releases:
    spy, original = Releases(webhooks.webhook_queue_url), SqsQueue.release

    def release(self: SqsQueue, receipt: str, after_seconds: int = 0) -> bool:
        spy.record(receipt, after_seconds)
        return original(self, receipt, after_seconds)

    monkeypatch.setattr(SqsQueue, "release", release)
    return spy


def add_endpoint(repo: WebhookRepo, endpoint_id: str, url: str, events: tuple[str, ...] = logic.EVENT_TYPES,
                 tenant: str = TENANT) -> EndpointRecord:
    now = int(time.time())
    record = EndpointRecord(tenant=tenant, id=endpoint_id, url=url, events=list(events), secret=signing.new_secret(),
                            created_at=now, updated_at=now)
    repo.create(record)
    return record


def end_batch(batch_id: str, status: str = "completed", tenant: str = TENANT) -> None:
    """A batch reaches a terminal status: its event published as the workflow publishes it."""
    now = int(time.time())
    batch = BatchRecord(tenant=tenant, id=batch_id, input_file_id="file-1", input_key="batches/acme/in.jsonl", endpoint="/v1/chat/completions",
                        completion_window="24h", created_at=now - 60, expires_at=now + 86_400, status=status,
                        total=2, completed=2)
    lifecycle.publish_status(deps.stores().events, batch)


def poll(settings: Settings) -> int:
    """One round of the event source mapping (receive, invoke the handler, delete the successes)."""
    return poll_once(clients.client("sqs"), settings.webhook_queue_url, handler.handler, name="webhooks")


def depth(url: str) -> int:
    attrs = clients.client("sqs").get_queue_attributes(
        QueueUrl=url, AttributeNames=["ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible"]
    )["Attributes"]
    return int(attrs["ApproximateNumberOfMessages"]) + int(attrs["ApproximateNumberOfMessagesNotVisible"])


def test_a_completed_batch_is_delivered_and_the_sdk_unwraps_it(webhooks: Settings, repo: WebhookRepo) -> None:
    receiver = Receiver(free_port())
    receiver.up()
    try:
        ep = add_endpoint(repo, "we_a", receiver.url)
        add_endpoint(repo, "we_failed_only", "http://127.0.0.1:9/none", events=("batch.failed",))
        add_endpoint(repo, "we_other_tenant", receiver.url, tenant="globex")
        end_batch("batch_wh1")
        assert poll(webhooks) == 1  # the EventBridge event: fanned out to the one subscribed endpoint
        assert poll(webhooks) == 1  # its delivery
        assert poll(webhooks) == 0
    finally:
        receiver.down()
    [(headers, body)] = receiver.requests
    event = SDK.webhooks.unwrap(body, headers, secret=ep.secret)
    assert (event.type, event.object, event.data.id) == ("batch.completed", "event", "batch_wh1")
    assert headers["webhook-id"].startswith("wh_") and event.id.startswith("evt_")
    assert abs(event.created_at - time.time()) < 60
    [log] = repo.attempts(TENANT, limit=10, now=int(time.time()))
    assert (log.outcome, log.status_code, log.attempt, log.endpoint_id) == ("delivered", 200, 1, "we_a")


def test_a_receiver_down_for_the_first_two_attempts_gets_the_third(
    webhooks: Settings, repo: WebhookRepo, releases: Releases
) -> None:
    receiver = Receiver(free_port())  # not listening: connection refused
    ep = add_endpoint(repo, "we_down", receiver.url)
    end_batch("batch_wh2", status="expired")
    assert poll(webhooks) == 1  # fan-out
    assert poll(webhooks) == 0  # attempt 1: refused, kept for later
    assert releases.seconds == [5]
    assert poll(webhooks) == 0  # invisible for its delay: nothing to receive yet
    releases.elapse()
    assert poll(webhooks) == 0  # attempt 2: refused
    assert releases.seconds == [5, 5 * 60]
    releases.elapse()
    receiver.up()
    try:
        assert poll(webhooks) == 1  # attempt 3: delivered, deleted
    finally:
        receiver.down()
    [(headers, body)] = receiver.requests
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
    receiver = Receiver(free_port(), statuses=[500, 503])
    receiver.up()
    try:
        ep = add_endpoint(repo, "we_flaky", receiver.url)
        end_batch("batch_wh3", status="failed")
        poll(webhooks)
        for _ in range(3):
            poll(webhooks)
            releases.elapse()
    finally:
        receiver.down()
    assert len(receiver.requests) == 3
    assert len({h["webhook-id"] for h, _ in receiver.requests}) == 1
    assert len({b for _, b in receiver.requests}) == 1
    for headers, body in receiver.requests:
        assert SDK.webhooks.unwrap(body, headers, secret=ep.secret).type == "batch.failed"
    assert [a.status_code for a in sorted(repo.attempts(TENANT, limit=10, now=int(time.time())), key=lambda a: a.attempt)] == [500, 503, 200]


def test_a_spent_schedule_goes_to_the_dead_letter_queue(
    webhooks: Settings, repo: WebhookRepo, releases: Releases
) -> None:
    add_endpoint(repo, "we_gone", f"http://127.0.0.1:{free_port()}/never")
    end_batch("batch_wh4", status="cancelled")
    poll(webhooks)
    for _ in range(8):
        poll(webhooks)
        releases.elapse()
    assert releases.seconds == [5, 300, 1800, 7200, 18000, 36000, 36000, 0]
    poll(webhooks)  # the 9th receive: past maxReceiveCount, SQS moves it to the DLQ
    sqs = clients.client("sqs")
    dlq = sqs.get_queue_url(QueueName="wh-test-webhooks-dlq")["QueueUrl"]
    [dead] = sqs.receive_message(QueueUrl=dlq, MaxNumberOfMessages=10).get("Messages", [])
    assert json.loads(dead["Body"])["endpoint_id"] == "we_gone"
    outcomes = [a.outcome for a in sorted(repo.attempts(TENANT, limit=20, now=int(time.time())), key=lambda a: a.attempt)]
    assert outcomes == ["retry"] * 7 + ["failed"]


def test_non_terminal_statuses_are_not_routed(webhooks: Settings, repo: WebhookRepo) -> None:
    add_endpoint(repo, "we_quiet", "http://127.0.0.1:9/none")
    end_batch("batch_wh5", status="in_progress")
    assert poll(webhooks) == 0
