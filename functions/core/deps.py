"""What handlers build once per process: settings and stores. Logic gets them as arguments."""

from functools import cache

from . import clients
from .settings import Settings, current
from .stores import Stores


def settings() -> Settings:
    return current()


@cache
def stores() -> Stores:
    return Stores.from_settings(current())


def reset() -> None:
    """Forget everything cached (tests and the local deployment call this after changing env)."""
    current.cache_clear()
    stores.cache_clear()
    clients.reset()
