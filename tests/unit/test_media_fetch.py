"""The audio fetch (gpu_worker/media.py): the address policy with injected resolvers (every
forbidden range, answers mixing public and private addresses, IPv4 inside IPv6), data: URLs
decoded within their bound, the name lookup bounded by the fetch's deadline (a slow resolver, a
full set of lookups), and the HTTP path against a loopback server, reachable only through the
test-only ``allow_private`` switch: a redirect and an oversized body are refused."""

from __future__ import annotations

import base64
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from gpu_worker.media import (
    Lookups,
    MediaFetchError,
    address_problem,
    fetch_audio,
    filename_of,
    shown_url,
    vetted_address,
)

AUDIO = b"RIFF\x00\x00\x00\x00WAVEfmt " * 10


@pytest.mark.parametrize(
    "address",
    [
        "127.0.0.1",
        "127.8.9.10",
        "10.1.2.3",
        "172.16.0.1",
        "192.168.1.1",
        "169.254.169.254",  # the instance metadata service
        "100.64.0.1",  # CGNAT
        "224.0.0.251",
        "240.0.0.1",
        "0.0.0.0",
        "255.255.255.255",
        "::1",
        "::",
        "fe80::1",
        "fe80::1%eth0",
        "fd00:ec2::254",  # ULA (EC2's IPv6 metadata address)
        "fec0::1",
        "ff02::1",
        "::ffff:127.0.0.1",  # IPv4-mapped
        "::ffff:169.254.169.254",
        "2002:a00:1::",  # 6to4 of 10.0.0.1
        "64:ff9b::7f00:1",  # NAT64 of 127.0.0.1
        "not-an-address",
    ],
)
def test_every_non_public_address_is_refused(address):
    assert address_problem(address) is not None


@pytest.mark.parametrize("address", ["93.184.215.14", "8.8.8.8", "2606:4700:4700::1111", "::ffff:8.8.8.8"])
def test_public_addresses_pass(address):
    assert address_problem(address) is None


def test_a_host_resolving_to_any_private_address_is_refused_and_nothing_else_is_tried():
    with pytest.raises(MediaFetchError) as refused:
        vetted_address("media.example.com", 443, resolver=lambda host, port: ["93.184.215.14", "10.0.0.5"])
    assert "10.0.0.5, a private address" in str(refused.value)
    with pytest.raises(MediaFetchError, match=r"embeds 127\.0\.0\.1"):
        vetted_address("media.example.com", 443, resolver=lambda host, port: ["::ffff:127.0.0.1"])
    assert vetted_address("media.example.com", 443, resolver=lambda h, p: ["93.184.215.14", "8.8.8.8"]) == (
        "93.184.215.14"
    )


def test_a_resolver_failure_or_no_answer_is_a_fetch_error():
    def fails(host, port):
        raise OSError("no such host")

    with pytest.raises(MediaFetchError, match="could not be resolved"):
        vetted_address("media.example.com", 443, resolver=fails)
    with pytest.raises(MediaFetchError, match="no address"):
        vetted_address("media.example.com", 443, resolver=lambda h, p: [])


def test_the_host_is_checked_against_the_allowlist_again_before_any_lookup():
    looked_up = []
    with pytest.raises(MediaFetchError, match="not an allowed media domain"):
        fetch_audio(
            "https://evil.example.net/a.wav",
            allowed_domains=("media.example.com",),
            resolver=lambda h, p: looked_up.append(h) or ["8.8.8.8"],
        )
    assert looked_up == []


