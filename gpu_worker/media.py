"""An audio line's ``file_url`` fetched for the engine, safe against server-side request forgery
(docs/worker.md, "Audio fetch").

- ``data:``: decoded (base64 only; its size checked by arithmetic before decoding).
- ``http(s)``: the host checked again against the allowlist (``functions.core.lines.url_host``,
  the rule ingest applied; ``MediaPolicy.narrowed`` by a work message's tenant list), resolved
  once with ``socket.getaddrinfo`` within the fetch's deadline (``Lookups``: the lookup runs in
  a thread of a small bounded set and is waited for at most until the deadline; a lookup still
  stuck then is left to end on its own, holding its slot till it does); every address it
  resolves to must be public (no loopback, private, link-local incl. the metadata address
  169.254.169.254, CGNAT, multicast, reserved or unspecified address, no IPv6 ULA or
  site-local, and the IPv4 address inside an IPv4-mapped, 6to4 or NAT64 one is checked the
  same), else nothing is sent. The connection goes to the vetted address itself (no second
  lookup: a DNS answer that changes between check and use cannot redirect it), with the URL's
  host in ``Host`` and, for https, as the TLS server name the certificate is checked against.
  No redirect is followed (a 3xx is an error), any status but 200 is an error, the body is read
  up to ``max_bytes + 1`` (more: an error), and the whole fetch has one deadline: the lookup and
  the body are held to it, the connect and the status and headers get what the lookup left of
  it as their socket timeout.

Every failure is a ``MediaFetchError`` (the line's error ``media_fetch_failed``) whose message
names the URL without its query (a presigned URL's signature stays out of error files).
"""

from __future__ import annotations

import base64
import binascii
import http.client
import ipaddress
import re
import socket
import ssl
import threading
import time
from collections.abc import Callable, Iterable
from concurrent.futures import Future
from concurrent.futures import wait as wait_for
from dataclasses import dataclass, field, replace
from urllib.parse import unquote, urlsplit

from functions.core import limits
from functions.core.lines import LineError, cut, data_url_size, url_host

MEDIA_FETCH_FAILED = "media_fetch_failed"
#: How much of an answer is read at a time.
READ_BYTES = 64 * 1024
#: The name the audio is sent under when its URL gives none (vLLM's run-batch uses this one).
DEFAULT_FILENAME = "audio.bin"
_SAFE_NAME = re.compile(r"[A-Za-z0-9._-]{1,100}")
#: The NAT64 prefix (RFC 6052): its addresses reach the IPv4 address in their last 32 bits.
_NAT64 = ipaddress.ip_network("64:ff9b::/96")

#: How many name lookups may be under way at once in this process (stuck ones included).
LOOKUP_THREADS = 8

#: ``resolve(host, port)``: the addresses ``host`` resolves to (tests inject their own).
Resolver = Callable[[str, int], list[str]]


class MediaFetchError(Exception):
    """The audio could not be fetched; ``str(error)`` is the line's error message."""

    code = MEDIA_FETCH_FAILED


def resolve(host: str, port: int) -> list[str]:
    """Every address ``host`` resolves to (one ``getaddrinfo``; blocking, with no timeout of its
    own: ``Lookups`` bounds it)."""
    return [str(info[4][0]) for info in socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)]


class Lookups:
    """Name lookups bounded by a deadline. ``getaddrinfo`` takes no timeout (the system resolver's
    own retries can take tens of seconds, a hostile name server as long as they allow), so each
    lookup runs in a daemon thread of its own and the fetch waits for it at most until its
    deadline; a lookup still running then is abandoned (nothing can interrupt it) and ends on its
    own. At most ``threads`` lookups are under way at once, abandoned ones included, so a slow
    resolver can never pile up threads: a fetch that finds every slot held waits for one only
    until its own deadline, then fails (docs/adr/0062-media-allowlists-and-bounded-lookups.md)."""

    def __init__(self, threads: int = LOOKUP_THREADS):
        self.threads = threads
        self._slots = threading.BoundedSemaphore(threads)
        self._lock = threading.Lock()
        self._running = 0

    @property
    def running(self) -> int:
        """Lookups under way (abandoned ones included): at most ``threads``."""
        with self._lock:
            return self._running

    def resolve(self, resolver: Resolver, host: str, port: int, *, deadline: float) -> list[str]:
        """``resolver(host, port)``, given until ``deadline`` (``time.monotonic``). Raises
        ``MediaFetchError`` when no slot frees up or no answer comes by then; the resolver's own
        exceptions pass through."""
        if not self._slots.acquire(timeout=max(0.0, deadline - time.monotonic())):
            raise MediaFetchError(
                f"The media host {host!r} could not be resolved before the fetch's deadline: "
                f"{self.threads} name lookups are already under way."
            )
        answer: Future[list[str]] = Future()
        with self._lock:
            self._running += 1
        try:
            threading.Thread(
                target=self._run, args=(answer, resolver, host, port), name="media-lookup", daemon=True
            ).start()
        except BaseException:
            self._done()
            raise
        if not wait_for([answer], timeout=max(0.0, deadline - time.monotonic())).done:
            raise MediaFetchError(f"The media host {host!r} could not be resolved before the fetch's deadline.")
        return answer.result()

    def _run(self, answer: Future[list[str]], resolver: Resolver, host: str, port: int) -> None:
        try:
            answer.set_result(resolver(host, port))
        except BaseException as exc:  # noqa: BLE001 - handed to the waiting fetch, if it still waits
            answer.set_exception(exc)
        finally:
            self._done()

    def _done(self) -> None:
        with self._lock:
            self._running -= 1
        self._slots.release()


