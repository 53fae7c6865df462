"""The webhook POST (``functions.webhooks.http.post``) over real sockets on 127.0.0.1: one deadline
for the whole exchange. A receiver that drips a byte every 0.2 s (well inside any per-read
timeout) or never answers fails the attempt with ``TimeoutError`` at the deadline, and its
connection is closed by us; an honest answer, a 3xx (not followed) and a refused connection are
what they are.

Each call runs in a thread the test joins with a guard far beyond the deadline: the assertion is
that the call ended (and how), never how fast."""

import threading
import time
from collections.abc import Callable

import pytest

from functions.webhooks import http
from tests.helpers import free_port
from tests.webhook_receivers import Receiver, StallingReceiver

DEADLINE = 1.0
GUARD = 30.0


def ended(call: Callable[[], int]) -> int | BaseException:
    """What ``call`` returned or raised; fails the test if it is still running after GUARD."""
    result: list[int | BaseException] = []

    def run() -> None:
        try:
            result.append(call())
        except BaseException as exc:
            result.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(GUARD)
    assert result, f"post() still running after {GUARD} s: the deadline did not hold"
    return result[0]


@pytest.mark.parametrize("mode", ["drip", "silent"])
def test_a_receiver_that_never_completes_its_answer_fails_at_the_deadline(mode: str) -> None:
    receiver = StallingReceiver(free_port(), mode=mode, interval=0.2)
    try:
        outcome = ended(lambda: http.post(receiver.url, b"{}", {"content-type": "application/json"}, DEADLINE))
        assert isinstance(outcome, TimeoutError), outcome
        # our side shut the connection at the deadline: the receiver sees it close
        give_up = time.monotonic() + GUARD
        while receiver.open_now() and time.monotonic() < give_up:
            time.sleep(0.05)
        assert len(receiver.connections) == 1 and receiver.open_now() == 0, "the stalled connection was left open"
    finally:
        receiver.close()


def test_an_answer_is_its_status_and_a_redirect_is_not_followed() -> None:
    receiver = Receiver(free_port(), statuses=[204, 302, 503]).up()
    try:
        answers = [
            ended(lambda: http.post(receiver.url, b'{"a":1}', {"content-type": "application/json"}, DEADLINE))
            for _ in range(3)
        ]
    finally:
        receiver.down()
    assert answers == [204, 302, 503]
    assert [body for _, body, _ in receiver.requests] == [b'{"a":1}'] * 3


def test_a_refused_connection_raises() -> None:
    outcome = ended(lambda: http.post(f"http://127.0.0.1:{free_port()}/x", b"{}", {}, DEADLINE))
    assert isinstance(outcome, ConnectionRefusedError), outcome
