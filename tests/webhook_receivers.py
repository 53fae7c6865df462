"""Webhook receivers on 127.0.0.1 for the tests (integration and e2e): an honest one that records
every request and answers a scripted status, and a stalling one that never gives a complete
answer: ``silent`` reads the request and never writes, ``drip`` sends a status line and then a
header one byte per ``interval``, never ending it (a per-read socket timeout longer than the interval never
trips on it)."""

import http.server
import socket
import threading
import time
from typing import Any, Literal


class Receiver:
    """A real HTTP receiver: answers ``statuses`` in turn (then 200); ``up()``/``down()``. Each
    request is kept as (lower-cased headers, body, ``time.monotonic()`` when it arrived)."""

    def __init__(self, port: int, statuses: list[int] | None = None):
        self.port, self.statuses = port, list(statuses or [])
        self.requests: list[tuple[dict[str, str], bytes, float]] = []
        self.arrived = threading.Event()
        self._server: http.server.ThreadingHTTPServer | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/hooks"

    def up(self) -> "Receiver":
        outer = self

        class Handle(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["content-length"]))
                outer.requests.append(({k.lower(): v for k, v in self.headers.items()}, body, time.monotonic()))
                outer.arrived.set()
                self.send_response(outer.statuses.pop(0) if outer.statuses else 200)
                self.send_header("content-length", "0")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self._server = http.server.ThreadingHTTPServer(("127.0.0.1", self.port), Handle)
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    def down(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None


class StallingReceiver:
    """Accepts connections and never completes an answer (``mode``). ``open_now()`` counts the
    connections the client still holds open; ``connections`` every one accepted, with when it
    opened and closed (``time.monotonic()``; closed None while open)."""

    def __init__(self, port: int, mode: Literal["silent", "drip"] = "drip", interval: float = 0.2):
        self.port, self.mode, self.interval = port, mode, interval
        self.connections: list[dict[str, float | None]] = []
        self.opened = threading.Event()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._sock = socket.create_server(("127.0.0.1", port))
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/hooks"

    def open_now(self) -> int:
        with self._lock:
            return sum(1 for c in self.connections if c["closed"] is None)

    def close(self) -> None:
        self._stop.set()
        self._sock.close()

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._sock.accept()
            except OSError:
                return
            record: dict[str, float | None] = {"opened": time.monotonic(), "closed": None}
            with self._lock:
                self.connections.append(record)
            self.opened.set()
            threading.Thread(target=self._stall, args=(conn, record), daemon=True).start()

    def _stall(self, conn: socket.socket, record: dict[str, float | None]) -> None:
        """Hold the connection until the client gives up on it (its read of our bytes, or our
        write, fails), or the receiver is closed."""
        prefix = b"HTTP/1.1 200 OK\r\nX-Drip: "
        sent = 0
        conn.settimeout(self.interval)
        try:
            while not self._stop.is_set():
                if self.mode == "drip":
                    conn.send(prefix[sent : sent + 1] if sent < len(prefix) else b"a")
                    sent += 1
                try:
                    if conn.recv(65536) == b"":  # the client closed (or shut down) its side
                        break
                except TimeoutError:
                    continue
        except OSError:
            pass
        finally:
            with self._lock:
                record["closed"] = time.monotonic()
            conn.close()
