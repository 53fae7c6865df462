"""The batch lifecycle (functions/core/lifecycle.py): the changes each transition makes, and random
sequences of transitions on several batches sharing one enqueued-cap counter, checked after every
step against the lifecycle's own rules (legal edges only, terminal is final, each timestamp set
once, every reservation released exactly once, one event per terminal move)."""

from collections.abc import Callable

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from functions.core import lifecycle
from functions.core.errors import ConditionFailed
from functions.core.lifecycle import Change
from functions.core.ports import Stores
from functions.core.records import BatchRecord
from functions.core.tenants import Reservation
from tests.builders import batch_record
from tests.fakes.aws import fake_stores

ERROR = {"code": "x", "message": "x", "param": None, "line": None}


def cap(tenant: str) -> Reservation:
    return Reservation(tenant=tenant, model="m", requests=2, tokens=20, max_requests=5, max_tokens=50)


def new_batch(batch_id: str, tenant: str = "acme") -> BatchRecord:
    return batch_record(
        tenant=tenant, id=batch_id, created_at=1, expires_at=10**6, input_key=f"batches/acme/{batch_id}/input.jsonl"
    )


#: Every way the code asks for a transition, by name: (now, the batch as last read) -> a Change.
OPERATIONS: dict[str, Callable[[int, BatchRecord], Change]] = {
    "start": lambda now, b: lifecycle.start(now, values={"model": "m", "total": 2, "chunk_count": 1}),
    "start_reserved": lambda now, b: lifecycle.start(
        now, values={"model": "m", "total": 2, "chunk_count": 1}, reservation=cap(b.tenant)
    ),
    "refuse": lambda now, b: lifecycle.refuse(now, [ERROR]),
    "request_cancel": lambda now, b: lifecycle.change(lifecycle.REQUEST_CANCEL, now),
    "cancel_unstarted": lambda now, b: lifecycle.cancel_unstarted(now),
    "drain_expiry": lambda now, b: lifecycle.drain(now, expiring=True, grace_seconds=10),
    "drain_cancel": lambda now, b: lifecycle.drain(now, expiring=False, grace_seconds=10),
    "close": lambda now, b: lifecycle.close(
        now,
        closed_for="complete",
        planned_output_file_id=f"file-o{now}",
        planned_error_file_id=f"file-e{now}",
        finalizing=True,
    ),
    "close_as_is": lambda now, b: lifecycle.close(
        now,
        closed_for="cancel",
        planned_output_file_id=f"file-o{now}",
        planned_error_file_id=f"file-e{now}",
        finalizing=False,
    ),
    **{
        f"finish_{status}": (
            lambda s: (
                lambda now, b: lifecycle.finish(
                    now, status=s, closed_from=b.status if b.status in lifecycle.CLOSABLE else "in_progress", values={}
                )
            )
        )(status)
        for status in lifecycle.FINISH
    },
    "fail_without_files": lambda now, b: lifecycle.fail_without_files(now, [ERROR]),
    "note_token": lambda now, b: lifecycle.note_token(f"token-{now}"),
    "note_enqueued": lambda now, b: lifecycle.note_enqueued(),
}


def check_step(before: BatchRecord, after: BatchRecord, moved: bool) -> None:
    """The lifecycle's rules between two reads of one batch around one transition."""
    if not moved:
        assert after == before, "a change whose condition failed wrote something"
        return
    if before.status != after.status:
        assert (before.status, after.status) in lifecycle.EDGES, f"illegal move {before.status} -> {after.status}"
    if lifecycle.is_terminal(before.status):
        assert after.status == before.status, "a terminal batch moved"
    for _status, stamp in lifecycle.STAMPS.items():
        if getattr(before, stamp) is not None:
            assert getattr(after, stamp) == getattr(before, stamp), f"{stamp} set twice"
    if after.status != "validating":
        assert getattr(after, lifecycle.STAMPS[after.status]) is not None, f"{after.status} without its timestamp"


def check_state(stores: Stores, tenant: str, batch_ids: list[str]) -> None:
    """Across the batches: the counter holds exactly the reservations still held, only open
    batches hold one, and the open-batch index lists exactly the open batches."""
    batches = [stores.batches.get(tenant, b) for b in batch_ids]
    held = [b for b in batches if b.holds_reservation]
    assert all(not lifecycle.is_terminal(b.status) for b in held), "a terminal batch still holds its reservation"
    assert stores.batches.enqueued(tenant, "m") == (
        sum(b.reserved_requests for b in held),
        sum(b.reserved_tokens for b in held),
    )
    assert sorted(b for t, b in stores.batches.open_batches() if t == tenant) == sorted(
        b.id for b in batches if not lifecycle.is_terminal(b.status)
    )


