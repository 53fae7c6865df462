"""SQS fair queues for the local deployment's moto (which stores ``MessageGroupId`` on a standard
queue but receives strictly by arrival, as if no group were set).

What AWS documents ("How Amazon SQS fair queues work",
https://docs.aws.amazon.com/AWSSimpleQueueService/latest/SQSDeveloperGuide/sqs-fair-queues-detailed.html):
a tenant is a ``MessageGroupId`` (a message without one is its own tenant); SQS measures each
tenant's share of the queue's in-flight messages, and when one tenant takes a disproportionate
share it delivers the quiet tenants' messages first; messages of one group are still received in
parallel (no FIFO locking on a standard queue).

What this emulates: on every receive from a standard queue, the visible messages are offered in
order of their group's in-flight count at that moment (fewest first), by arrival within a count.
So a tenant with nothing in flight is served before one that holds messages.

What it simplifies: AWS only reorders once it has detected a noisy neighbour (a share threshold
and a backlog, measured over time, with its own dwell-time measure); this prefers the quieter group
on every receive, at once. It does not change FIFO queues, visibility, delays or redrive.
"""

from collections import Counter
from collections.abc import Iterable
from typing import Any

from moto.sqs import models

#: moto's own property, which its type hints show as a plain method.
_original: Any = models.Queue.messages


def fair_order(visible: Iterable[Any], in_flight: Counter[str]) -> list[Any]:
    """``visible`` (in arrival order) by their group's in-flight count, fewest first; a message
    without a group is its own tenant (nothing in flight). Stable: arrival order within a count."""
    return sorted(visible, key=lambda m: in_flight[m.group_id] if m.group_id else 0)


def _fair_messages(queue: Any) -> list[Any]:
    visible = _original.fget(queue)
    if queue.fifo_queue or len(visible) < 2:
        return visible
    in_flight = Counter(m.group_id for m in queue._messages if m.group_id and not m.visible and not m.delayed)
    return fair_order(visible, in_flight)


def install(enabled: bool = True) -> None:
    """Make moto's standard queues (in this process) receive as fair queues (or, ``enabled``
    False, by arrival again, as moto does)."""
    # A property over what moto's type hints show as a method.
    models.Queue.messages = property(_fair_messages) if enabled else _original  # type: ignore[assignment]


def installed() -> bool:
    return models.Queue.messages is not _original
