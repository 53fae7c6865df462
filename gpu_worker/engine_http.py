"""A lean HTTP/1.1 client for the engine (``engine_client.EngineClient``'s transport): keep-alive
connections on asyncio protocols, one request at a time on each, answers read up to a bound.

Why not a general client: aiohttp's request machinery (URL building, header multidicts, cookies,
redirects, its stream reader and timers) was most of a short line's CPU, about 260 µs a request
against 55 µs here (docs/benchmarks.md, "Worker ceiling"). The worker needs little: POST and GET to
one server (vLLM's, on loopback), answers with a ``Content-Length``, chunked, or ending with the
connection, and every failure as one of three exceptions:

- ``TimeoutError``: no whole answer within the request's time (the connection is closed, so the
  engine aborts the request, as it does when any client goes away);
- ``EngineConnectionError``: the connection could not be made, or it ended (or the server spoke
  something that is not HTTP/1.x) before a whole answer came;
- ``AnswerTooLarge``: the answer is longer than ``max_body`` bytes (said by its
  ``Content-Length``, or found while reading it); at most ``max_body`` + one read is in memory.

A connection is reused only after a whole answer that did not ask to close it, and only if it
has been idle less than ``keepalive_seconds`` (shorter than uvicorn's 5 s, so the engine does not
close it just as it is reused; if it does, the request fails with ``EngineConnectionError`` and
the caller's retry sends it again).
"""

from __future__ import annotations

import asyncio
import ssl
import time
from dataclasses import dataclass
from typing import cast
from urllib.parse import urlsplit

MAX_HEAD_BYTES = 64 * 1024  # the most a status line and headers may take


class EngineConnectionError(ConnectionError):
    """The connection failed, or ended before a whole answer came."""


class AnswerTooLarge(Exception):
    """The answer is longer than the client reads (``status``: its status)."""

    def __init__(self, status: int, limit: int):
        super().__init__(f"{status} answer over {limit} bytes")
        self.status, self.limit = status, limit


@dataclass(frozen=True)
class Answer:
    status: int
    headers: dict[str, str]  # names lowercase (the last of repeated ones)
    body: bytes


class _Parser:
    """One answer, parsed as its bytes come (``feed``: the answer when it is whole, else None)."""

    def __init__(self, limit: int):
        self.limit = limit
        self.buffer = bytearray()
        self.status = 0
        self.headers: dict[str, str] = {}
        self.mode = ""  # "", then "length", "chunked" or "close"
        self.length = 0
        self.body = bytearray()
        self.keep_alive = True

    def feed(self, data: bytes) -> Answer | None:
        self.buffer += data
        if not self.mode and not self._head():
            return None
        if self.mode == "length":
            if len(self.buffer) < self.length:
                return None
            return self._done(bytes(self.buffer[: self.length]), whole=len(self.buffer) == self.length)
        if self.mode == "chunked":
            return self._chunks()
        self._grow(self.buffer)  # "close": everything until the connection ends
        self.buffer.clear()
        return None

    def at_close(self) -> Answer | None:
        """The answer if the connection's end completes it (one without a length)."""
        if self.mode != "close":
            return None
        self.keep_alive = False
        return Answer(self.status, self.headers, bytes(self.body))

    def _head(self) -> bool:
        while True:
            end = self.buffer.find(b"\r\n\r\n")
            if end < 0:
                if len(self.buffer) > MAX_HEAD_BYTES:
                    raise EngineConnectionError("the engine's answer has no end of its headers")
                return False
            lines = bytes(self.buffer[:end]).decode("latin-1").split("\r\n")
            del self.buffer[: end + 4]
            version, _, rest = lines[0].partition(" ")
            if not version.startswith("HTTP/1.") or not rest[:3].isdigit():
                raise EngineConnectionError("the engine did not answer HTTP/1.x")
            status = int(rest[:3])
            if 100 <= status < 200:
                continue  # an interim answer (100 Continue, 103 Early Hints): the real one follows
            headers: dict[str, str] = {}
            for line in lines[1:]:
                name, _, value = line.partition(":")
                headers[name.strip().lower()] = value.strip()
            self.status, self.headers = status, headers
            connection = headers.get("connection", "").lower()
            self.keep_alive = "close" not in connection and (version == "HTTP/1.1" or "keep-alive" in connection)
            self._body_mode()
            return True

    def _body_mode(self) -> None:
        headers = self.headers
        if "chunked" in headers.get("transfer-encoding", "").lower():
            self.mode = "chunked"
        elif "content-length" in headers:
            try:
                self.length = int(headers["content-length"])
            except ValueError:
                raise EngineConnectionError("the engine's answer has an invalid Content-Length") from None
            if self.length > self.limit:
                raise AnswerTooLarge(self.status, self.limit)
            self.mode = "length"
        elif self.status in (204, 304):
            self.mode, self.length = "length", 0
        else:
            self.mode = "close"

    def _chunks(self) -> Answer | None:
        buffer = self.buffer
        while True:
            line_end = buffer.find(b"\r\n")
            if line_end < 0:
                return None
            try:
                size = int(bytes(buffer[:line_end]).split(b";", 1)[0].strip(), 16)
            except ValueError:
                raise EngineConnectionError("the engine's chunked answer is malformed") from None
            if size == 0:  # the last chunk: then trailers, if any, and an empty line
                if buffer[line_end + 2 : line_end + 4] == b"\r\n":
                    end = line_end + 4
                elif (found := buffer.find(b"\r\n\r\n", line_end + 2)) >= 0:
                    end = found + 4
                else:
                    return None
                return self._done(bytes(self.body), whole=len(buffer) == end)
            if len(buffer) < line_end + 2 + size + 2:
                return None
            self._grow(buffer[line_end + 2 : line_end + 2 + size])
            del buffer[: line_end + 2 + size + 2]

    def _grow(self, piece: bytes | bytearray) -> None:
        self.body += piece
        if len(self.body) > self.limit:
            raise AnswerTooLarge(self.status, self.limit)

    def _done(self, body: bytes, *, whole: bool) -> Answer:
        self.keep_alive = self.keep_alive and whole  # bytes past the answer: not a connection to reuse
        return Answer(self.status, self.headers, body)


