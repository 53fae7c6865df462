"""A chunk's way into the engine: through the worker's gate and admission, with its budget's stop
checked before a line is sent."""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

from functions.core import tenants
from functions.core.ports import Engine

from .admission import Admission
from .engine_client import EngineDown, Reply
from .engine_gate import EngineGate
from .shaping import PRIORITY_FIELD


class GatedEngine:
    """An ``Engine`` whose posts pass the gate: shared, or (``held``) under the exclusive hold
    its caller took for a careful group. ``died_in_flight``: a line of this chunk was in the
    engine, while it was up, when it died. Shared posts enter the engine through ``admission``
    (the worker's order); a careful group's lines are alone in the engine and go straight in.
    ``first_sent_at``/``last_answer_at``: when this chunk's first line entered the engine and
    its last answer came (clock seconds; None before). ``stop``: why a line must not enter the
    engine now (None: it may), asked once the line has its slot (``BudgetWatch``); such a line is
    answered with that reason as a ``budget_exceeded`` error, never sent."""

    def __init__(
        self,
        engine: Engine,
        gate: EngineGate,
        *,
        held: bool,
        admission: Admission | None = None,
        owner: object = None,
        now: Callable[[], float] = time.time,
        group: object = None,
        stop: Callable[[], Awaitable[str | None]] | None = None,
    ):
        self._engine, self._gate, self._held = engine, gate, held
        self._admission, self._owner, self._now = admission, owner, now
        self._group = group  # the tenant (Admission's fair share)
        self._stop = stop
        self.died_in_flight = False
        self.first_sent_at: float | None = None
        self.last_answer_at: float | None = None

    @asynccontextmanager
    async def _admitted(self, body: dict[str, Any]) -> AsyncIterator[int | None]:
        """Through the admission; yields the line's place in the engine's queue when the
        admission tags lines (``admission.FairTags``), else None."""
        if self._held or self._admission is None:
            yield None
        else:
            async with self._admission.fair_slot(body, self._owner, self._group) as tag:
                yield tag

    async def healthy(self) -> bool:
        return await self._engine.healthy()

    async def wait_healthy(self, timeout: float, interval: float = 1.0) -> float:
        return await self._engine.wait_healthy(timeout, interval)

    async def post(self, path: str, body: dict[str, Any]) -> Any:
        """A JSON line, sent with its tag as its ``priority`` when the admission tags lines."""
        return await self._through(
            body, lambda tag: self._engine.post(path, body if tag is None else {**body, PRIORITY_FIELD: tag})
        )

    async def post_form(self, path: str, fields: list[tuple[str, str]], files: list[tuple[str, str, bytes]]) -> Any:
        """An audio line: admitted by its body fields (its audio is no prompt to weigh); vLLM's
        transcription form takes no priority."""
        return await self._through(dict(fields), lambda _tag: self._engine.post_form(path, fields, files))

    async def _through(self, body: dict[str, Any], send: Callable[[int | None], Awaitable[Any]]) -> Any:
        async with contextlib.nullcontext() if self._held else self._gate.shared(), self._admitted(body) as tag:
            if self._stop is not None and (why := await self._stop()) is not None:
                return Reply(None, None, "", 0, tenants.BUDGET_EXCEEDED, why)
            entered_down = self._gate.down
            if self.first_sent_at is None:
                self.first_sent_at = self._now()
            try:
                reply = await send(tag)
            except EngineDown:
                self._gate.down = True  # before the gate lets the next line in
                self.died_in_flight |= not entered_down
                raise
            self.last_answer_at = self._now()
            return reply


class ChunkEngines:
    """A chunk's two ways into the engine: ``together`` (beside other chunks' lines, through the
    worker's ``admission``; ``owner`` names this chunk's waiting lines there, ``tenant`` its fair
    share) and ``alone`` (a careful group's, inside ``exclusive()``: no other chunk's line is in
    the engine with it). ``stop``: the budget's, asked before any line is sent."""

    def __init__(
        self,
        engine: Engine,
        gate: EngineGate,
        *,
        admission: Admission | None,
        owner: object,
        tenant: object,
        now: Callable[[], float],
        stop: Callable[[], Awaitable[str | None]] | None,
    ):
        self.gate = gate
        self.alone = GatedEngine(engine, gate, held=True, now=now, stop=stop)
        self.together = GatedEngine(
            engine, gate, held=False, admission=admission, owner=owner, now=now, group=tenant, stop=stop
        )

    def exclusive(self) -> contextlib.AbstractAsyncContextManager[None]:
        return self.gate.exclusive()

    @property
    def died_in_flight(self) -> bool:
        """A line of this chunk was in the engine, while it was up, when it died."""
        return self.alone.died_in_flight or self.together.died_in_flight

    @property
    def first_sent_at(self) -> float | None:
        return min((t for t in (self.alone.first_sent_at, self.together.first_sent_at) if t is not None), default=None)

    @property
    def last_answer_at(self) -> float | None:
        return max(
            (t for t in (self.alone.last_answer_at, self.together.last_answer_at) if t is not None), default=None
        )
