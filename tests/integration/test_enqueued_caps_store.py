"""The enqueued-cap and budget transactions (docs/governance.md) on the DynamoDB adapter (moto) and
the fake, held to one contract: ``lifecycle.start`` with a reservation moves the batch and ADDs to
its (tenant, model) counter in one transaction, never past a cap and never twice; the write that
makes the batch terminal (a lone one, or one with its files) releases the reservation in the same
transaction, exactly once (``lifecycle.settle``); a batch without a reservation ends releasing nothing; a
counted chunk's budget charge is written with its audit receipt, once."""

import pytest

from functions.core import lifecycle, schema
from functions.core.budgets import Spent
from functions.core.errors import ConditionFailed
from functions.core.lifecycle import Change
from functions.core.ports import Stores
from functions.core.records import BatchRecord, FileRecord
from functions.core.tenants import Reservation
from tests.builders import batch_record
from tests.fakes.aws import FakeAuditLog, fake_stores


@pytest.fixture(params=["moto", "fake"])
def ports(request: pytest.FixtureRequest) -> Stores:
    if request.param == "fake":
        return fake_stores()
    return request.getfixturevalue("stores")


def new_batch(batch_id: str, **over) -> BatchRecord:
    return batch_record(**{"id": batch_id, "expires_at": 200, **over})


def held(requests: int, tokens: int) -> Reservation:
    return Reservation(tenant="acme", model="m", requests=requests, tokens=tokens, max_requests=10, max_tokens=1000)


def reserve(ports: Stores, batch_id: str, reservation: Reservation) -> BatchRecord:
    return ports.batches.transition(
        "acme", batch_id, lifecycle.start(150, values={"model": "m"}, reservation=reservation)
    )


def test_reserve_moves_and_counts_in_one_transaction_and_never_twice(ports: Stores):
    ports.batches.create(new_batch("b1"))
    moved = reserve(ports, "b1", held(4, 600))
    assert (
        moved.status,
        moved.reserved_model,
        moved.reserved_requests,
        moved.reserved_tokens,
        moved.holds_reservation,
    ) == ("in_progress", "m", 4, 600, True)
    assert ports.batches.enqueued("acme", "m") == (4, 600)
    with pytest.raises(ConditionFailed):  # a duplicate ingest: the batch is no longer validating
        reserve(ports, "b1", held(4, 600))
    assert ports.batches.enqueued("acme", "m") == (4, 600)


def test_reserve_never_passes_a_cap_and_a_refusal_writes_nothing(ports: Stores):
    ports.batches.create(new_batch("b1"))
    ports.batches.create(new_batch("b2"))
    reserve(ports, "b1", held(4, 600))
    with pytest.raises(ConditionFailed):  # 600 + 401 > 1000
        reserve(ports, "b2", held(1, 401))
    with pytest.raises(ConditionFailed):  # 4 + 7 > 10
        reserve(ports, "b2", held(7, 1))
    assert ports.batches.get("acme", "b2").status == "validating"
    assert ports.batches.enqueued("acme", "m") == (4, 600)
    reserve(ports, "b2", held(6, 400))  # exactly at both caps
    assert ports.batches.enqueued("acme", "m") == (10, 1000)


def test_a_terminal_update_releases_once(ports: Stores):
    ports.batches.create(new_batch("b1"))
    reserve(ports, "b1", held(4, 600))
    done = ports.batches.transition("acme", "b1", lifecycle.fail_without_files(160, []))
    assert (done.status, done.holds_reservation, done.reserved_tokens) == ("failed", None, 600)
    assert ports.batches.enqueued("acme", "m") == (0, 0)
    with pytest.raises(ConditionFailed):  # its own condition still decides
        ports.batches.transition("acme", "b1", lifecycle.fail_without_files(170, []))
    # a terminal write without a status condition: written, nothing released again
    ports.batches.transition("acme", "b1", Change(values={"status": "failed"}, defaults={"failed_at": 180}))
    assert ports.batches.enqueued("acme", "m") == (0, 0)


