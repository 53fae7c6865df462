"""The POST of one delivery attempt (stdlib only), with one deadline for the whole exchange.

A socket timeout bounds each read or write, not their sum: a receiver that drips one byte a second
never trips it. So the exchange (name lookup, connect, TLS, the request, the status line and
headers, up to ``RESPONSE_READ_BYTES`` of the body) runs in a thread of its own, and the
caller waits for it ``deadline`` seconds at most; then the connection is shut (which ends a read or
write in progress at once) and the attempt has failed with ``TimeoutError``. A thread still in a
name lookup then ends with it, its result unused. Redirects are not followed (a 3xx is an answer
like any other non-2xx: a failed attempt).
"""

import http.client
import socket
import ssl
import threading
from typing import Final
from urllib.parse import urlsplit

#: Of an answer's body, at most this much is read (the status decides; the rest is not waited for).
RESPONSE_READ_BYTES: Final = 64 * 1024
_TLS: Final = ssl.create_default_context()


class _Exchange:
    """One request in its own thread; ``abort`` shuts its connection."""

    def __init__(self, url: str, body: bytes, headers: dict[str, str], deadline: float):
        parts = urlsplit(url)
        host, https = parts.hostname or "", parts.scheme == "https"
        port = parts.port or (443 if https else 80)  # given, so an IPv6 literal is not parsed for one
        if https:
            self._conn: http.client.HTTPConnection = http.client.HTTPSConnection(
                host, port, timeout=deadline, context=_TLS
            )
        else:
            self._conn = http.client.HTTPConnection(host, port, timeout=deadline)
        self._target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        self._body, self._headers = body, headers
        self._lock = threading.Lock()
        self._aborted = False
        self.done = threading.Event()
        self.status: int | None = None
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            self._conn.connect()
            with self._lock:
                if self._aborted:  # the deadline passed during the lookup or the connect
                    return
            self._conn.request("POST", self._target, body=self._body, headers=self._headers)
            response = self._conn.getresponse()
            response.read(RESPONSE_READ_BYTES)
            self.status = int(response.status)
        except BaseException as exc:  # noqa: BLE001 - handed to the caller
            self.error = exc
        finally:
            self._conn.close()
            self.done.set()

    def abort(self) -> None:
        with self._lock:
            self._aborted = True
            sock = self._conn.sock
        if sock is not None:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass  # already closed


def post(url: str, body: bytes, headers: dict[str, str], deadline: float) -> int:
    """The HTTP status of the answer, all of it within ``deadline`` seconds; raises when there is
    none in time (refused, reset, TLS, ``TimeoutError`` at the deadline)."""
    exchange = _Exchange(url, body, headers, deadline)
    threading.Thread(target=exchange.run, name="webhook-exchange", daemon=True).start()
    if not exchange.done.wait(deadline):
        exchange.abort()
        raise TimeoutError(f"no complete answer within {deadline:g} s")
    if exchange.error is not None:
        raise exchange.error
    assert exchange.status is not None
    return exchange.status
