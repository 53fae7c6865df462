"""EventBridge: the ``Events`` port."""

import json
from typing import Any

from ..errors import Throttled
from ..names import EVENT_SOURCE
from .errors import translate


class EventBridge:
    """Publishes batch lifecycle events to EventBridge."""

    SOURCE = EVENT_SOURCE

    def __init__(self, events: Any, bus: str):
        self._events = events
        self._bus = bus

    def publish(self, detail_type: str, detail: dict[str, Any]) -> None:
        with translate():
            resp = self._events.put_events(
                Entries=[
                    {
                        "Source": self.SOURCE,
                        "DetailType": detail_type,
                        "Detail": json.dumps(detail),
                        "EventBusName": self._bus,
                    }
                ]
            )
        if resp.get("FailedEntryCount"):
            raise Throttled(f"EventBridge refused the event: {resp['Entries']}")
