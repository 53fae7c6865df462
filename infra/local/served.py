"""An HTTP server on loopback served from a thread: the shape of every local front."""

import threading
from http.server import ThreadingHTTPServer


class ServedHttp:
    """Start a ``ThreadingHTTPServer`` in a daemon thread; stop it and join the thread."""

    def __init__(self) -> None:
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    def serve(self, server: ThreadingHTTPServer, name: str, poll: float = 0.1) -> int:
        """Serve ``server`` in the background; returns the port it listens on."""
        server.daemon_threads = True
        self._server = server
        self._thread = threading.Thread(target=server.serve_forever, args=(poll,), name=name, daemon=True)
        self._thread.start()
        return server.server_address[1]

    def shutdown(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
        if self._thread is not None:
            self._thread.join()
            self._thread = None
