"""``harness.run_one_chunk``: one chunk through the worker's real chunk path on moto's stores,
as the workflow and DLQ tests use it (engine rejections, a cancel while the chunk runs, a
redelivery of a counted chunk)."""

import json

import pytest

from functions.core import schema
from tests.fakes.engine import REJECTED, InProcessEngine, rejecting
from tests.integration.batch_helpers import line, run_ingest, submit, take_work
from tests.integration.worker.harness import run_one_chunk

pytestmark = pytest.mark.settings(chunk_max_lines=2)


def start(client, n):
    batch = submit(client, ("\n".join(line(i) for i in range(n)) + "\n").encode())
    run_ingest()
    return batch


def test_a_chunk_with_a_rejected_line(client, stores, deployed):
    batch = start(client, 2)
    (only,) = take_work(deployed)
    report = run_one_chunk(stores, only, engine=InProcessEngine(rejecting("hi 1")))
    assert (report.completed, report.failed) == (1, 1) and report.outcome.counted and report.outcome.last
    marker = stores.batches.counted_chunk("acme", batch.id, 0)
    err = stores.objects.get(schema.chunk_part_key("acme", batch.id, 0, marker.attempt, "err")).decode().splitlines()
    (rejected,) = [json.loads(l) for l in err]
    assert rejected["custom_id"] == "req-1" and rejected["response"]["status_code"] == 400
    assert rejected["response"]["body"] == REJECTED
    record = stores.batches.get("acme", batch.id)
    assert (record.completed, record.failed, record.input_tokens, record.output_tokens) == (1, 1, 10, 3)


def test_a_cancel_while_the_chunk_runs_still_counts_it(client, stores, deployed):
    batch = start(client, 4)
    first, second = take_work(deployed)
    report = run_one_chunk(stores, first, during=lambda: client.batches.cancel(batch.id))
    assert report.outcome.counted and stores.batches.get("acme", batch.id).status == "cancelling"
    assert run_one_chunk(stores, second).skipped  # a chunk started after the cancel runs nothing


def test_a_counted_chunk_delivered_again_runs_nothing(client, stores, deployed):
    batch = start(client, 2)
    (only,) = take_work(deployed)
    assert run_one_chunk(stores, only).outcome.counted
    engine = InProcessEngine()
    assert run_one_chunk(stores, only, engine=engine).skipped and engine.requests == []
    assert stores.batches.get("acme", batch.id).completed == 2


def test_a_chunk_started_before_a_cancel_finishes_and_counts(client, stores, deployed):
    batch = start(client, 4)
    first, second = take_work(deployed)
    client.batches.cancel(batch.id)
    assert run_one_chunk(stores, first).skipped  # not started before the cancel: runs nothing
    report = run_one_chunk(stores, second, started=True)  # a worker was on it: it is counted
    assert report.outcome.counted and stores.batches.get("acme", batch.id).completed == 2
