"""What handlers build once per process: settings, stores and other per-process objects.
Logic gets them as arguments."""

import time
from collections.abc import Callable
from functools import cache
from typing import Any, TypeVar, cast

from . import clients
from .aws import stores_from_settings
from .ports import Stores
from .settings import Settings, current

F = TypeVar("F", bound=Callable[..., Any])
_caches: list[Any] = []


def per_process(factory: F) -> F:
    """Build once per process (like module-level Lambda init), forgotten by ``reset()``."""
    cached = cache(factory)
    _caches.append(cached)
    return cast(F, cached)  # the cache wrapper takes and returns what the factory does


def settings() -> Settings:
    return current()


@per_process
def stores() -> Stores:
    return stores_from_settings(current())


#: A clock: the current time in unix seconds.
Clock = Callable[[], int]


def wall_clock() -> int:
    return int(time.time())


_clock: list[Clock] = [wall_clock]


def now() -> int:
    """The current time by the process's clock; handlers take time only from here (``use_clock``
    replaces the clock)."""
    return _clock[0]()


def use_clock(fn: Clock | None) -> None:
    """Make ``fn`` the process's clock (None: the wall clock again). Tests inject theirs here."""
    _clock[0] = fn or wall_clock


def reset() -> None:
    """Forget everything cached (tests and the local deployment call this after changing env)."""
    current.cache_clear()
    for cached in _caches:
        cached.cache_clear()
    clients.reset()
