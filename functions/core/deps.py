"""What handlers build once per process: settings, stores and other per-process objects.
Logic gets them as arguments."""

from collections.abc import Callable
from functools import cache
from typing import Any, TypeVar

from . import clients
from .settings import Settings, current
from .stores import Stores

F = TypeVar("F", bound=Callable[..., Any])
_caches: list[Any] = []


def per_process(factory: F) -> F:
    """Build once per process (like module-level Lambda init), forgotten by ``reset()``."""
    cached = cache(factory)
    _caches.append(cached)
    return cached  # type: ignore[return-value]


def settings() -> Settings:
    return current()


@per_process
def stores() -> Stores:
    return Stores.from_settings(current())


def reset() -> None:
    """Forget everything cached (tests and the local deployment call this after changing env)."""
    current.cache_clear()
    for cached in _caches:
        cached.cache_clear()
    clients.reset()
