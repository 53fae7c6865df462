"""Where ``batchctl run-batch`` reads its input and writes its output: a local path or an ``http(s)``
URL, as ``vllm run-batch`` takes them, so a presigned S3 GET and PUT pair works.

- **Input** (``source``): a URL is one GET whose body is read as it arrives (the caller reads it in
  1 MiB pieces: ``offline.file_lines``), never whole in memory. Opening it is retried with backoff
  on a connection error, a 5xx or a 429; a 4xx other than 429 is final (an expired presigned URL
  does not heal).
- **Output** (``sink``): a URL gets the run's lines in a temporary file (in ``tmp_dir``: vLLM's
  ``--output-tmp-dir``, else the system's), then one PUT of that file, streamed from disk with its
  ``Content-Length`` (S3 refuses a PUT without one), retried like the GET. vLLM keeps the output in
  memory when no tmp dir is given; here it is always on disk. Nothing is sent when the run fails,
  and the temporary file is removed either way.

Redirects: urllib follows them for the GET (a presigned URL behind one works) and not for the PUT
(a redirected upload is an error: its body would have to be sent again to where it points).
"""

from __future__ import annotations

import http.client
import os
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, cast

from .media import shown_url

#: Seconds for a connection or a read to make progress; the transfer itself may take longer.
SOCKET_TIMEOUT_SECONDS = 60.0
#: The bytes the PUT reads from the temporary file at a time.
PUT_BLOCK_BYTES = 1024 * 1024


class RemoteError(OSError):
    """A GET or PUT that failed for good (its last status or error in the message)."""


@dataclass(frozen=True)
class Retries:
    """Attempts of one GET or PUT and the backoff between them: base, doubled each time, capped."""

    attempts: int = 5
    base_seconds: float = 1.0
    max_seconds: float = 16.0

    def delays(self) -> Iterator[float]:
        for attempt in range(self.attempts - 1):
            yield min(self.max_seconds, self.base_seconds * 2**attempt)


DEFAULT_RETRIES = Retries()


def is_url(spec: str | os.PathLike[str]) -> bool:
    return isinstance(spec, str) and spec.startswith(("http://", "https://"))


def _transient(exc: Exception) -> bool:
    if isinstance(exc, urllib.error.HTTPError):
        return exc.code >= 500 or exc.code == 429
    return isinstance(exc, (urllib.error.URLError, OSError))


def _with_retries(
    what: str, url: str, call: Callable[[], Any], retries: Retries, sleep: Callable[[float], None]
) -> Any:
    delays = retries.delays()
    while True:
        try:
            return call()
        except (urllib.error.URLError, OSError) as exc:
            delay = next(delays, None) if _transient(exc) else None
            if delay is None:
                raise RemoteError(f"{what} {shown_url(url)} failed: {_describe(exc)}") from exc
            sleep(delay)


def _describe(exc: Exception) -> str:
    if isinstance(exc, urllib.error.HTTPError):
        body = exc.read(512).decode("utf-8", "replace").strip()
        return f"HTTP {exc.code} {exc.reason}" + (f": {body}" if body else "")
    if isinstance(exc, urllib.error.URLError):
        return str(exc.reason)
    return str(exc)


@contextmanager
def source(
    spec: str | os.PathLike[str],
    *,
    retries: Retries = DEFAULT_RETRIES,
    sleep: Callable[[float], None] = time.sleep,
) -> Iterator[IO[bytes]]:
    """The input, open for reading: a local file, or the body of a GET of ``spec``."""
    if not is_url(spec):
        with open(spec, "rb") as f:
            yield f
        return
    url = cast(str, spec)
    response = _with_retries(
        "GET", url, lambda: urllib.request.urlopen(url, timeout=SOCKET_TIMEOUT_SECONDS), retries, sleep
    )
    with response:
        yield cast(IO[bytes], _Body(response, url))


@contextmanager
def sink(
    spec: str | os.PathLike[str],
    *,
    tmp_dir: str | os.PathLike[str] | None = None,
    retries: Retries = DEFAULT_RETRIES,
    sleep: Callable[[float], None] = time.sleep,
) -> Iterator[IO[bytes]]:
    """The output, open for writing: a local file, or a temporary file PUT to ``spec`` once the
    block ends without an exception."""
    if not is_url(spec):
        with open(spec, "wb") as f:
            yield f
        return
    url = cast(str, spec)
    with tempfile.NamedTemporaryFile(dir=tmp_dir, prefix="batch_output_", suffix=".jsonl") as f:
        yield cast(IO[bytes], f)
        f.flush()
        put_file(url, Path(f.name), retries=retries, sleep=sleep)


def put_file(
    url: str, path: Path, *, retries: Retries = DEFAULT_RETRIES, sleep: Callable[[float], None] = time.sleep
) -> None:
    """PUT ``path``'s bytes to ``url``, streamed from disk with its Content-Length; retried."""
    size = path.stat().st_size

    def attempt() -> Any:
        with open(path, "rb") as body:
            request = urllib.request.Request(
                url,
                data=_Blocks(body),
                method="PUT",
                headers={"Content-Length": str(size), "Content-Type": "application/jsonl"},
            )
            opener = urllib.request.build_opener(_NoRedirect)
            response = opener.open(request, timeout=SOCKET_TIMEOUT_SECONDS)
            response.read()
            response.close()
            return response

    _with_retries("PUT", url, attempt, retries, sleep)


class _Blocks:
    """A file as an iterable of blocks: urllib sends an iterable body block by block (with the
    Content-Length the request names) instead of reading it whole."""

    def __init__(self, f: IO[bytes]) -> None:
        self._f = f

    def __iter__(self) -> Iterator[bytes]:
        while block := self._f.read(PUT_BLOCK_BYTES):
            yield block


class _Body:
    """A GET's body as the run reads it: a connection cut mid-body is a ``RemoteError`` (an
    ``OSError``, as a failed local read is), not http.client's own exception."""

    def __init__(self, response: Any, url: str) -> None:
        self._response = response
        self._url = url

    def read(self, size: int = -1) -> bytes:
        try:
            return cast(bytes, self._response.read(size))
        except (http.client.HTTPException, OSError) as exc:
            raise RemoteError(f"GET {shown_url(self._url)} failed while reading: {exc!r}") from exc


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args: object, **kwargs: object) -> None:
        return None
