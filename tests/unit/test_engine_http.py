"""The engine's lean HTTP/1.1 client (gpu_worker/engine_http.py) against a loopback server that
answers scripted bytes: keep-alive reuse, the answers' three ways to end, interim answers, and
every failure as one of its three exceptions. (EngineClient's behaviour over it, against the fake
engine's aiohttp server, is tests/unit/test_engine_client.py.)"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest

try:
    import uvloop
except ImportError:  # pragma: no cover
    uvloop = None

from gpu_worker.engine_http import AnswerTooLarge, EngineConnectionError, EngineHttp


class Scripted:
    """A server that reads each request (head and ``Content-Length`` body) and writes
    ``answer(n)`` for the n-th request (None: stay silent); ``connections`` counts accepts."""

    def __init__(self, answer: Callable[[int], bytes | None]):
        self.answer, self.connections, self.requests = answer, 0, []
        self.server: asyncio.Server | None = None

    async def __aenter__(self) -> str:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        return f"http://127.0.0.1:{self.server.sockets[0].getsockname()[1]}"

    async def __aexit__(self, *_: object) -> None:
        assert self.server is not None
        self.server.close()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = next(
                    (
                        int(line.split(b":")[1])
                        for line in head.split(b"\r\n")
                        if line.lower().startswith(b"content-length")
                    ),
                    0,
                )
                self.requests.append(head + await reader.readexactly(length))
                answer = self.answer(len(self.requests))
                if answer is None:
                    await asyncio.sleep(60)
                writer.write(answer)
                await writer.drain()
                lowered = answer.lower()
                ends = b"connection: close" in lowered or b"content-length" not in lowered
                if ends and b"chunked" not in lowered:
                    writer.close()
                    return
        except (asyncio.IncompleteReadError, ConnectionError):
            writer.close()


def ok(body: bytes = b'{"ok":true}', extra: bytes = b"") -> bytes:
    return b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n%s\r\n%s" % (len(body), extra, body)


#: Both event loops the worker may run on: asyncio's, and uvloop's (python -m gpu_worker's where installed).
LOOPS = [asyncio.new_event_loop, *([uvloop.new_event_loop] if uvloop is not None else [])]


@pytest.fixture(params=LOOPS, ids=lambda factory: factory.__module__.split(".")[0], autouse=True)
def loop_factory(request, monkeypatch):
    def run_on(main):
        with asyncio.Runner(loop_factory=request.param) as runner:
            return runner.run(main)

    monkeypatch.setattr(asyncio, "run", run_on)


def run(answer: Callable[[int], bytes | None], *requests: dict, timeout: float = 5.0, limit: int = 1 << 20):
    async def go():
        script = Scripted(answer)
        async with script as url:
            http = EngineHttp(url, connect_timeout=2.0)
            try:
                out = []
                for kwargs in requests:
                    out.append(
                        await http.request(
                            kwargs.pop("method", "POST"), "/v1/x", timeout=timeout, limit=limit, **kwargs
                        )
                    )
                return out, script
            finally:
                http.close()

    return asyncio.run(go())


def test_keep_alive_reuses_one_connection_and_sends_the_body_with_its_length():
    answers, script = run(
        lambda n: ok(b'{"n":%d}' % n), {"body": b'{"a":1}', "headers": {"X-Request-Id": "req_1"}}, {"body": b"{}"}
    )
    assert [a.body for a in answers] == [b'{"n":1}', b'{"n":2}']
    assert script.connections == 1
    assert b"Content-Length: 7\r\n" in script.requests[0] and script.requests[0].endswith(b'{"a":1}')
    assert b"X-Request-Id: req_1\r\n" in script.requests[0]
    assert answers[0].headers["content-length"] == "7"


def test_an_answer_that_closes_the_connection_is_read_and_the_next_request_opens_another():
    answers, script = run(lambda n: ok(extra=b"Connection: close\r\n"), {}, {})
    assert [a.status for a in answers] == [200, 200]
    assert script.connections == 2


def test_an_answer_without_a_length_ends_with_the_connection():
    answers, _ = run(lambda n: b"HTTP/1.1 500 Oops\r\ncontent-type: text/plain\r\n\r\nsomething broke", {})
    assert answers[0].status == 500 and answers[0].body == b"something broke"


def test_an_interim_answer_is_skipped_and_chunks_with_trailers_are_joined():
    chunked = b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n"
    chunked += b'4;ext=1\r\n{"a"\r\n3\r\n:1}\r\n0\r\nx-trailer: 1\r\n\r\n'
    answers, script = run(lambda n: chunked, {}, {})
    assert [a.body for a in answers] == [b'{"a":1}', b'{"a":1}']
    assert script.connections == 1


def test_what_is_not_http_is_a_connection_error():
    with pytest.raises(EngineConnectionError):
        run(lambda n: b"SSH-2.0-OpenSSH\r\n\r\n", {})


def test_a_connection_that_ends_mid_answer_is_a_connection_error():
    with pytest.raises(EngineConnectionError):
        run(lambda n: b"HTTP/1.1 200 OK\r\ncontent-length: 100\r\nconnection: close\r\n\r\n{", {})


def test_no_server_is_a_connection_error():
    async def go():
        http = EngineHttp("http://127.0.0.1:9", connect_timeout=2.0)
        await http.request("GET", "/health", timeout=2.0, limit=100)

    with pytest.raises(EngineConnectionError):
        asyncio.run(go())


def test_answers_over_the_bound_are_refused_by_their_length_or_as_they_come():
    with pytest.raises(AnswerTooLarge) as said:
        run(lambda n: ok(b"x" * 101), {}, limit=100)
    assert said.value.status == 200
    body = b"40\r\n" + b"x" * 64 + b"\r\n"
    with pytest.raises(AnswerTooLarge):
        run(lambda n: b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n" + body * 3 + b"0\r\n\r\n", {}, limit=100)


def test_a_silent_server_is_a_timeout():
    with pytest.raises(TimeoutError):
        run(lambda n: None, {}, timeout=0.2)