def test_finish_creates_the_files_and_releases_once(ports: Stores):
    ports.batches.create(new_batch("b1"))
    reserve(ports, "b1", held(4, 600))
    ports.batches.transition(
        "acme",
        "b1",
        lifecycle.close(
            160,
            closed_for="complete",
            planned_output_file_id="file-out",
            planned_error_file_id="file-err",
            finalizing=True,
        ),
    )
    out = FileRecord(
        tenant="acme",
        id="file-out",
        filename="o.jsonl",
        purpose="batch_output",
        bytes=3,
        created_at=1,
        s3_key=schema.file_key("acme", "file-out"),
    )
    final = lifecycle.finish(170, status="completed", closed_from="finalizing", values={"output_file_id": "file-out"})
    ports.batches.transition("acme", "b1", final, files=[out])
    assert ports.batches.enqueued("acme", "m") == (0, 0)
    assert ports.files.get("acme", "file-out", now=2) is not None
    retried = Change(values=final.values, expect={"status": ("finalizing", "completed")})  # a retried finish
    ports.batches.transition("acme", "b1", retried, files=[out])
    assert ports.batches.enqueued("acme", "m") == (0, 0)
    assert ports.batches.get("acme", "b1").status == "completed"


def test_a_batch_without_a_reservation_ends_as_before(ports: Stores):
    ports.batches.create(new_batch("b1", status="in_progress"))
    done = ports.batches.transition("acme", "b1", lifecycle.fail_without_files(9, []))
    assert done.status == "failed" and ports.batches.enqueued("acme", "m") == (0, 0)
    with pytest.raises(ConditionFailed):
        ports.batches.transition("acme", "b1", lifecycle.fail_without_files(10, []))


def test_the_count_charges_nothing_its_receipt_charges_the_budget_once(request: pytest.FixtureRequest, ports: Stores):
    """The counting roles write no budget item: the appender charges the marker's spend when it
    appends the chunk's receipt, in that transaction, so once however often the receipt comes."""
    from functions.core import audit
    from functions.core.messages import WorkMessage
    from functions.core.records import ChunkRecord

    drain = (lambda: 0) if isinstance(ports.audit_log, FakeAuditLog) else request.getfixturevalue("appender").drain
    ports.batches.create(new_batch("b1", status="in_progress", accepting=True, chunk_count=3))
    month = "MONTH#2026-12"

    def count(chunk: int, budget: str | None = "month") -> bool:
        marker = ChunkRecord(
            tenant="acme",
            batch_id="b1",
            chunk=chunk,
            attempt="a",
            completed=1,
            failed=0,
            output_tokens=30,
            spent_output_tokens=45,
            input_tokens=5,
            recorded_at=1_796_083_200,
            expires_at=10**10,
            budget_period=budget,
        )
        before = ports.batches.budget_used("acme", month)
        counted = ports.batches.count_chunk(marker)
        assert ports.batches.budget_used("acme", month) == before  # never by the count itself
        message = WorkMessage(
            batch_id="b1",
            tenant="acme",
            chunk=chunk,
            input_key="k",
            byte_start=0,
            byte_end=1,
            first_line=chunk + 1,
            line_count=1,
            endpoint="/v1/chat/completions",
            model="m",
            expires_at=10**10,
        )
        audit.append_receipt(ports, message, ports.batches.counted_chunk("acme", "b1", chunk) or marker, at=1)
        drain()
        return counted

    assert count(0)
    assert ports.batches.budget_used("acme", month) == Spent(
        output_tokens=45, input_tokens=5
    )  # the spend, not the usage
    assert not count(0)  # a duplicate count, its receipt again: charged once
    assert count(1, budget=None)  # no budget: not charged
    assert ports.batches.budget_used("acme", month) == Spent(output_tokens=45, input_tokens=5)
    ports.batches.transition("acme", "b1", Change(values={"accepting": False}))
    assert not count(2)  # a late chunk: not counted, its receipt refused, nothing charged
    assert ports.batches.budget_used("acme", month) == Spent(output_tokens=45, input_tokens=5)
    assert ports.batches.get("acme", "b1").output_tokens == 60
