"""1,000 GPUs on one batch within DynamoDB's per-partition limits (docs/benchmarks.md, "1,000 GPUs
on one batch"; docs/lifecycle.md, "Counting shards").

OpenAI's largest batch (50,000 chat lines) goes through the real API and ingest of a deployment
whose model may run 1,000 GPU tasks (``ModelRoute.max_engines``), so ingest cuts it into a chunk
per GPU (1,000 chunks of 50 lines, counted on 32 shards). Then 1,000 GPUs take its chunks through
the worker's real chunk path (``ChunkRunner``: start, the marker and run-record reads, the
attempt, parts, the count, the fold, the signal; an instant engine) on a simulated clock: each
GPU receives a chunk within the first second and commits it 50 lines later at an H100's chat
rate. Every DynamoDB request is metered on moto by DynamoDB's own rules and charged to the second
the simulated GPU makes it (``tests/fakes/partition_limits.py``): no partition may take more than
1,000 write or 3,000 read units in any second, or the run fails where AWS would throttle.

The same run with every chunk counted on the batch's own item (no shards) is refused by the
meter: the batch item's partition is the limit, as the arithmetic says."""

from __future__ import annotations

import asyncio
import dataclasses
import heapq
import json
import time

import pytest

from functions.core import clients, ids, limits, schema
from functions.core.aws.sqs import SqsQueue
from functions.core.messages import WorkMessage
from functions.core.ports import Stores
from functions.core.settings import ModelRoute, Settings
from tests.builders import file_record
from tests.chunks import process_chunk
from tests.conftest import TEST_SETTINGS
from tests.fakes.engine import InProcessEngine
from tests.fakes.partition_limits import (
    READ_UNITS_PER_SECOND,
    WRITE_UNITS_PER_SECOND,
    PartitionLimitExceeded,
    PartitionLimits,
)
from tests.integration.batch_helpers import CHAT, run_ingest

GPUS = 1_000
LINES = 50_000
#: An H100 on an 8B chat model, 64-token lines (docs/benchmarks.md, "Per-GPU control-plane rate").
LINES_PER_SECOND_PER_GPU = 90.6

FLEET = TEST_SETTINGS.models | {"test-chat": ModelRoute(endpoints=(CHAT,), max_engines=GPUS)}


def _input() -> bytes:
    rows = (
        {
            "custom_id": f"req-{i}",
            "method": "POST",
            "url": CHAT,
            "body": {"model": "test-chat", "messages": [{"role": "user", "content": f"line {i}"}], "max_tokens": 64},
        }
        for i in range(LINES)
    )
    return "".join(json.dumps(r) + "\n" for r in rows).encode()


def _run_fleet(stores: Stores, meter: PartitionLimits, messages: list[WorkMessage]) -> int:
    """Every chunk through the worker's chunk path on its GPU's clock: a GPU takes the next chunk
    when it is free (the first ones within the first second, as their receives spread), its start
    calls at that time, its commit calls when its lines are done. Returns the chunks counted."""
    # Its receipts go to the audit queue (SQS, not the table; moto's queue slows with every message
    # it holds): the chunk path without them makes the same table requests.
    stores = dataclasses.replace(stores, audit_log=None)
    free = [(gpu / GPUS, gpu) for gpu in range(GPUS)]
    heapq.heapify(free)
    engine = InProcessEngine()
    counted = 0
    for message in messages:
        start, gpu = heapq.heappop(free)
        end = start + message.line_count / LINES_PER_SECOND_PER_GPU
        phase = {"at": start}

        async def io(fn, *args, **kwargs):
            meter.now = phase["at"]
            return fn(*args, **kwargs)

        def committing(end: float = end) -> None:
            phase["at"] = end

        report = asyncio.run(
            process_chunk(
                stores, message, engine, io=io, max_line_bytes=TEST_SETTINGS.max_line_bytes, on_commit=committing
            )
        )
        counted += bool(report.outcome and report.outcome.counted)
        heapq.heappush(free, (end, gpu))
    return counted


def _batch_on_a_fleet(client, stores: Stores, monkeypatch) -> tuple[str, list[WorkMessage]]:
    """The batch created through the API, from a file stored as an upload would leave it (8 MB is
    over what a Lambda takes in one request: the streaming front's path, not this test's), and
    ingested by the real handler. Its work messages are taken as ingest sends them, at the queue
    adapter: moto's SQS scans every message it holds on each receive (a minute for these 1,000),
    which is not what this test measures."""
    sent: list[str] = []
    monkeypatch.setattr(SqsQueue, "send", lambda self, bodies: sent.extend(bodies))
    data = _input()
    record = file_record(id=ids.new_id(ids.FILE), bytes=len(data), created_at=int(time.time()))
    stores.objects.put(record.s3_key, data)
    stores.files.create(record)
    batch = client.batches.create(input_file_id=record.id, endpoint=CHAT, completion_window="24h")
    assert run_ingest() == 1
    return batch.id, sorted((WorkMessage.model_validate_json(b) for b in sent), key=lambda m: m.chunk)


