"""Enqueued caps under every injected fault (docs/governance.md): each row of the
fault-injection suite (tests/unit/test_fault_matrix.py) run again for a tenant with enqueued caps
on the batch's model. Whatever the fault and wherever the batch ends (completed, failed, expired,
cancelled; by the workflow, a retried task, the sweeper or a DLQ consumer), its reservation is
released exactly once: the counter is back at zero and the batch no longer holds it. Rows whose
fault targets the uncapped move (``batches.update`` #0 at ingest) see the reservation's
``batches.reserve`` instead; a reserve fault is added as its own rows."""

from __future__ import annotations

import pytest

from functions.core.tenants import TenantPolicy
from functions.core.wire import TERMINAL_STATUSES
from tests.fakes.aws import conflict
from tests.unit.fault_driver import BATCH, TENANT, Driver, Fault, Killed
from tests.unit.test_fault_matrix import CASES, access_denied, responder

CAPPED = TenantPolicy(tenant=TENANT, max_enqueued_requests={"chat": 100}, max_enqueued_tokens={"chat": 100_000})


def run_capped(case_setup, respond="ok", order="register_first") -> Driver:
    d = Driver(respond=responder(respond), order=order)
    d.stores.tenants.put(CAPPED)
    case_setup(d)
    d.run()
    return d


def assert_released(d: Driver) -> None:
    batch = d.batch()
    assert batch.status in TERMINAL_STATUSES, f"stuck in {batch.status}; log {d.log[-12:]}"
    assert d.stores.batches.enqueued(TENANT, "chat") == (0, 0), (batch.status, d.log[-12:])
    assert not batch.holds_reservation


@pytest.mark.parametrize("case", [pytest.param(c, id=c.id) for c in CASES if not c.xfail])
def test_every_fault_row_releases_the_reservation_once(case):
    d = run_capped(case.setup, case.respond, case.order)
    assert_released(d)
    if d.batch().in_progress_at is not None:  # it was reserved, then released
        assert d.batch().reserved_model == "chat" and d.batch().reserved_requests == 6


@pytest.mark.parametrize("error", [conflict, access_denied, Killed], ids=["transient", "persistent", "killed"])
@pytest.mark.parametrize("times", [1, 10_000], ids=["once", "every-attempt"])
def test_a_fault_at_the_reservation_itself_ends_the_batch_with_nothing_held(error, times):
    d = run_capped(lambda d: d.faults.append(Fault("ingest", "batches.transition", error, times=times)))
    assert d.faults[0].raised
    assert_released(d)