def walk(stores: Stores, steps: list[tuple[int, str]], batch_ids: list[str], tenant: str = "acme") -> None:
    """Apply ``steps`` (batch index, operation) with ``lifecycle.apply`` to batches of ``tenant``
    (alone in its counter), checking every rule after every step."""
    for batch_id in batch_ids:
        stores.batches.create(new_batch(batch_id, tenant))
    ended: set[str] = set()
    for now, (index, name) in enumerate(steps, start=10):
        before = stores.batches.get(tenant, batch_ids[index])
        outcome = lifecycle.apply(stores, before, OPERATIONS[name](now, before))
        check_step(before, outcome.batch, outcome.moved)
        if lifecycle.is_terminal(outcome.batch.status):
            ended.add(outcome.batch.id)
        check_state(stores, tenant, batch_ids)
    published = [(detail["id"], kind) for kind, detail in getattr(stores.events, "published", None) or []]
    if hasattr(stores.events, "published"):  # the fake records what it was given
        assert sorted(published) == sorted(
            {(b, lifecycle.event_type(stores.batches.get(tenant, b).status)) for b in ended}
        ), "each terminal move publishes its status once"


STEPS = st.lists(st.tuples(st.integers(0, 2), st.sampled_from(sorted(OPERATIONS))), max_size=40)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(STEPS)
def test_random_transition_sequences_keep_the_lifecycle_rules(steps):
    walk(fake_stores(), steps, ["b0", "b1", "b2"])


def test_every_status_is_reachable_and_every_edge_is_one_transitions():
    reachable = {"validating"} | {t for _, t in lifecycle.EDGES}
    assert reachable == set(lifecycle.STATUSES)
    assert {s for s, _ in lifecycle.EDGES}.isdisjoint(lifecycle.TERMINAL)  # nothing leaves a terminal status
    assert set(lifecycle.STAMPS) == set(lifecycle.STATUSES) - {"validating"}


@pytest.mark.parametrize("transition", lifecycle.TRANSITIONS, ids=lambda t: t.name)
def test_a_transition_sets_its_status_and_timestamp_once_and_conditions_on_its_sources(transition):
    change = lifecycle.change(transition, 42)
    if transition.target is None:
        assert "status" not in change.values and not change.defaults
    else:
        assert change.values["status"] == transition.target
        assert change.defaults == {lifecycle.STAMPS[transition.target]: 42}  # set only where absent
        assert change.terminal == lifecycle.is_terminal(transition.target)
        assert set(change.remove) == (set(BatchRecord.OPEN_ATTRIBUTES) if change.terminal else set())
    sources = change.expect.get("status")
    if transition.sources == lifecycle.STATUSES:
        assert sources is None  # any status (the item must exist)
    else:
        assert set(sources if isinstance(sources, tuple) else (sources,)) == set(transition.sources)


def test_settle_releases_a_held_reservation_with_the_terminal_write_and_only_once():
    stores = fake_stores()
    stores.batches.create(new_batch("b0"))
    stores.batches.transition("acme", "b0", lifecycle.start(1, values={"model": "m"}, reservation=cap("acme")))
    writes: list[Change] = []
    real = stores.batches._write

    def write(tenant, batch_id, change, files):
        writes.append(change)
        return real(tenant, batch_id, change, files)

    stores.batches._write = write
    stores.batches.transition("acme", "b0", lifecycle.fail_without_files(2, [ERROR]))
    # first on "holds none" (refused), then with the release on "still holds it"
    assert [w.expect[lifecycle.HOLDS] for w in writes] == [None, True]
    assert writes[-1].counter is not None and lifecycle.HOLDS in writes[-1].remove
    assert stores.batches.enqueued("acme", "m") == (0, 0)
    with pytest.raises(ConditionFailed):
        stores.batches.transition("acme", "b0", lifecycle.fail_without_files(3, [ERROR]))
    assert stores.batches.enqueued("acme", "m") == (0, 0)


def test_a_cancel_resumes_the_waiting_workflow_once_and_not_for_a_batch_past_cancelling():
    stores = fake_stores()
    stores.batches.create(new_batch("b0"))
    stores.batches.set("acme", "b0", status="in_progress", task_token="t-1")
    cancelled = lifecycle.request_cancel(stores, stores.batches.get("acme", "b0"), 5)
    assert (cancelled.status, cancelled.cancelling_at) == ("cancelling", 5)
    assert stores.workflows.signals == [("t-1", {"outcome": "cancel"})]
    assert lifecycle.request_cancel(stores, cancelled, 6) == cancelled and len(stores.workflows.signals) == 1
