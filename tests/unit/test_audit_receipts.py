"""Chunk receipts (functions.core.audit.append_receipt via chunk_lifecycle, appended by the appender's
logic in the fake audit log): one per counted chunk, however often the chunk is recorded or
redelivered; a send that fails after the count keeps the count, and the redelivered message sends
the receipt again."""

import hashlib

import pytest

from functions.core import audit, chunk_lifecycle, schema
from functions.core.errors import Throttled
from functions.core.results import Parts
from tests.fakes.aws import fake_stores, throttle
from tests.unit.test_chunk_lifecycle import batch, message

OUT = b'{"id":"r1"}\n{"id":"r2"}\n'


def write_parts(stores, chunk: int, attempt: str) -> Parts:
    stores.objects.put(schema.chunk_part_key("acme", "batch_1", chunk, attempt, "out"), OUT)
    stores.objects.put(schema.chunk_part_key("acme", "batch_1", chunk, attempt, "err"), b"")
    return Parts(attempt, 2, 0)


def receipts(stores) -> list[audit.AuditRecord]:
    return [r for r in stores.audit_log.records("acme") if r.action == audit.CHUNK_RECEIPT]


def test_a_counted_chunk_gets_one_receipt_with_its_digest_and_usage():
    stores = fake_stores()
    stores.batches.put(batch())
    usage = chunk_lifecycle.Usage(input_tokens=7, output_tokens=3)
    parts = write_parts(stores, 0, "a0")
    assert chunk_lifecycle.record_chunk(stores, message(0), parts=parts, usage=usage, now=5).counted
    # A duplicate count (another attempt's parts, a redelivery): no second receipt.
    again = chunk_lifecycle.record_chunk(stores, message(0), parts=write_parts(stores, 0, "b0"), usage=usage, now=6)
    assert not again.counted
    assert not chunk_lifecycle.signal_if_all_counted(stores, message(0))

    [receipt] = receipts(stores)
    details = receipt.details
    assert (details["batch"], details["chunk"], details["attempt"]) == ("batch_1", 0, "a0")
    assert (details["first_line"], details["line_count"], details["completed"], details["failed"]) == (1, 2, 2, 0)
    assert details["out_sha256"] == hashlib.sha256(OUT).hexdigest()
    assert details["err_sha256"] == hashlib.sha256(b"").hexdigest()
    assert details["usage"]["input_tokens"] == 7 and details["usage"]["output_tokens"] == 3
    assert audit.verify(stores.audit_log.records("acme")) is None


def test_a_chunk_not_counted_gets_no_receipt():
    stores = fake_stores()
    stores.batches.put(batch(accepting=False))
    chunk_lifecycle.record_chunk(
        stores, message(0), parts=write_parts(stores, 0, "a0"), usage=chunk_lifecycle.Usage(), now=5
    )
    assert receipts(stores) == []


def test_a_failed_send_keeps_the_count_and_the_redelivery_sends_the_receipt():
    stores = fake_stores()
    stores.batches.put(batch(chunk_count=1))
    stores.faults.fail("audit.record", throttle())  # SQS throttled past the SDK retries
    with pytest.raises(Throttled):
        chunk_lifecycle.record_chunk(
            stores, message(0), parts=write_parts(stores, 0, "a0"), usage=chunk_lifecycle.Usage(), now=5
        )
    assert stores.batches.counted_chunk("acme", "batch_1", 0) is not None  # the count stands
    assert stores.workflows.signals == [("token-1", {"outcome": "complete"})]  # signalled first
    assert receipts(stores) == []
    # The message comes back; the worker sees the chunk counted and only re-signals.
    chunk_lifecycle.signal_if_all_counted(stores, message(0))
    chunk_lifecycle.signal_if_all_counted(stores, message(0))
    [receipt] = receipts(stores)
    assert receipt.details["attempt"] == "a0" and receipt.at == 5


def test_the_counting_worker_s_receipt_names_the_digests_it_wrote_without_reading_the_parts_back():
    from functions.core.results import write_parts as write_real_parts
    from functions.core.wire import BatchOutputLine

    stores = fake_stores()
    stores.batches.put(batch())
    lines = [
        BatchOutputLine.model_validate(
            {
                "id": f"r{i}",
                "custom_id": f"c{i}",
                "response": {"status_code": 200, "request_id": "q", "body": {}},
                "error": None,
            }
        )
        for i in range(2)
    ]
    parts = write_real_parts(stores.objects, message(0), lines)
    reads = stores.faults.calls["objects.get"], stores.faults.calls["objects.list_keys"]
    assert chunk_lifecycle.record_chunk(stores, message(0), parts=parts, usage=chunk_lifecycle.Usage(), now=5).counted
    assert (stores.faults.calls["objects.get"], stores.faults.calls["objects.list_keys"]) == reads  # none
    [receipt] = receipts(stores)
    out_key = schema.chunk_part_key("acme", "batch_1", 0, parts.attempt, "out")
    assert receipt.details["out_sha256"] == hashlib.sha256(stores.objects.get(out_key)).hexdigest()
    # Every line succeeded: no error part was written, and its digest is null, as an absent part's.
    assert receipt.details["err_sha256"] is None
    assert stores.objects.list_keys(schema.chunk_part_key("acme", "batch_1", 0, parts.attempt, "err")) == []
