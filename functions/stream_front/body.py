"""A request body read from its connection in chunks, by ``Content-Length`` or ``Transfer-Encoding:
chunked``, never more than a bound: the reader raises as soon as the body is over it."""

from collections.abc import Iterator
from typing import Final, Protocol

from functions.core.errors import InvalidRequest, PayloadTooLarge

#: How much of the body is read at a time (what any one step holds of it).
CHUNK_BYTES: Final = 1024 * 1024


class Stream(Protocol):
    """Where a request's body is read from: the connection's buffered reader (http.server's
    ``rfile``) or any binary file."""

    def read(self, size: int, /) -> bytes: ...
    def readline(self, size: int, /) -> bytes: ...


class ClientGone(Exception):
    """The connection ended before the body did: nothing the request made may stay."""


def chunks(
    stream: Stream, *, content_length: str | None, transfer_encoding: str | None, limit: int, what: str = "request body"
) -> Iterator[bytes]:
    """The body's bytes in chunks of at most CHUNK_BYTES. PayloadTooLarge once more than ``limit``
    bytes are declared or read; InvalidRequest for a malformed framing; ClientGone when the
    connection ends early."""
    if "chunked" in (transfer_encoding or "").lower():
        yield from _dechunked(stream, limit, what)
        return
    if content_length is None or not content_length.strip().isdigit():
        raise InvalidRequest("The request has no Content-Length and is not chunked.", code="invalid_request")
    remaining = int(content_length)
    if remaining > limit:
        raise too_large(remaining, limit, what)
    while remaining:
        data = stream.read(min(CHUNK_BYTES, remaining))
        if not data:
            raise ClientGone()
        remaining -= len(data)
        yield data


def _dechunked(stream: Stream, limit: int, what: str) -> Iterator[bytes]:
    total = 0
    while True:
        line = stream.readline(1024)
        if not line:
            raise ClientGone()
        try:
            size = int(line.split(b";", 1)[0].strip(), 16)
        except ValueError:
            raise InvalidRequest("The request's chunked body is malformed.") from None
        if size == 0:
            while stream.readline(8192).strip():  # trailers, up to the blank line
                pass
            return
        total += size
        if total > limit:
            raise too_large(total, limit, what)
        while size:
            data = stream.read(min(CHUNK_BYTES, size))
            if not data:
                raise ClientGone()
            size -= len(data)
            yield data
        if stream.readline(8) not in (b"\r\n", b"\n"):
            raise InvalidRequest("The request's chunked body is malformed.")


def too_large(size: int, limit: int, what: str) -> PayloadTooLarge:
    return PayloadTooLarge(f"The {what} is at least {size} bytes; at most {limit} bytes are accepted.")
