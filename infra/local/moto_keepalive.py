"""moto's server keeps its clients' connections, as AWS's endpoints do.

moto serves on werkzeug's development server, which answers every request with ``Connection:
close`` (its ``run_wsgi`` cannot find where a request's body ends, so it drains the socket after
each answer). So every AWS call of the local deployment (the workers', the Lambdas', the pollers')
opened a TCP connection and the server started a thread for it: in a profile of the local
process running 200-line batches, about a sixth of its busy samples were connecting, accepting
and closing (docs/local.md, "moto's server: connections kept").

``KeepAliveHandler`` is moto's request handler with a ``run_wsgi`` that reads each request's whole
body before the application sees it (``Content-Length``, or a chunked body to its end), so the next
request starts where this one ended, and answers with a ``Content-Length``: HTTP/1.1 keep-alive,
RFC 9112 section 9.3. A request the application fails on gets a 500 and its connection closed.
What a request means to moto does not change: the same environ, the same app.
"""

from __future__ import annotations

import io
import logging
from typing import Any

from moto.moto_server.threaded_moto_server import ThreadedMotoServer
from moto.moto_server.werkzeug_app import DomainDispatcherApplication, MotoRequestHandler, create_backend_app
from werkzeug.serving import make_server

log = logging.getLogger("infra.local.moto")

#: Answers that carry no body and no ``Content-Length`` of one (RFC 9110 sections 8.6, 15.2, 15.3.5, 15.4.5).
_NO_BODY = {204, 304}


class KeepAliveHandler(MotoRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True

    def run_wsgi(self) -> None:
        if self.headers.get("Expect", "").lower().strip(" \t") == "100-continue":
            self.wfile.write(b"HTTP/1.1 100 Continue\r\n\r\n")
        environ = self.make_environ()
        # The whole body read here: the connection is then at the next request line. (A chunked
        # one through make_environ's DechunkedInput; ``wsgi.input_terminated`` stays: the
        # application reads the stream to its end.)
        if environ.get("wsgi.input_terminated"):
            body = environ["wsgi.input"].read()
        else:
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        environ["wsgi.input"] = io.BytesIO(body)
        answer: list[Any] = []
        chunks: list[bytes] = []

        def start_response(status: str, headers: list[tuple[str, str]], exc_info: Any = None) -> Any:
            answer[:] = [status, headers]
            return chunks.append

        try:
            result = self.server.app(environ, start_response)
            try:
                chunks.extend(result)
            finally:
                if hasattr(result, "close"):
                    result.close()
            status, headers = answer
        except Exception:
            log.exception("moto could not answer %s %s", self.command, self.path)
            status, headers, chunks = "500 INTERNAL SERVER ERROR", [("Content-Type", "text/plain")], [b"moto failed"]
            self.close_connection = True
        number, _, reason = status.partition(" ")
        code = int(number)
        payload = b"".join(chunks)
        self.send_response(code, reason)
        given = False
        for key, value in headers:
            lowered = key.lower()
            if lowered in ("connection", "transfer-encoding"):
                continue  # this handler frames the answer
            given = given or lowered == "content-length"
            self.send_header(key, value)
        if not given and code not in _NO_BODY and not 100 <= code < 200:
            self.send_header("Content-Length", str(len(payload)))
        if self.close_connection:  # a failure, or the client's own Connection: close
            self.send_header("Connection", "close")
        # Head and body in one write (with Nagle's algorithm off): a second small write would wait
        # for the client's delayed ACK of the first.
        self._headers_buffer.append(b"\r\n")
        if self.command != "HEAD" and code not in _NO_BODY:
            self._headers_buffer.append(payload)
        self.flush_headers()


class KeepAliveMotoServer(ThreadedMotoServer):
    """``ThreadedMotoServer`` on ``KeepAliveHandler``."""

    def _server_entry(self) -> None:
        app = DomainDispatcherApplication(create_backend_app)
        self._server = make_server(self._ip_address, self._port, app, True, request_handler=KeepAliveHandler)
        self._server_ready_event.set()
        self._server.serve_forever()
