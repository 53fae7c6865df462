"""The DLQ handler's edge cases (the poison-chunk path end to end is in test_worker_faults):
a dead-lettered chunk that a worker did count keeps its results; a closed batch is left alone;
a message that is not a work message is dropped."""

import pytest

from functions.chunk_dlq import handler as chunk_dlq_handler
from functions.chunk_dlq.logic import fail_chunk
from functions.core import clients, schema
from infra.local.pollers import drain_queue
from tests.builders import set_batch
from tests.integration.batch_helpers import line, run_ingest, submit, take_work
from tests.integration.worker.harness import dlq_url, queue_depth, run_one_chunk

pytestmark = pytest.mark.settings(chunk_max_lines=2)


def dead_letter(deployed, bodies):
    dlq = dlq_url(deployed.models["test-chat"].queue_url)
    for body in bodies:
        clients.client("sqs").send_message(QueueUrl=dlq, MessageBody=body)
    handled = drain_queue(clients.client("sqs"), dlq, chunk_dlq_handler.handler, name="dlq")
    assert queue_depth(dlq) == (0, 0)
    return handled


def test_a_chunk_already_counted_keeps_its_results(client, stores, deployed):
    batch = submit(client, ("\n".join(line(i) for i in range(4)) + "\n").encode())
    run_ingest()
    first, second = take_work(deployed)
    assert run_one_chunk(stores, first).outcome.counted
    counted = stores.batches.counted_chunk("acme", batch.id, 0)
    key = schema.chunk_part_key("acme", batch.id, 0, counted.attempt, "out")
    before = stores.objects.get(key)
    assert dead_letter(deployed, [first.model_dump_json()]) == 1
    assert stores.objects.get(key) == before
    assert stores.batches.counted_chunk("acme", batch.id, 0) == counted
    assert stores.batches.get("acme", batch.id).completed == 2
    # the other chunk, dead-lettered, is failed and counted
    outcome = fail_chunk(stores, second, now=0)
    assert (outcome.action, outcome.failed, outcome.last) == ("recorded", 2, True)
    assert stores.batches.get("acme", batch.id).failed == 2


def test_a_closed_batch_is_left_alone(client, stores, deployed):
    batch = submit(client, (line(0) + "\n").encode())
    run_ingest()
    (only,) = take_work(deployed)
    set_batch(stores, "acme", batch.id, accepting=False)
    assert fail_chunk(stores, only, now=0).action == "batch_closed"
    assert stores.objects.list_keys(schema.batch_prefix("acme", batch.id) + "parts/") == []


def test_a_message_that_is_not_a_work_message_is_dropped(deployed, stores):
    assert dead_letter(deployed, ["not json", '{"batch_id": "x"}']) == 2


def test_a_dead_lettered_chunk_keeps_its_checkpointed_lines(client, stores, deployed):
    """The worker checkpointed the chunk's first line, then the engine died on the second (the
    chunk stays uncounted); the DLQ, the last resort, keeps that line's answer and fails the rest."""
    import pytest as _pytest

    from functions.core.wire import BatchOutputLine
    from gpu_worker.attempt import RunPolicy
    from gpu_worker.engine_client import EngineDown
    from tests.fakes.engine import CrashingEngine

    batch = submit(client, ("\n".join(line(i) for i in range(4)) + "\n").encode())
    run_ingest()
    first, second = take_work(deployed)
    with _pytest.raises(EngineDown):
        run_one_chunk(
            stores,
            second,
            engine=CrashingEngine("hi 3", crash_after=1),
            policy=RunPolicy(checkpoint_min_seconds=0, checkpoint_lines=1),
        )
    assert stores.batches.chunk_run("acme", batch.id, 1).written() == 1
    assert run_one_chunk(stores, first).outcome.counted
    assert dead_letter(deployed, [second.model_dump_json()]) == 1
    marker = stores.batches.counted_chunk("acme", batch.id, 1)

    def read(kind):
        return [
            BatchOutputLine.model_validate_json(l)
            for l in stores.objects.get(schema.chunk_part_key("acme", batch.id, 1, marker.attempt, kind)).splitlines()
        ]

    assert [l.custom_id for l in read("out")] == ["req-2"]
    assert [(l.custom_id, l.error.code) for l in read("err")] == [("req-3", "server_error")]
    done = stores.batches.get("acme", batch.id)
    assert (done.completed, done.failed, done.chunks_done) == (3, 1, 2)
