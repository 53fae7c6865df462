"""moto's server finds the backend of every request by host anew: it lists moto's modules on disk
and tries its few hundred URL patterns in turn (0.25-0.65 ms a request on this machine, a few per
cent of a local request's CPU, on the cores the engines share). The answer depends on the host
alone, so the local deployment remembers it per host (``install``): the same backend, found once.
"""

from __future__ import annotations

import functools
from typing import Any

from moto.moto_server.werkzeug_app import DomainDispatcherApplication

_installed = False


def install() -> None:
    """Remember each host's backend in every dispatcher (idempotent)."""
    global _installed
    if _installed:
        return
    find = DomainDispatcherApplication.get_backend_for_host

    @functools.wraps(find)
    def remembered(self: DomainDispatcherApplication, host: str | None) -> Any:
        found: dict[str | None, Any] = self.__dict__.setdefault("_backends_by_host", {})
        if host not in found:
            found[host] = find(self, host)
        return found[host]

    DomainDispatcherApplication.get_backend_for_host = remembered  # type: ignore[method-assign]  # moto's, patched for the local server only
    _installed = True