# --- the name lookup, within the fetch's deadline ---------------------------------------------------
class SlowResolver:
    """A resolver that answers only once released (a name server that never answers in time);
    ``calls`` counts the lookups it was asked for."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.calls = 0

    def __call__(self, host: str, port: int) -> list[str]:
        self.calls += 1
        self.release.wait(30)
        return ["93.184.215.14"]


@pytest.fixture
def slow() -> Iterator[SlowResolver]:
    resolver = SlowResolver()
    yield resolver
    resolver.release.set()  # the abandoned lookups end on their own


def wait_until(predicate, seconds: float = 5.0) -> None:
    end = time.monotonic() + seconds
    while not predicate():
        assert time.monotonic() < end, "the condition never held"
        time.sleep(0.005)


def test_a_slow_lookup_fails_the_fetch_within_its_deadline(slow):
    lookups = Lookups(2)
    started = time.monotonic()
    with pytest.raises(MediaFetchError, match="could not be resolved before the fetch's deadline"):
        fetch_audio(
            "https://media.example.com/a.wav?sig=s3cr3t",
            allowed_domains=("media.example.com",),
            timeout=0.3,
            resolver=slow,
            lookups=lookups,
        )
    took = time.monotonic() - started
    assert 0.3 <= took < 2.0  # the deadline, not the resolver's 30 s
    assert slow.calls == 1 and lookups.running == 1  # the stuck lookup is left to end on its own
    slow.release.set()
    wait_until(lambda: lookups.running == 0)


def test_stuck_lookups_hold_their_slots_and_never_pile_up_threads(slow):
    """Every slot held by a lookup that outlived its fetch: the next fetches start no thread, fail
    within their own deadline, and once the stuck lookups end a fetch resolves again."""
    lookups = Lookups(2)
    for _ in range(2):
        with pytest.raises(MediaFetchError):
            vetted_address("media.example.com", 443, resolver=slow, lookups=lookups, deadline=time.monotonic() + 0.05)
    assert lookups.running == 2 and slow.calls == 2
    threads = threading.active_count()
    for _ in range(5):
        started = time.monotonic()
        with pytest.raises(MediaFetchError, match="2 name lookups are already under way"):
            vetted_address("media.example.com", 443, resolver=slow, lookups=lookups, deadline=time.monotonic() + 0.05)
        assert time.monotonic() - started < 1.0
    assert slow.calls == 2 and lookups.running == 2 and threading.active_count() <= threads
    slow.release.set()
    wait_until(lambda: lookups.running == 0)
    assert vetted_address("media.example.com", 443, resolver=lambda h, p: ["8.8.8.8"], lookups=lookups) == "8.8.8.8"


def test_a_fetch_waits_for_a_slot_that_frees_up_before_its_deadline(slow):
    lookups = Lookups(1)
    with pytest.raises(MediaFetchError):
        vetted_address("media.example.com", 443, resolver=slow, lookups=lookups, deadline=time.monotonic() + 0.05)
    threading.Timer(0.1, slow.release.set).start()  # the stuck lookup ends while the next fetch waits
    address = vetted_address(
        "media.example.com", 443, resolver=lambda h, p: ["8.8.8.8"], lookups=lookups, deadline=time.monotonic() + 5
    )
    assert address == "8.8.8.8"
    wait_until(lambda: lookups.running == 0)


def test_a_data_url_is_decoded_within_its_bound():
    url = "data:audio/wav;base64," + base64.b64encode(AUDIO).decode()
    assert fetch_audio(url, allowed_domains=()) == AUDIO
    with pytest.raises(MediaFetchError, match=f"at most {len(AUDIO) - 1} are allowed"):
        fetch_audio(url, allowed_domains=(), max_bytes=len(AUDIO) - 1)


def test_messages_name_no_query_or_credentials_and_file_names_are_plain():
    assert shown_url("https://u:p@media.example.com:8443/a/b.wav?X-Amz-Signature=s") == (
        "https://media.example.com:8443/a/b.wav"
    )
    assert filename_of("https://media.example.com/clips/talk%201.wav") == "audio.bin"
    assert filename_of("https://media.example.com/clips/talk-1.mp3?x=1") == "talk-1.mp3"
    assert filename_of("data:audio/wav;base64,AAAA") == filename_of("https://media.example.com/") == "audio.bin"


# --- the HTTP path, against a loopback server -----------------------------------------------------
class _Handler(BaseHTTPRequestHandler):
    def log_message(self, *args):
        pass

    def do_GET(self):
        self.server.seen.append((self.path, self.headers.get("Host")))  # type: ignore[attr-defined]
        if self.path.startswith("/redirect"):
            self.send_response(302)
            self.send_header("Location", "http://169.254.169.254/latest/meta-data/")
            self.send_header("Content-Length", "0")
            self.end_headers()
        elif self.path.startswith("/big"):
            self.send_response(200)
            if self.path == "/big-declared":
                self.send_header("Content-Length", str(len(AUDIO) + 1))
            self.end_headers()
            self.wfile.write(AUDIO + b"x")
        elif self.path.startswith("/missing"):
            self.send_response(404)
            self.send_header("Content-Length", "0")
            self.end_headers()
        else:
            self.send_response(200)
            self.send_header("Content-Length", str(len(AUDIO)))
            self.end_headers()
            self.wfile.write(AUDIO)


@pytest.fixture
def server() -> Iterator[ThreadingHTTPServer]:
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    httpd.seen = []  # type: ignore[attr-defined]
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield httpd
    httpd.shutdown()
    httpd.server_close()


def fetch(server, path: str, **kw) -> bytes:
    port = server.server_address[1]
    kw.setdefault("allow_private", True)
    return fetch_audio(
        f"http://media.test:{port}{path}",
        allowed_domains=("media.test",),
        max_bytes=len(AUDIO),
        timeout=5,
        resolver=lambda host, p: ["127.0.0.1"],
        **kw,
    )


def test_the_audio_is_fetched_from_the_vetted_address_with_the_urls_host(server):
    assert fetch(server, "/clip.wav?sig=1") == AUDIO
    port = server.server_address[1]
    assert server.seen == [("/clip.wav?sig=1", f"media.test:{port}")]


def test_without_the_test_switch_a_loopback_address_is_never_fetched(server):
    with pytest.raises(MediaFetchError, match="a loopback address"):
        fetch(server, "/clip.wav", allow_private=False)
    assert server.seen == []


def test_a_redirect_is_refused_not_followed(server):
    with pytest.raises(MediaFetchError, match=r"redirect \(302\)"):
        fetch(server, "/redirect?sig=s3cr3t")
    assert [path for path, _ in server.seen] == ["/redirect?sig=s3cr3t"]


@pytest.mark.parametrize("path", ["/big", "/big-declared"])
def test_a_body_over_the_bound_is_refused(server, path):
    with pytest.raises(MediaFetchError, match=f"more than {len(AUDIO)} bytes"):
        fetch(server, path)


def test_another_status_is_an_error_without_the_query(server):
    with pytest.raises(MediaFetchError) as error:
        fetch(server, "/missing.wav?sig=s3cr3t")
    assert "answered status 404" in str(error.value) and "s3cr3t" not in str(error.value)
