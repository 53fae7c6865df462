"""Webhooks between tenants who do not trust each other, under `make up` (the local deployment with
its engines), driven through the SDK and ``batchctl`` only, plus what an attacker allowed
``events:PutEvents`` would do: put events straight on the batch event bus (moto's, by the name the
stack gives it).

- Tenant B's endpoint accepts connections and drips bytes, never finishing an answer. While one of
  its attempts holds a connection open, tenant A's webhook for its completed batch arrives and
  verifies with the SDK's ``webhooks.unwrap``; B's attempts fail at their deadline, one attempt
  each, and are retried.
- Events forged onto the bus about A's batches (a completion of a batch still running, A's batch
  named as B's) are dropped by the fan-out, which reads the batch back first: no delivery to
  anyone, and A gets exactly the one honest webhook of each batch."""

import json
import threading
import time
from typing import Any, Self

import boto3
import pytest

from functions.core.names import EVENT_SOURCE
from functions.webhooks import logic
from infra import names
from infra.local import state as local_state
from tests.e2e import test_webhooks_e2e as webhooks_e2e
from tests.e2e.test_batches_e2e import chat_line, submit, wait
from tests.e2e.test_webhooks_e2e import batchctl, wait_for
from tests.webhook_receivers import Receiver, StallingReceiver

from .conftest import LocalDeployment, free_port

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.engine,
    pytest.mark.local_only("plain http to loopback receivers, and events put straight on moto's bus"),
]

A, B = "wh-hostile-a", "wh-hostile-b"
#: How many failing batches B may start to keep one of its attempts in progress throughout.
B_BATCHES_MAX = 6


def deliveries(local: LocalDeployment, tenant: str) -> list[dict]:
    return webhooks_e2e.deliveries(local, tenant, limit=100)


def dropped(local: LocalDeployment, batch_id: str) -> list[dict]:
    """The webhook Lambda's 'webhook event dropped' log lines about ``batch_id``."""
    rows = []
    for line in local.log().splitlines():
        if '"webhook event dropped"' in line:
            row = json.loads(line[line.index("{") :])
            if row.get("batch_id") == batch_id:
                rows.append(row)
    return rows


def forge(local: LocalDeployment, event_type: str, detail: dict) -> None:
    """What any principal allowed PutEvents could send (on AWS the bus policy refuses it)."""
    events = boto3.client(
        "events",
        endpoint_url=local.state.moto_endpoint,
        region_name=local_state.REGION,
        aws_access_key_id=local_state.ACCESS_KEY_ID,
        aws_secret_access_key=local_state.SECRET_ACCESS_KEY,
    )
    resp = events.put_events(
        Entries=[
            {
                "Source": EVENT_SOURCE,
                "DetailType": event_type,
                "Detail": json.dumps(detail),
                "EventBusName": names.event_bus_name(names.LOCAL_PREFIX),
            }
        ]
    )
    assert resp["FailedEntryCount"] == 0, resp


class KeepStalled:
    """Keeps one of B's attempts in progress: starts a B batch that fails validation (its
    ``batch.failed`` webhook goes to the dripping receiver) whenever none of B's connections is
    open or the youngest has been held 5 s (its attempt ends at the 10 s deadline)."""

    def __init__(self, sdk: Any, receiver: StallingReceiver):
        self.sdk, self.receiver, self.started = sdk, receiver, 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> Self:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(30)

    def _youngest_age(self) -> float | None:
        held = [c["opened"] for c in self.receiver.connections if c["closed"] is None]
        return time.monotonic() - max(held) if held else None

    def _run(self) -> None:
        pending_since = None
        while not self._stop.is_set() and self.started < B_BATCHES_MAX:
            age = self._youngest_age()
            waiting = pending_since is not None and time.monotonic() - pending_since < 5
            if not waiting and (age is None or age >= 5):
                duplicate = chat_line(0, max_tokens=1)
                submit(self.sdk, [duplicate, duplicate])  # duplicate custom_id: fails at validation
                self.started += 1
                pending_since = time.monotonic()
            self._stop.wait(0.2)


def test_a_stalled_receiver_and_forged_events_never_reach_another_tenant(local_engines: LocalDeployment) -> None:
    local = local_engines
    slow = StallingReceiver(free_port(), mode="drip", interval=0.5)
    fast = Receiver(free_port()).up()
    try:
        a_hook = json.loads(batchctl(local, "webhooks", "create", "--tenant", A, "--url", fast.url))
        batchctl(
            local, "webhooks", "create", "--tenant", B, "--url", slow.url, "--events", "batch.failed,batch.completed"
        )
        sdk_a, sdk_b = local.client(local.new_key(A)), local.client(local.new_key(B))

        # B's endpoint stalls; A's batch completes meanwhile and its webhook arrives during a stall.
        with KeepStalled(sdk_b, slow):
            wait_for("B's first stalled attempt", slow.opened.is_set, 120)
            done = wait(sdk_a, submit(sdk_a, [chat_line(0, max_tokens=2)]).id)
            assert done.status == "completed", done
            wait_for("A's webhook", fast.arrived.is_set, 120)
        [(headers, body, arrived)] = fast.requests
        event = sdk_a.webhooks.unwrap(body, headers, secret=a_hook["signing_secret"])
        assert (event.type, event.data.id) == ("batch.completed", done.id)
        held = [c for c in slow.connections if c["opened"] < arrived and (c["closed"] is None or arrived < c["closed"])]
        assert held, "A's webhook did not arrive while one of B's attempts held its connection"
        a_log = deliveries(local, A)
        assert [(d["attempt"], d["outcome"]) for d in a_log] == [(1, "delivered")]
        b_log = wait_for(
            "B's failed attempts", lambda: [d for d in deliveries(local, B) if d["outcome"] == "retry"], 60
        )
        assert all(d["error"].startswith("TimeoutError") for d in b_log), b_log
        assert not any(d["outcome"] == "delivered" for d in deliveries(local, B))

        # Forged: A's completed batch named as B's, and a completion of A's batch still running.
        forge(local, "batch.completed", {"tenant": B, "id": done.id})
        running = submit(sdk_a, [chat_line(i, max_tokens=24) for i in range(4)])
        forge(local, "batch.completed", {"tenant": A, "id": running.id})
        [as_b] = wait_for(
            "the event naming B dropped", lambda: [r for r in dropped(local, done.id) if r["tenant"] == B], 60
        )
        assert as_b["reason"] == "the tenant has no such batch"
        [early] = wait_for("the early completion dropped", lambda: dropped(local, running.id), 60)
        assert early["reason"] in (
            "the batch is validating, not completed",
            "the batch is in_progress, not completed",
        ), early

        # The honest completion of the running batch is the one webhook A gets for it.
        finished = wait(sdk_a, running.id)
        assert finished.status == "completed", finished
        wait_for("A's second webhook", lambda: len(fast.requests) >= 2, 120)
    finally:
        fast.down()
        slow.close()
    assert [sdk_a.webhooks.unwrap(b, h, secret=a_hook["signing_secret"]).data.id for h, b, _ in fast.requests] == [
        done.id,
        running.id,
    ]
    forged_for_b = logic.event_id(done.id, "batch.completed")
    assert not [d for d in deliveries(local, B) if d["event_id"] == forged_for_b]
    assert [(d["attempt"], d["outcome"]) for d in deliveries(local, A)] == [(1, "delivered"), (1, "delivered")]
