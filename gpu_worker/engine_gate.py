"""The worker's gate in front of the engine: a careful chunk's lines are alone in the engine
(docs/reliability.md, "Poison isolation")."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager


class EngineGate:
    """Shared by the chunks of one worker: normal lines go to the engine together (``shared``);
    a careful chunk's line goes alone (``exclusive``: it waits until no other line is in the
    engine and holds new ones back), so when it crashes the engine no innocent line is in flight
    with it. Waiting exclusive holders go first (no starvation).

    ``down``: a line met ``EngineDown`` since the engine was last healthy (the loop clears it). A
    line that enters the engine while it is down and meets ``EngineDown`` never ran on a live
    engine: that is a benign end of its chunk's attempt, not a real failure."""

    def __init__(self) -> None:
        self.down = False
        self._cond = asyncio.Condition()
        self._shared = 0
        self._exclusive = False
        self._waiting = 0

    @asynccontextmanager
    async def shared(self) -> AsyncIterator[None]:
        async with self._cond:
            await self._cond.wait_for(lambda: not self._exclusive and not self._waiting)
            self._shared += 1
        try:
            yield
        finally:
            async with self._cond:
                self._shared -= 1
                self._cond.notify_all()

    @asynccontextmanager
    async def exclusive(self) -> AsyncIterator[None]:
        async with self._cond:
            self._waiting += 1
            try:
                await self._cond.wait_for(lambda: not self._exclusive and not self._shared)
            finally:
                self._waiting -= 1
            self._exclusive = True
        try:
            yield
        finally:
            async with self._cond:
                self._exclusive = False
                self._cond.notify_all()