class _Connection(asyncio.Protocol):
    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self.idle_since = 0.0
        self._parser: _Parser | None = None
        self._waiter: asyncio.Future[Answer] | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass of it

    def send(self, data: bytes, limit: int, waiter: asyncio.Future[Answer]) -> None:
        assert self.transport is not None
        self._parser, self._waiter = _Parser(limit), waiter
        self.transport.write(data)

    def data_received(self, data: bytes) -> None:
        waiter, parser = self._waiter, self._parser
        if waiter is None or parser is None or waiter.done():
            self.close()  # bytes nobody asked for: this connection cannot be trusted any more
            return
        try:
            answer = parser.feed(data)
        except (EngineConnectionError, AnswerTooLarge) as exc:
            self.close()
            waiter.set_exception(exc)
            return
        if answer is not None:
            self._waiter = self._parser = None
            if not parser.keep_alive:
                self.close()
            waiter.set_result(answer)

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        waiter, parser, self._waiter, self._parser = self._waiter, self._parser, None, None
        if waiter is None or waiter.done():
            return
        answer = parser.at_close() if parser is not None else None
        if answer is not None:
            waiter.set_result(answer)
        else:
            waiter.set_exception(EngineConnectionError(f"the engine closed the connection ({type(exc).__name__})"))

    def close(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.close()


class EngineHttp:
    """``request`` to ``base_url`` (http or https, with any path prefix) over a pool of keep-alive
    connections. ``close()`` closes every connection."""

    def __init__(
        self,
        base_url: str,
        *,
        connect_timeout: float,
        keepalive_seconds: float = 3.0,
    ):
        parts = urlsplit(base_url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"the engine URL must be http(s)://host[:port], not {base_url!r}")
        self.host = parts.hostname
        self.port = parts.port or (443 if parts.scheme == "https" else 80)
        self.prefix = parts.path.rstrip("/")
        self._ssl = ssl.create_default_context() if parts.scheme == "https" else None
        self._host_header = parts.netloc.rsplit("@", 1)[-1]
        self.connect_timeout, self.keepalive_seconds = connect_timeout, keepalive_seconds
        self._idle: list[_Connection] = []
        self._all: set[_Connection] = set()

    async def request(
        self,
        method: str,
        path: str,
        *,
        timeout: float,
        limit: int,
        body: bytes = b"",
        headers: dict[str, str] | None = None,
    ) -> Answer:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        connection = await self._connection(deadline)
        head = f"{method} {self.prefix}{path} HTTP/1.1\r\nHost: {self._host_header}\r\n"
        if headers:
            head += "".join(f"{name}: {value}\r\n" for name, value in headers.items())
        if body or method == "POST":
            head += f"Content-Length: {len(body)}\r\n"
        waiter: asyncio.Future[Answer] = loop.create_future()
        timer = loop.call_at(deadline, _expire, waiter, connection)
        try:
            connection.send(head.encode("latin-1") + b"\r\n" + body, limit, waiter)
            answer = await waiter
        except BaseException:
            connection.close()  # timed out, failed, or cancelled: never reused
            raise
        finally:
            timer.cancel()
            if connection.closed:
                self._all.discard(connection)
        if not connection.closed:
            connection.idle_since = time.monotonic()
            self._idle.append(connection)
        return answer

    async def _connection(self, deadline: float) -> _Connection:
        now = time.monotonic()
        while self._idle:
            connection = self._idle.pop()
            if not connection.closed and now - connection.idle_since < self.keepalive_seconds:
                return connection
            connection.close()
            self._all.discard(connection)
        loop = asyncio.get_running_loop()
        wait = max(0.0, min(self.connect_timeout, deadline - loop.time()))
        try:
            _, connection = await asyncio.wait_for(
                loop.create_connection(_Connection, self.host, self.port, ssl=self._ssl), wait
            )
        except OSError as exc:
            raise EngineConnectionError(f"could not connect to the engine ({type(exc).__name__})") from exc
        self._all.add(connection)
        return connection

    def close(self) -> None:
        for connection in self._all:
            connection.close()
        self._all.clear()
        self._idle.clear()


def _expire(waiter: asyncio.Future[Answer], connection: _Connection) -> None:
    if not waiter.done():
        waiter.set_exception(TimeoutError())
    connection.close()
