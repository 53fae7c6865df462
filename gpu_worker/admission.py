"""Which waiting line enters the engine next, across every chunk a worker has open: the order
(``file`` or ``smart``: longest expected output first, shared prefixes together), fair share
across tenants, the capacity the engine may hold, and each line's place in the engine's own
queue (``FairTags``: vLLM's ``priority``) (docs/worker.md, "Order of lines in the engine";
docs/governance.md, "Fair share")."""

from __future__ import annotations

import asyncio
import hashlib
import heapq
import itertools
import json
import math
from collections import Counter
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from functions.core import work

#: The worker's orders of admission into the engine (``WorkerConfig.order``).
ORDER_FILE, ORDER_SMART = "file", "smart"
#: How much of a prompt's text names its prefix group when it is one string (completions,
#: responses, embeddings); chat uses its whole first message.
PREFIX_CHARS = 512
#: Expected output of a line that sets no output limit: it runs until the context ends.
UNBOUNDED_OUTPUT = math.inf
#: The body fields that cap a line's output tokens, of every endpoint (the first present wins).
OUTPUT_LIMIT_FIELDS = tuple(dict.fromkeys(name for names in work.OUTPUT_LIMIT_FIELDS.values() for name in names))


def expected_output(body: dict[str, Any]) -> float:
    """The most output tokens a line may produce (its own limit; unbounded without one)."""
    for name in OUTPUT_LIMIT_FIELDS:
        value = body.get(name)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return float(value)
    return UNBOUNDED_OUTPUT


def length_class(tokens: float) -> float:
    """Output limits within a factor of two are one class (so prefix groups are not split by
    small differences); larger classes go first."""
    return tokens if tokens == UNBOUNDED_OUTPUT else float(int(math.log2(max(1.0, tokens))))


def prefix_of(body: dict[str, Any]) -> str | None:
    """The text a line's prompt starts with, as far as lines sharing it share the engine's
    prefix cache: chat's first message, else the first ``PREFIX_CHARS`` of the prompt/input."""
    messages = body.get("messages")
    if isinstance(messages, list) and messages:
        return json.dumps(messages[0], sort_keys=True, separators=(",", ":"))
    for name in ("prompt", "input"):
        value = body.get(name)
        if isinstance(value, list) and value:
            value = value[0]
        if isinstance(value, str):
            return value[:PREFIX_CHARS]
        if value is not None:
            return json.dumps(value, sort_keys=True, separators=(",", ":"))[:PREFIX_CHARS]
    return None


class FairTags:
    """Each line's place in the engine's waiting queue, for an engine that schedules by priority
    (vLLM ``--scheduling-policy priority``: lower first, equal ones by arrival). Start-time fair
    queueing: a tenant's next line is tagged one past the larger of its own last tag and the
    oldest tag still in the engine, so the lines of a tenant that just arrived go ahead of the lines
    another tenant already has waiting there (never ahead of what runs), and two busy tenants'
    lines interleave. A tenant earns nothing by being idle (its tags restart at the oldest in the
    engine), and sets none of its own (``shaping`` removes a line's ``priority``)."""

    #: Tenants remembered; past this, the ones whose last tag is older than the engine's oldest
    #: (they would restart there anyway) are forgotten.
    MAX_TENANTS = 4096

    def __init__(self) -> None:
        self._last: dict[object, int] = {}
        self._open: list[int] = []  # a heap of the tags in the engine (closed ones removed lazily)
        self._closed: Counter[int] = Counter()
        self._high = 0  # the highest tag given

    def floor(self) -> int:
        """The oldest tag in the engine (the highest given, when none is)."""
        while self._open and self._closed[self._open[0]]:
            tag = heapq.heappop(self._open)
            self._closed[tag] -= 1
            if not self._closed[tag]:
                del self._closed[tag]
        return self._open[0] if self._open else self._high

    def open(self, tenant: object) -> int:
        """The tag of ``tenant``'s next line, now entering the engine."""
        floor = self.floor()
        if len(self._last) >= self.MAX_TENANTS:
            self._last = {t: tag for t, tag in self._last.items() if tag > floor}
        tag = max(self._last.get(tenant, 0), floor) + 1
        self._last[tenant] = tag
        self._high = max(self._high, tag)
        heapq.heappush(self._open, tag)
        return tag

    def close(self, tag: int) -> None:
        """The line tagged ``tag`` left the engine (answered, failed or given up)."""
        self._closed[tag] += 1