@pytest.mark.settings(models=FLEET)
def test_a_thousand_gpus_on_one_batch_stay_within_every_partition_s_limits(client, stores, deployed, monkeypatch):
    table = clients.dynamodb_table(deployed.table_name)
    meter = PartitionLimits(deployed.table_name).install(table.meta.client)
    batch_id, messages = _batch_on_a_fleet(client, stores, monkeypatch)
    batch = stores.batches.get("acme", batch_id)
    assert (batch.status, batch.chunk_count, batch.count_shards) == ("in_progress", GPUS, 32)
    assert [m.line_count for m in messages] == [LINES // GPUS] * GPUS

    assert _run_fleet(stores, meter, messages) == GPUS
    batch = stores.batches.get("acme", batch_id)
    assert (batch.chunks_done, batch.completed, batch.failed) == (GPUS, LINES, 0)
    assert meter.excess == []
    # The batch's item took the 32 folds, not a write per chunk; each shard's partition its chunks'.
    batches_pk = schema.batches_pk("acme")
    assert meter.peak_of("write", batches_pk) < 0.2 * WRITE_UNITS_PER_SECOND
    write_peak, hottest, _ = meter.peak("write")
    read_peak, _, _ = meter.peak("read")
    assert write_peak <= WRITE_UNITS_PER_SECOND and read_peak <= READ_UNITS_PER_SECOND
    assert hottest.startswith(schema.chunks_pk("acme", batch_id))
    print(
        f"\n1,000 GPUs, 1,000 chunks of 50 lines on 32 shards: {sum(meter.operations.values())} DynamoDB requests "
        f"({dict(meter.operations)}); peak {write_peak:g} WCU/s on {hottest}, "
        f"{meter.peak_of('write', batches_pk):g} WCU/s on the batch item's partition, peak {read_peak:g} RCU/s"
    )


@pytest.mark.settings(models=FLEET)
def test_without_shards_the_batch_item_s_partition_is_the_limit(client, stores, deployed, monkeypatch):
    monkeypatch.setattr(limits, "COUNT_SHARD_CHUNKS", 10**6)  # every chunk counted on the batch's item
    table = clients.dynamodb_table(deployed.table_name)
    meter = PartitionLimits(deployed.table_name).install(table.meta.client)
    batch_id, messages = _batch_on_a_fleet(client, stores, monkeypatch)
    assert stores.batches.get("acme", batch_id).count_shards == 1
    with pytest.raises(PartitionLimitExceeded):
        _run_fleet(stores, meter, messages)
    assert meter.excess and {e.pk for e in meter.excess} == {schema.batches_pk("acme")}
    assert all(e.kind == "write" and e.second == 0 for e in meter.excess)
    # It was refused within the first second's starts, long before the thousandth GPU.
    opened = len(stores.batches.chunk_states("acme", batch_id)[1])
    assert 0 < opened < GPUS


def test_the_meter_charges_as_dynamodb_documents(stores, deployed):
    """The rules themselves: 1 write unit per KB (the larger of before and after), twice in a
    transaction; 1 strongly consistent read unit per 4 KB, an absent item 1."""
    from functions.core.aws.dynamodb import Put, Table, Update

    resource = clients.dynamodb_table(deployed.table_name)
    meter = PartitionLimits(deployed.table_name).install(resource.meta.client)
    t = Table(resource)
    meter.now = 7.5
    t.put({schema.PK: "P#1", schema.SK: "a", "blob": "x" * 3000})  # about 3 KB: 3 units
    t.get("P#1", "a")  # under 4 KB: 1 unit
    t.get("P#1", "none")  # absent: 1 unit
    t.transact([Update("P#1", "a", values={"blob": "y"}), Put({schema.PK: "P#2", schema.SK: "b"})])
    assert meter.used[("P#1", 7, "write")] == 3 + 2 * 3  # the update is charged the item before it
    assert meter.used[("P#1", 7, "read")] == 2
    assert meter.used[("P#2", 7, "write")] == 2
    meter.now = 8.0
    with pytest.raises(PartitionLimitExceeded):
        for i in range(WRITE_UNITS_PER_SECOND + 1):
            t.put({schema.PK: "P#3", schema.SK: f"{i}"})
    assert [(e.pk, e.second, e.kind, e.units) for e in meter.excess] == [("P#3", 8, "write", 1001)]
