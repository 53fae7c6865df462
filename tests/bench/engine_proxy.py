"""A timestamping HTTP proxy between a worker and its engine, for the benchmarks: forwards every
request as is (method, path, query, headers, body) and records, for each ``POST /v1/...``, when it
arrived and when its answer went back (``time.monotonic()`` of this process). It runs on its own
asyncio loop in a thread: ``with EngineProxy(engine_url) as proxy: ... proxy.url ... proxy.window(since)``.

Its cost: one more loopback hop per request (the request and answer bodies are read whole, which
is what the worker does too); it measures where the time goes, it is not in the tok/s comparison's
favour.
"""

from __future__ import annotations

import asyncio
import threading
import time
from dataclasses import dataclass

import aiohttp
from aiohttp import web

from tests.helpers import free_port

#: Headers that belong to one hop (RFC 9110 7.6.1) or that aiohttp recomputes for the new body.
_HOP = {
    "connection",
    "keep-alive",
    "transfer-encoding",
    "content-length",
    "content-encoding",
    "host",
    "upgrade",
    "proxy-connection",
    "te",
    "trailer",
}


@dataclass(frozen=True)
class Exchange:
    path: str
    arrived: float
    answered: float
    status: int


@dataclass(frozen=True)
class Window:
    """The engine requests of one run: first arrival, last answer, how many."""

    first_request: float
    last_answer: float
    requests: int


class EngineProxy:
    def __init__(self, engine_url: str, port: int | None = None):
        self.engine_url = engine_url.rstrip("/")
        self.port = port or free_port()
        self.exchanges: list[Exchange] = []
        self._lock = threading.Lock()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="engine-proxy", daemon=True)
        self._runner: web.AppRunner | None = None
        self._session: aiohttp.ClientSession | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def window(self, since: float) -> Window | None:
        """The ``POST /v1/...`` exchanges that arrived at or after ``since`` (None if none did)."""
        with self._lock:
            mine = [e for e in self.exchanges if e.arrived >= since]
        if not mine:
            return None
        return Window(min(e.arrived for e in mine), max(e.answered for e in mine), len(mine))

    async def _forward(self, request: web.Request) -> web.StreamResponse:
        arrived = time.monotonic()
        assert self._session is not None
        body = await request.read()
        headers = {k: v for k, v in request.headers.items() if k.lower() not in _HOP}
        async with self._session.request(
            request.method, self.engine_url + request.rel_url.path_qs, data=body, headers=headers
        ) as upstream:
            payload = await upstream.read()
            status = upstream.status
            out = {k: v for k, v in upstream.headers.items() if k.lower() not in _HOP}
        response = web.Response(body=payload, status=status, headers=out)
        await response.prepare(request)
        await response.write_eof()
        if request.method == "POST" and request.path.startswith("/v1/"):
            with self._lock:
                self.exchanges.append(Exchange(request.path, arrived, time.monotonic(), status))
        return response

    async def _start(self) -> None:
        self._session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=0),
            timeout=aiohttp.ClientTimeout(total=None),
            trust_env=False,
        )
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_route("*", "/{tail:.*}", self._forward)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        await web.TCPSite(self._runner, "127.0.0.1", self.port).start()

    async def _stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
        if self._session is not None:
            await self._session.close()

    def __enter__(self) -> EngineProxy:
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._start(), self._loop).result(30)
        return self

    def __exit__(self, *_: object) -> None:
        asyncio.run_coroutine_threadsafe(self._stop(), self._loop).result(30)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
