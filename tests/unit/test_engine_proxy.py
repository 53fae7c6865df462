"""The benchmarks' timestamping proxy (tests/bench/engine_proxy.py): bytes go through unchanged
both ways on a kept-alive connection, and each ``POST /v1/...`` is recorded with its status and
times, other requests not."""

import http.client
import http.server
import threading
import time
from typing import ClassVar

import pytest

from tests.bench.engine_proxy import EngineProxy


class _Engine(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, as uvicorn
    bodies: ClassVar[list[bytes]] = []

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["Content-Length"]))
        type(self).bodies.append(body)
        time.sleep(0.05)
        answer = body[::-1]
        self.send_response(201 if self.path.startswith("/v1/") else 200)
        self.send_header("Content-Length", str(len(answer)))
        self.end_headers()
        self.wfile.write(answer)

    def do_GET(self) -> None:
        answer = b"metrics 1\n"
        self.send_response(200)
        self.send_header("Content-Length", str(len(answer)))
        self.end_headers()
        self.wfile.write(answer)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def engine_url():
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Engine)
    _Engine.bodies = []
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def test_bytes_go_through_and_each_v1_post_is_timed(engine_url):
    big = bytes(range(256)) * 8192  # 2 MiB: more than one socket buffer each way
    with EngineProxy(engine_url) as proxy:
        since = time.monotonic()
        conn = http.client.HTTPConnection("127.0.0.1", proxy.port, timeout=10)
        answers = []
        for path, body in [
            ("/v1/chat/completions", b'{"a": 1}'),
            ("/metrics", None),
            ("/metrics/?name%5B%5D=vllm%3Anum_requests_running", None),
            ("/v1/embeddings", big),
        ]:
            if body is None:
                conn.request("GET", path)
            else:
                conn.request("POST", path, body=body, headers={"Content-Type": "application/json"})
            r = conn.getresponse()
            answers.append((r.status, r.read()))
        conn.request("POST", "/tokenize", body=b"x")  # not a /v1/ path: passed, not recorded
        conn.getresponse().read()
        finished = time.monotonic()
        conn.close()
        window = proxy.window(since)
        later = proxy.window(finished)
        arrivals, none_later = proxy.arrivals(since), proxy.arrivals(finished)

    assert answers == [(201, b'}1 :"a"{'), (200, b"metrics 1\n"), (200, b"metrics 1\n"), (201, big[::-1])]
    assert _Engine.bodies == [b'{"a": 1}', big, b"x"]
    assert [(e.method, e.path, e.status) for e in proxy.exchanges] == [
        ("POST", "/v1/chat/completions", 201),
        ("POST", "/v1/embeddings", 201),
    ]
    for e in proxy.exchanges:
        assert since <= e.arrived and e.arrived + 0.05 <= e.answered <= finished
    assert window is not None and window.requests == 2
    assert window.metrics_reads == 2  # the GETs of /metrics, whole and filtered, between the two POSTs
    assert window.first_request == proxy.exchanges[0].arrived
    assert window.last_answer == proxy.exchanges[1].answered
    assert later is None
    assert arrivals == [e.arrived for e in proxy.exchanges] and none_later == []  # in order, POSTs to /v1/ only


def test_an_engine_that_is_not_there_closes_the_client(engine_url):
    with EngineProxy("http://127.0.0.1:9") as proxy:  # discard port: nothing listens
        conn = http.client.HTTPConnection("127.0.0.1", proxy.port, timeout=10)
        with pytest.raises((ConnectionError, http.client.RemoteDisconnected)):
            conn.request("POST", "/v1/chat/completions", body=b"{}")
            conn.getresponse()
        assert proxy.exchanges == []
