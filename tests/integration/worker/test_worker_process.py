"""`python -m gpu_worker` as a real process, sent a real SIGTERM mid-chunk, against moto in server
mode (the process reaches it over loopback) and the fake engine."""

import asyncio
import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.request

import pytest
from moto.server import ThreadedMotoServer

from functions.core import clients, deps, schema
from functions.core.aws import stores_from_settings
from functions.core.messages import WorkMessage
from functions.core.ports import Stores
from functions.core.records import BatchRecord
from infra.local import atomic_dynamodb, moto_query
from infra.local.resources import create_resources
from tests.builders import cut, running_batch
from tests.conftest import TEST_SETTINGS
from tests.fakes.engine import FakeEngine, chat_answer
from tests.integration.worker.engines import DIRECT
from tests.integration.worker.engines import REPO as ENGINES_REPO
from tests.integration.worker.harness import queue_depth, wait_until

#: The checkout's root: the worker process runs this checkout's code.
REPO = str(ENGINES_REPO)


@pytest.fixture
def moto_server(monkeypatch):
    atomic_dynamodb.install()  # the worker commits from several threads (infra/local/atomic_dynamodb.py)
    moto_query.install()  # as the local deployment's moto (infra/local/moto_query.py)
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    endpoint = f"http://127.0.0.1:{server.get_host_and_port()[1]}"
    monkeypatch.setenv("AWS_ENDPOINT_URL", endpoint)
    deps.reset()
    yield endpoint
    deps.reset()
    # moto's backends are per process, not per server: leave nothing for the next test.
    DIRECT.open(urllib.request.Request(f"{endpoint}/moto-api/reset", method="POST"), timeout=10)
    server.stop()


def line(i):
    return json.dumps(
        {
            "custom_id": f"req-{i}",
            "method": "POST",
            "url": "/v1/chat/completions",
            "body": {"model": "test-chat", "messages": [{"role": "user", "content": f"hi {i}"}]},
        }
    )


@pytest.fixture
def batch(moto_server):
    """An in_progress batch of 4 lines in 2 chunks, their 2 work messages queued."""
    settings = create_resources(TEST_SETTINGS, clients.client, prefix="proc-test")
    stores = stores_from_settings(settings)
    rows = [(line(i) + "\n").encode() for i in range(4)]
    record = running_batch(
        id="batch_proc", input_file_id="file-x", created_at=int(time.time()), total=4, chunk_count=2, model="test-chat"
    )
    stores.objects.put(record.input_key, b"".join(rows))
    stores.batches.create(record)
    messages = [record.work_message(chunk) for chunk in cut(rows, 2)]
    url = settings.models["test-chat"].queue_url
    for m in messages:
        clients.client("sqs").send_message(QueueUrl=url, MessageBody=m.model_dump_json())
    return settings, stores, url


def start_worker(settings, endpoint, engine_url, **worker_env):
    env = {k: v for k, v in os.environ.items() if "PROXY" not in k.upper()}
    env.update(settings.to_env())
    env.update(
        {
            "AWS_ENDPOINT_URL": endpoint,
            "PYTHONPATH": REPO,
            "WORKER_MODEL": "test-chat",
            "WORKER_ENGINE_URL": engine_url,
            "WORKER_MAX_IN_FLIGHT": "2",
            "WORKER_MAX_OPEN_CHUNKS": "1",
            "WORKER_POLL_WAIT_SECONDS": "1",
            **{f"WORKER_{k.upper()}": str(v) for k, v in worker_env.items()},
        }
    )
    return subprocess.Popen(
        [sys.executable, "-m", "gpu_worker"],
        env=env,
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def test_sigterm_mid_chunk_past_the_drain_time_releases_the_message(batch, moto_server):
    settings, stores, url = batch
    fake = FakeEngine(lambda path, body, seen: "hang").start()
    try:
        process = start_worker(settings, moto_server, fake.url, drain_seconds=0.5)
        # Chunk 0's 2 lines fill the engine (cap 2); as they are all in it, the worker also takes
        # chunk 1, whose lines wait for slots (a chunk's tail never keeps new lines out).
        wait_until(
            lambda: len(fake.requests) == 2 and queue_depth(url) == (0, 2),
            timeout=30,
            what="chunk 0 in the engine, chunk 1 held",
        )
        process.send_signal(signal.SIGTERM)
        output, _ = process.communicate(timeout=30)
    finally:
        fake.stop()
    assert process.returncode == 0, output
    assert "released on shutdown" in output and '"stopped"' in output
    assert queue_depth(url) == (2, 0)  # visible at once for another worker
    assert stores.batches.get("acme", "batch_proc").chunks_done == 0


def test_sigterm_mid_chunk_finishes_what_it_holds_and_exits_cleanly(batch, moto_server):
    settings, stores, url = batch
    stopping = threading.Event()

    async def respond(path, body, seen):
        while not stopping.is_set():  # answered only once the worker has taken the SIGTERM
            await asyncio.sleep(0.01)
        return 200, chat_answer(body)

    fake = FakeEngine(respond).start()
    try:
        process = start_worker(settings, moto_server, fake.url, drain_seconds=30)
        # Both messages received *and* both chunks' attempts opened (so held by the worker, not in a
        # receive whose answer it has yet to read: a message received while stopping is released).
        wait_until(
            lambda: (
                len(fake.requests) == 2
                and queue_depth(url) == (0, 2)
                and set(stores.batches.chunk_states("acme", "batch_proc")[1]) == {0, 1}
            ),
            timeout=30,
            what="chunk 0 in the engine, chunk 1 held",
        )
        process.send_signal(signal.SIGTERM)
        before = []
        for log_line in process.stdout:  # its log says when the stop is taken
            before.append(log_line)
            if '"stop requested: draining"' in log_line:
                break
        stopping.set()
        rest, _ = process.communicate(timeout=30)
        output = "".join(before) + rest
    finally:
        stopping.set()
        fake.stop()
    assert process.returncode == 0, output
    assert len(fake.requests) == 4  # the two chunks it held, each line once
    batch_record = stores.batches.get("acme", "batch_proc")
    assert batch_record.chunks_done == 2 and batch_record.completed == 4  # finished what it held
    assert queue_depth(url) == (0, 0)  # both messages deleted
    assert '"chunk done"' in output and '"worker stats"' in output and '"_aws"' in output  # logs + EMF