#: The process's lookups: every fetch's (the worker's and run-batch's) share one bound.
LOOKUPS = Lookups()


@dataclass(frozen=True)
class MediaPolicy:
    """What an audio fetch may do: the hosts it may reach (``Settings.allowed_media_domains``),
    the most bytes it reads and its deadline; how names are resolved (tests inject a resolver)."""

    allowed_domains: tuple[str, ...] = ()
    max_bytes: int = limits.MAX_AUDIO_BYTES
    timeout: float = limits.AUDIO_FETCH_SECONDS
    resolver: Resolver = field(default=resolve, compare=False, repr=False)

    def narrowed(self, domains: Iterable[str] | None) -> MediaPolicy:
        """This policy with only its hosts that ``domains`` lists too (a work message's snapshot of
        its tenant's list; None: this policy as it is): never wider than this one."""
        if domains is None:
            return self
        listed = {domain.lower() for domain in domains}
        kept = tuple(dict.fromkeys(d.lower() for d in self.allowed_domains if d.lower() in listed))
        return replace(self, allowed_domains=kept)


#: No host allowed: only ``data:`` URLs (the default of ``Settings.allowed_media_domains``).
DATA_URLS_ONLY = MediaPolicy()


def address_problem(address: str) -> str | None:
    """Why the engine's worker must not connect to ``address`` (None: a public unicast address)."""
    try:
        ip: ipaddress.IPv4Address | ipaddress.IPv6Address = ipaddress.ip_address(address.split("%", 1)[0])
    except ValueError:
        return "not an IP address"
    if isinstance(ip, ipaddress.IPv6Address):
        embedded = ip.ipv4_mapped or ip.sixtofour
        if embedded is None and ip in _NAT64:
            embedded = ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF)
        if embedded is not None:
            problem = address_problem(str(embedded))
            return None if problem is None else f"it embeds {embedded}: {problem}"
        if ip.is_site_local:
            return "a site-local address"
    for kind, flag in (
        ("an unspecified", ip.is_unspecified),
        ("a loopback", ip.is_loopback),
        ("a link-local", ip.is_link_local),
        ("a multicast", ip.is_multicast),
        ("a reserved", ip.is_reserved),
        ("a private", ip.is_private),
        ("a non-global", not ip.is_global),
    ):
        if flag:
            return f"{kind} address"
    return None


def shown_url(url: str) -> str:
    """The URL as error messages show it: scheme, host and path, never credentials or the query."""
    if url[:5].lower() == "data:":
        return "a data: URL"
    try:
        parts = urlsplit(url)
        port = f":{parts.port}" if parts.port else ""
    except ValueError:
        return "a malformed URL"
    host = parts.hostname or ""
    host = f"[{host}]" if ":" in host else host
    return cut(f"{parts.scheme}://{host}{port}{parts.path}", limits.MAX_ECHOED_VALUE_CHARS)


def filename_of(url: str) -> str:
    """The audio's file name for the engine: the URL path's last segment when it is a plain name,
    else ``DEFAULT_FILENAME``."""
    if url[:5].lower() == "data:":
        return DEFAULT_FILENAME
    try:
        name = unquote(urlsplit(url).path.rsplit("/", 1)[-1])
    except ValueError:
        return DEFAULT_FILENAME
    return name if _SAFE_NAME.fullmatch(name) and name.strip(".") else DEFAULT_FILENAME


def fetch_audio(
    url: str,
    *,
    allowed_domains: tuple[str, ...] | list[str],
    max_bytes: int = limits.MAX_AUDIO_BYTES,
    timeout: float = limits.AUDIO_FETCH_SECONDS,
    resolver: Resolver = resolve,
    lookups: Lookups = LOOKUPS,
    allow_private: bool = False,
) -> bytes:
    """The audio ``url`` holds or points to (blocking: run it in a thread), within ``timeout``
    seconds from the call, the name lookup included (``lookups``). ``allow_private`` lets it
    reach a non-public address: for tests against a loopback server only, never set by the
    worker or run-batch. Raises ``MediaFetchError``."""
    deadline = time.monotonic() + timeout
    try:
        if url[:5].lower() == "data:":
            return _decode_data_url(url, max_bytes)
        host = url_host(url, allowed_domains)
    except LineError as exc:
        raise MediaFetchError(exc.message) from None
    parts = urlsplit(url)
    port = parts.port or (443 if parts.scheme.lower() == "https" else 80)
    address = vetted_address(
        host, port, resolver=resolver, allow_private=allow_private, lookups=lookups, deadline=deadline
    )
    return _fetch_http(url, host, port, address, max_bytes=max_bytes, deadline=deadline)