class Admission:
    """Which waiting line enters the engine next, across every chunk the worker has open: at
    most ``capacity`` lines in flight (the engine client's cap, so its own semaphore never
    queues), the rest wait here.

    ``file`` order: first come, first in (the chunks' input order, as they arrived).
    ``smart`` order (docs/worker.md, "Order of lines in the engine"): the longest expected
    output first (``expected_output``, by ``length_class``), so the batch's tail is short; within
    a class, a line whose prefix (``prefix_of``) an earlier line had enters right behind that
    line's group, so lines sharing a system prompt are in the engine together and hit vLLM's
    prefix cache (a group is one tenant's: lines of two tenants never share cache blocks, their
    salts differ, ``shaping``); otherwise arrival order. Results are unaffected: each chunk still writes its
    lines in input order (``run_ordered``). ``waiting_for(owner)``: lines of one chunk waiting."""

    #: Prefix groups remembered (their first line's arrival number); forgotten all at once beyond.
    MAX_GROUPS = 65_536

    def __init__(self, capacity: int, order: str = ORDER_FILE, *, reserve: int = 0, tags: FairTags | None = None):
        """``reserve``: lines that may enter beyond ``capacity`` at once when they come from a
        tenant holding fewer lines than another (``fair_slot``'s first rank) and no such line waits
        already: a tenant that just arrived is not held back by the lines a big batch filled the
        capacity with. ``tags``: each line's priority in the engine (None: the engine's own
        first-come order)."""
        if order not in (ORDER_FILE, ORDER_SMART):
            raise ValueError(f"order must be {ORDER_FILE!r} or {ORDER_SMART!r}, not {order!r}")
        self.capacity, self.order = max(1, capacity), order
        self.reserve, self.tags = max(0, reserve), tags
        self.in_flight = 0
        self._heap: list[tuple[tuple[float, ...], asyncio.Future[None]]] = []
        self._arrivals = itertools.count()
        self._groups: dict[bytes, int] = {}
        self._waiting: Counter[object] = Counter()
        #: Lines each group (tenant) holds here, waiting or in the engine (``fair_slot``).
        self._held: dict[object, int] = {}

    @property
    def waiting(self) -> int:
        return sum(self._waiting.values())

    def waiting_for(self, owner: object) -> int:
        return self._waiting.get(owner, 0)

    def key(self, body: dict[str, Any], tenant: object = None) -> tuple[float, ...]:
        """The line's place in the order (smaller enters first); unique (its arrival last).
        ``tenant``'s lines form their own prefix groups."""
        arrival = next(self._arrivals)
        if self.order == ORDER_FILE:
            return (arrival,)
        group = arrival
        prefix = prefix_of(body)
        if prefix is not None:
            digest = hashlib.blake2b(f"{tenant}\0{prefix}".encode(), digest_size=8).digest()
            if len(self._groups) >= self.MAX_GROUPS:
                self._groups.clear()
            group = self._groups.setdefault(digest, arrival)
        return (-length_class(expected_output(body)), group, arrival)

    @asynccontextmanager
    async def slot(
        self, body: dict[str, Any], owner: object = None, rank: int = 0, tenant: object = None
    ) -> AsyncIterator[None]:
        key = (rank, *self.key(body, tenant))
        if (self.in_flight < self.capacity and not self._heap) or self._may_pass(rank):
            self.in_flight += 1
        else:
            ticket: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            heapq.heappush(self._heap, (key, ticket))
            self._waiting[owner] += 1
            try:
                await ticket  # set by _release: the slot it freed is ours
            except asyncio.CancelledError:
                if ticket.done() and not ticket.cancelled():
                    self._release()  # handed a slot we will not use: hand it on
                raise
            finally:
                self._waiting[owner] -= 1
                if not self._waiting[owner]:
                    del self._waiting[owner]
        try:
            yield
        finally:
            self._release()

    def _may_pass(self, rank: int) -> bool:
        """A first-rank line enters within the reserve, unless first-rank lines already wait."""
        return (
            rank == 0
            and self.in_flight < self.capacity + self.reserve
            and not (self._heap and self._heap[0][0][0] == 0)
        )

    @asynccontextmanager
    async def fair_slot(
        self, body: dict[str, Any], owner: object = None, group: object = None
    ) -> AsyncIterator[int | None]:
        """``slot`` with fair share across groups (tenants; docs/governance.md "Fair share"): a
        line of a group that holds (waiting or in the engine) fewer lines than another group
        enters before the waiting lines of groups that held the most when they came (and, within
        the ``reserve``, at once); within each of the two ranks the order is ``slot``'s. So a small
        tenant's lines never wait behind the lines a giant batch already has waiting in this
        worker; one tenant alone keeps its order. Yields the line's tag in the engine's queue
        (``FairTags``; None without tags)."""
        held = self._held.setdefault(group, 0)
        others = max((n for g, n in self._held.items() if g != group), default=0)
        rank = 0 if held < others else 1
        self._held[group] = held + 1
        try:
            async with self.slot(body, owner, rank=rank, tenant=group):
                if self.tags is None:
                    yield None
                else:
                    tag = self.tags.open(group)
                    try:
                        yield tag
                    finally:
                        self.tags.close(tag)
        finally:
            self._held[group] -= 1
            if not self._held[group]:
                del self._held[group]

    def resize(self, capacity: int) -> None:
        """A new capacity (``capacity.CapacityWatch``: what the engine runs, plus a headroom). Raised:
        waiting lines enter at once; lowered: lines in flight finish, and their slots are handed on
        only once in flight is under the new capacity."""
        self.capacity = max(1, capacity)
        while self.in_flight < self.capacity and self._hand_on():
            self.in_flight += 1

    def _hand_on(self) -> bool:
        """Give a slot to the first waiting line; False if none waits."""
        while self._heap:
            _, ticket = heapq.heappop(self._heap)
            if not ticket.done():  # a cancelled waiter's ticket is done
                ticket.set_result(None)
                return True
        return False

    def _release(self) -> None:
        if self.in_flight > self.capacity or not self._hand_on():
            self.in_flight -= 1
