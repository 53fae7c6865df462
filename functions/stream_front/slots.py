"""How many streamed uploads one process serves at once, in all and per tenant: memory and threads
are bounded by the process's slots, and one tenant's slow or many uploads hold only its share."""

import threading
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager

from functions.core import limits
from functions.core.errors import RateLimited, Throttled

#: What a refused request is told to wait before it tries again.
RETRY_AFTER_SECONDS = 1


class Slots:
    def __init__(self, total: int = limits.STREAM_MAX_UPLOADS, per_tenant: int = limits.STREAM_MAX_UPLOADS_PER_TENANT):
        self._total, self._per_tenant = total, per_tenant
        self._held: Counter[str] = Counter()
        self._lock = threading.Lock()

    @contextmanager
    def hold(self, tenant: str) -> Iterator[None]:
        """One slot for ``tenant`` while the block runs. RateLimited (429) when the tenant holds
        its share; Throttled (503) when the process is full. Neither waits."""
        with self._lock:
            if self._held[tenant] >= self._per_tenant:
                raise RateLimited(
                    f"This organization has {self._per_tenant} uploads in progress; "
                    "wait for one to finish and try again.",
                    retry_after=RETRY_AFTER_SECONDS,
                )
            if self._held.total() >= self._total:
                raise Throttled("The server is handling too many uploads; try again shortly.")
            self._held[tenant] += 1
        try:
            yield
        finally:
            with self._lock:
                self._held[tenant] -= 1
                if not self._held[tenant]:
                    del self._held[tenant]

    def held(self, tenant: str | None = None) -> int:
        with self._lock:
            return self._held.total() if tenant is None else self._held[tenant]