def _decode_data_url(url: str, max_bytes: int) -> bytes:
    data_url_size(url, max_bytes=max_bytes)
    try:
        return base64.b64decode(url.partition(",")[2], validate=True)
    except (binascii.Error, ValueError):
        raise MediaFetchError("Invalid value for 'body.file_url': its data is not valid base64 audio.") from None


def vetted_address(
    host: str,
    port: int,
    *,
    resolver: Resolver = resolve,
    allow_private: bool = False,
    lookups: Lookups = LOOKUPS,
    deadline: float | None = None,
) -> str:
    """The address to connect to: ``host``'s first, once every address it resolves to is public;
    the lookup given until ``deadline`` (``time.monotonic``; None: ``AUDIO_FETCH_SECONDS`` from
    now). Raises ``MediaFetchError``."""
    deadline = time.monotonic() + limits.AUDIO_FETCH_SECONDS if deadline is None else deadline
    try:
        addresses = lookups.resolve(resolver, host, port, deadline=deadline)
    except (OSError, UnicodeError) as exc:
        raise MediaFetchError(f"The media host {host!r} could not be resolved: {type(exc).__name__}.") from None
    if not addresses:
        raise MediaFetchError(f"The media host {host!r} resolves to no address.")
    if not allow_private:
        for address in addresses:
            if (problem := address_problem(address)) is not None:
                raise MediaFetchError(
                    f"The media host {host!r} resolves to {address}, {problem}: only public addresses are fetched from."
                )
    return addresses[0]


class _PinnedHTTP(http.client.HTTPConnection):
    """An HTTP connection to ``address`` (already vetted) for the URL's host: no lookup of its own."""

    def __init__(self, host: str, port: int, address: str, timeout: float):
        super().__init__(host, port, timeout=timeout)
        self._address = address

    def connect(self) -> None:
        self.sock = socket.create_connection((self._address, self.port), self.timeout)


class _PinnedHTTPS(http.client.HTTPSConnection):
    """An HTTPS connection to ``address`` whose certificate is checked against the URL's host."""

    def __init__(self, host: str, port: int, address: str, timeout: float, context: ssl.SSLContext | None):
        super().__init__(host, port, timeout=timeout, context=context or ssl.create_default_context())
        self._address = address

    def connect(self) -> None:
        sock = socket.create_connection((self._address, self.port), self.timeout)
        self.sock = self._context.wrap_socket(sock, server_hostname=self.host)  # type: ignore[attr-defined]


def _fetch_http(url: str, host: str, port: int, address: str, *, max_bytes: int, deadline: float) -> bytes:
    """GET ``url`` from the vetted ``address``, within what the lookup left of ``deadline``."""
    parts = urlsplit(url)
    https = parts.scheme.lower() == "https"
    left = max(0.001, deadline - time.monotonic())
    conn: http.client.HTTPConnection = (
        _PinnedHTTPS(host, port, address, left, None) if https else _PinnedHTTP(host, port, address, left)
    )
    target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    where = shown_url(url)
    try:
        conn.request("GET", target, headers={"Accept": "*/*", "Accept-Encoding": "identity"})
        response = conn.getresponse()
        if 300 <= response.status < 400:
            raise MediaFetchError(f"{where} answered a redirect ({response.status}); redirects are not followed.")
        if response.status != 200:
            raise MediaFetchError(f"{where} answered status {response.status}.")
        return _read_bounded(conn, response, where, max_bytes=max_bytes, deadline=deadline)
    except (OSError, http.client.HTTPException) as exc:
        raise MediaFetchError(f"Fetching {where} failed: {type(exc).__name__}.") from None
    finally:
        conn.close()


def _read_bounded(
    conn: http.client.HTTPConnection,
    response: http.client.HTTPResponse,
    where: str,
    *,
    max_bytes: int,
    deadline: float,
) -> bytes:
    too_large = f"{where} holds more than {max_bytes} bytes of audio, the most an audio line may bring."
    length = response.getheader("Content-Length")
    if length is not None and length.isdigit() and int(length) > max_bytes:
        raise MediaFetchError(too_large)
    buffer = bytearray()
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            raise MediaFetchError(f"Fetching {where} took longer than its deadline.")
        if conn.sock is not None:
            conn.sock.settimeout(left)
        piece = response.read1(min(READ_BYTES, max_bytes + 1 - len(buffer)))
        if not piece:
            return bytes(buffer)
        buffer += piece
        if len(buffer) > max_bytes:
            raise MediaFetchError(too_large)
