"""A moto server on a free loopback port for the benchmarks that need AWS stand-ins in child
processes too: ``with moto_server() as env:`` sets ``os.environ`` (endpoint, credentials, region)
and yields the same variables for children."""

import contextlib
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

from tests.helpers import free_port


@contextlib.contextmanager
def moto_server(pids: list[int] | None = None) -> Iterator[dict[str, str]]:
    """``pids``, when given, gets the server's process id (to read its memory)."""
    port = free_port()
    moto = subprocess.Popen(
        [str(Path(sys.executable).parent / "moto_server"), "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    if pids is not None:
        pids.append(moto.pid)
    env = {
        **os.environ,
        "AWS_ENDPOINT_URL": f"http://127.0.0.1:{port}",
        "AWS_ACCESS_KEY_ID": "bench",
        "AWS_SECRET_ACCESS_KEY": "bench",
        "AWS_DEFAULT_REGION": "us-east-1",
    }
    os.environ.update(env)
    try:
        for _ in range(100):
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                break
            except OSError:
                time.sleep(0.1)
        yield env
    finally:
        moto.terminate()
        moto.wait()
