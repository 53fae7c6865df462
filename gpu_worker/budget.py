"""``budget_action="stop"`` in the worker (docs/governance.md, "Token budgets"): once a tenant's
charged output or input tokens reach a budget, the lines of its running batches that have not
entered the engine yet are not sent; each becomes a ``budget_exceeded`` error line.

The work message carries the budgets (``WorkMessage.budget_stop``) and their period, as ingest saw the
policy, so the worker reads no policy: only the period's budget item (``BatchStore.budget_used``,
one GetItem), at most once per ``every`` seconds per (tenant, period) for the whole worker, however
many of the tenant's chunks are open. Between two reads a tenant may overrun its budget by what
the engine generates in that time plus the lines already in the engine (they finish and are
charged): the bound is stated in docs/governance.md.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from functions.core import tenants
from functions.core.budgets import Spent
from functions.core.messages import WorkMessage
from functions.core.ports import Stores

#: How long a read of a tenant's budget item stands.
BUDGET_READ_SECONDS = 5.0


@dataclass
class _Reading:
    used: Spent
    read_at: float


class BudgetWatch:
    """Shared by a worker's chunks. ``stop_reason(message)``: None while the message's batch may
    run lines, else the error message of a line that must not run."""

    def __init__(
        self,
        stores: Stores,
        io: Callable[..., Awaitable[Any]],
        *,
        now: Callable[[], float] = time.time,
        every: float = BUDGET_READ_SECONDS,
    ):
        self.stores, self.io, self.now, self.every = stores, io, now, every
        self._readings: dict[tuple[str, str], _Reading] = {}
        self._locks: dict[tuple[str, str], asyncio.Lock] = {}
        self.reads = 0

    async def stop_reason(self, message: WorkMessage) -> str | None:
        if message.budget_stop is None or message.budget_period is None:
            return None
        key = (message.tenant, tenants.budget_sk(message.budget_period, int(self.now())))
        reading = self._readings.get(key)
        if reading is None or self.now() - reading.read_at >= self.every:
            async with self._locks.setdefault(key, asyncio.Lock()):  # one read at a time per item
                reading = self._readings.get(key)
                if reading is None or self.now() - reading.read_at >= self.every:
                    used = await self.io(self.stores.batches.budget_used, *key)
                    self.reads += 1
                    reading = self._readings[key] = _Reading(used, self.now())
        kind = message.budget_stop.reached(reading.used)
        return None if kind is None else tenants.budget_line_message(message.budget_stop, kind, message.budget_period)
