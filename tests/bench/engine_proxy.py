"""A timestamping TCP proxy between a worker and its engine, for the benchmarks: it copies bytes
both ways without parsing HTTP beyond each request's first line and each answer's status line, and
records, for each ``POST /v1/...``, when it arrived and when the last byte of its answer went back
(``time.monotonic()`` of this process). It runs on its own asyncio loop in a thread:
``with EngineProxy(engine_url) as proxy: ... proxy.url ... proxy.window(since)``.

Each client connection gets its own engine connection, so the worker's keep-alive pool is the
engine's. HTTP/1.1 clients do not pipeline (the worker's engine client, gpu_worker/engine_http.py,
does not), so on one connection a request's bytes start only after the previous answer's last
byte: the first bytes from the client after any bytes from the engine begin the next exchange.

Its cost is one more loopback hop per request, on the engine's cores and against the pipeline:
0.045-0.061 CPU-seconds per 1,000 requests here (2,000 POSTs, 64 at a time, to an engine in another
process), where a proxy that parsed and rebuilt each request and answer (aiohttp's server and
client) took 0.28-0.34.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from urllib.parse import urlsplit

from tests.helpers import free_port


@dataclass
class Exchange:
    method: str
    path: str
    arrived: float
    answered: float  # the answer's last byte so far
    status: int


@dataclass(frozen=True)
class Window:
    """The engine requests of one run: first arrival, last answer, how many; and how many times the
    worker read the engine's ``GET /metrics`` between the two."""

    first_request: float
    last_answer: float
    requests: int
    metrics_reads: int = 0


class _Exchanges:
    """One client connection's exchanges as its bytes go by; a ``POST /v1/...`` is recorded at its
    answer's first byte and its ``answered`` moves with every byte after."""

    def __init__(self, record: list[Exchange], lock: threading.Lock, metrics_reads: list[float]):
        self._record = record
        self._metrics_reads = metrics_reads
        self._lock = lock
        self._request = b""  # the open exchange's first bytes, until its request line is whole
        self._arrived: float | None = None
        self._answering = False
        self._exchange: Exchange | None = None

    def from_client(self, data: bytes, now: float) -> None:
        if self._answering:  # a request after an answer: the previous exchange is over
            self._request, self._arrived, self._answering, self._exchange = b"", None, False, None
        if self._arrived is None:
            self._arrived = now
        if b"\r\n" not in self._request:
            self._request += data[:8192]

    def from_engine(self, data: bytes, now: float) -> None:
        if self._answering:
            if self._exchange is not None:
                self._exchange.answered = now
            return
        self._answering = True
        method, _, rest = self._request.partition(b" ")
        path = rest.partition(b" ")[0].partition(b"?")[0].decode("latin-1")
        if method == b"GET" and path in ("/metrics", "/metrics/"):
            with self._lock:
                self._metrics_reads.append(now)
        if self._arrived is None or method != b"POST" or not path.startswith("/v1/"):
            return
        status = data.split(b" ", 2)  # "HTTP/1.1 200 OK"
        code = int(status[1]) if data.startswith(b"HTTP/") and len(status) > 1 and status[1].isdigit() else 0
        self._exchange = Exchange("POST", path, self._arrived, now, code)
        with self._lock:
            self._record.append(self._exchange)


class _Half(asyncio.Protocol):
    """One side of a spliced connection: what it receives goes to ``peer``'s transport."""

    def __init__(self, on_data: Callable[[bytes, float], None], on_connect: Callable[[], None] | None = None):
        self.on_data = on_data
        self.on_connect = on_connect
        self.transport: asyncio.Transport | None = None
        self.peer: _Half | None = None
        self._pending: list[bytes] = []  # bytes that came before the peer connected

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        if self.on_connect is not None:
            self.on_connect()

    def data_received(self, data: bytes) -> None:
        self.on_data(data, time.monotonic())
        if self.peer is not None and self.peer.transport is not None:
            self.peer.transport.write(data)
        else:
            self._pending.append(data)

    def attach(self, peer: _Half) -> None:
        self.peer = peer
        assert peer.transport is not None
        for data in self._pending:
            peer.transport.write(data)
        self._pending.clear()

    # Flow control: when the peer cannot take more, stop reading this side.
    def pause_writing(self) -> None:
        if self.peer is not None and self.peer.transport is not None:
            self.peer.transport.pause_reading()

    def resume_writing(self) -> None:
        if self.peer is not None and self.peer.transport is not None:
            self.peer.transport.resume_reading()

    def eof_received(self) -> bool:
        if self.peer is not None and self.peer.transport is not None and self.peer.transport.can_write_eof():
            self.peer.transport.write_eof()
        return True  # keep the other direction open until the peer closes too

    def connection_lost(self, exc: Exception | None) -> None:
        if self.peer is not None and self.peer.transport is not None:
            self.peer.transport.close()


class EngineProxy:
    def __init__(self, engine_url: str, port: int | None = None):
        engine = urlsplit(engine_url)
        assert engine.hostname is not None and engine.port is not None, engine_url
        self._engine = (engine.hostname, engine.port)
        self.port = port or free_port()
        self.exchanges: list[Exchange] = []
        self.metrics_reads: list[float] = []  # when each GET /metrics was answered
        self._lock = threading.Lock()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="engine-proxy", daemon=True)
        self._server: asyncio.Server | None = None
        self._accepting: set[asyncio.Task] = set()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def window(self, since: float) -> Window | None:
        """The ``POST /v1/...`` exchanges that arrived at or after ``since`` (None if none did)."""
        mine = self._since(since)
        if not mine:
            return None
        first, last = min(e.arrived for e in mine), max(e.answered for e in mine)
        with self._lock:
            reads = sum(1 for t in self.metrics_reads if first <= t <= last)
        return Window(first, last, len(mine), reads)

    def arrivals(self, since: float) -> list[float]:
        """When each ``POST /v1/...`` that arrived at or after ``since`` arrived, in order."""
        return sorted(e.arrived for e in self._since(since))

    def _since(self, since: float) -> list[Exchange]:
        with self._lock:
            return [e for e in self.exchanges if e.arrived >= since]

    async def _accept(self, client: _Half, exchanges: _Exchanges) -> None:
        engine = _Half(exchanges.from_engine)
        try:
            await self._loop.create_connection(lambda: engine, *self._engine)
        except OSError:
            assert client.transport is not None
            client.transport.close()
            return
        assert client.transport is not None and engine.transport is not None
        if client.transport.is_closing():  # the client left while the engine connection opened
            engine.transport.close()
            return
        engine.attach(client)
        client.attach(engine)

    def _client(self) -> _Half:
        exchanges = _Exchanges(self.exchanges, self._lock, self.metrics_reads)

        def accept() -> None:
            task = self._loop.create_task(self._accept(client, exchanges))
            self._accepting.add(task)  # the loop keeps only a weak reference to a task
            task.add_done_callback(self._accepting.discard)

        client = _Half(exchanges.from_client, accept)
        return client

    def __enter__(self) -> EngineProxy:
        self._thread.start()

        async def start() -> asyncio.Server:
            return await self._loop.create_server(self._client, "127.0.0.1", self.port)

        self._server = asyncio.run_coroutine_threadsafe(start(), self._loop).result(30)
        return self

    def __exit__(self, *_: object) -> None:
        assert self._server is not None
        self._loop.call_soon_threadsafe(self._server.close)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
