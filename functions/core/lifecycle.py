"""The batch lifecycle: its statuses, the legal transitions between them with their timestamps and
side effects, and the one rule for what a terminal write does.

Every change of a batch item goes through here: a caller asks for a transition (``start``,
``refuse``, ``request_cancel``, ``close``, ``finish``...), gets a ``Change`` (pure data: what to
set, what must hold), and applies it with ``apply`` (``BatchStore.transition``: one conditional
write). The store adapters only render a ``Change`` as a condition and a write; the rules live
here:

- a status is entered only from the statuses listed for its transition (``TRANSITIONS``), and each
  status's timestamp (``STAMPS``) is set once, when it is first entered;
- a terminal write takes the batch out of the open-batch index and releases its enqueued-cap
  reservation, exactly once (``settle``: shared by the DynamoDB adapter and the in-memory fake);
- the writer whose change made a batch terminal publishes its status (``apply``), and a cancel
  resumes the batch's workflow (``request_cancel``).

``Signal`` is what resumes a waiting workflow; lifecycle events are named ``batch.<status>``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from enum import StrEnum
from typing import Any, Final, TypeVar, get_args

from .errors import ConditionFailed
from .ports import Events, Stores, Workflows
from .records import BatchRecord, FileRecord
from .tenants import Release, Reservation
from .wire import TERMINAL_STATUSES, BatchStatus

T = TypeVar("T")

# --- statuses ------------------------------------------------------------------------------------
STATUSES: Final[tuple[str, ...]] = get_args(BatchStatus)
#: Statuses a batch never leaves (the wire models' own list).
TERMINAL: Final = TERMINAL_STATUSES
#: Statuses a batch may be in while it still runs or closes.
OPEN: Final = tuple(s for s in STATUSES if s not in TERMINAL)
#: A cancel moves a batch from these to ``cancelling``.
CANCELLABLE: Final = ("validating", "in_progress")
#: A workflow task may close (stop taking chunks, plan files) or drain a batch from these.
CLOSABLE: Final = ("in_progress", "finalizing", "cancelling")
#: Statuses whose request_counts are live (chunks still run, or their checkpointed lines are about
#: to be salvaged): the API shows them from the chunk partition (docs/lifecycle.md, "Live progress").
LIVE: Final = ("in_progress", "finalizing", "cancelling")

#: The timestamp each status sets when first entered (``validating`` is the creation's).
STAMPS: Final[Mapping[str, str]] = {s: f"{s}_at" for s in STATUSES if s != "validating"}

#: The batch attribute that says its enqueued-cap reservation is still held.
HOLDS: Final = "holds_reservation"


def is_terminal(status: str) -> bool:
    return status in TERMINAL


# --- transitions as data ---------------------------------------------------------------------------
@dataclass(frozen=True)
class Transition:
    """A legal move: from any of ``sources`` to ``target`` (None: the status does not change;
    the transition only sets other attributes), only while ``expect`` also holds."""

    name: str
    sources: tuple[str, ...]
    target: str | None
    expect: Mapping[str, Any] = field(default_factory=dict)


#: Ingest validated the input: the batch runs.
START: Final = Transition("start", ("validating",), "in_progress")
#: Ingest refused the input (validation errors, a cap, the budget) or could not process it.
REFUSE: Final = Transition("refuse", ("validating",), "failed")
#: The API's cancel.
REQUEST_CANCEL: Final = Transition("request_cancel", CANCELLABLE, "cancelling")
#: A batch cancelled before ingest moved it on ends at once (nothing of it ran).
CANCEL_UNSTARTED: Final = Transition("cancel_unstarted", ("cancelling",), "cancelled", {"in_progress_at": None})
#: An expiring batch shows ``finalizing`` while its running chunks drain; a cancelled one drains
#: in ``cancelling``.
DRAIN_EXPIRY: Final = Transition("drain_expiry", ("in_progress", "finalizing"), "finalizing")
DRAIN_CANCEL: Final = Transition("drain_cancel", CLOSABLE, None)
#: The workflow closes the batch to late chunks before it assembles the files: ``finalizing``
#: (completion, expiry), or as it is (a cancel, the failure path).
CLOSE: Final = Transition("close", CLOSABLE, "finalizing")
CLOSE_AS_IS: Final = Transition("close_as_is", CLOSABLE, None)
#: The closed batch's terminal write, with its files (``finish``).
FINISH: Final = {
    status: Transition(f"finish_{status}", CLOSABLE, status, {"accepting": False})
    for status in ("completed", "cancelled", "expired", "failed")
}
#: The workflow's last resort: failed without files, from any open status.
FAIL_WITHOUT_FILES: Final = Transition("fail_without_files", ("validating", *CLOSABLE), "failed")
#: Attribute-only transitions.
NOTE_TOKEN: Final = Transition("note_token", ("in_progress", "cancelling"), None)
NOTE_ENQUEUED: Final = Transition("note_enqueued", STATUSES, None)
#: The status in which a batch (still ``accepting``) takes new chunks: a worker opens a chunk's
#: attempt only then (``BatchStore.save_chunk_run(starting=True)``).
TAKES_CHUNKS: Final = "in_progress"

TRANSITIONS: Final[tuple[Transition, ...]] = (
    START,
    REFUSE,
    REQUEST_CANCEL,
    CANCEL_UNSTARTED,
    DRAIN_EXPIRY,
    DRAIN_CANCEL,
    CLOSE,
    CLOSE_AS_IS,
    *FINISH.values(),
    FAIL_WITHOUT_FILES,
    NOTE_TOKEN,
    NOTE_ENQUEUED,
)
#: Every (from, to) status pair a transition allows.
EDGES: Final = frozenset((s, t.target) for t in TRANSITIONS if t.target is not None for s in t.sources if s != t.target)


# --- changes -----------------------------------------------------------------------------------
@dataclass(frozen=True)
class Change:
    """One conditional write of a batch item: SET ``values``, SET ``defaults`` where absent, ADD
    ``add`` (numbers, or sets), REMOVE ``remove``; only if the item exists and every ``expect``
    attribute equals its value (a tuple: is one of them; None: is absent). ``counter``: an
    enqueued-cap counter change in the same transaction (a ``Reservation`` taken, only within its
    caps; a ``Release`` given back). ``terminal``: the write makes the batch terminal."""

    values: Mapping[str, Any] = field(default_factory=dict)
    defaults: Mapping[str, Any] = field(default_factory=dict)
    add: Mapping[str, Any] = field(default_factory=dict)
    remove: tuple[str, ...] = ()
    expect: Mapping[str, Any] = field(default_factory=dict)
    counter: Reservation | Release | None = None

    @property
    def terminal(self) -> bool:
        return is_terminal(self.values.get("status", ""))


def change(
    transition: Transition,
    now: int,
    *,
    values: Mapping[str, Any] | None = None,
    defaults: Mapping[str, Any] | None = None,
    add: Mapping[str, Any] | None = None,
    expect: Mapping[str, Any] | None = None,
    counter: Reservation | None = None,
) -> Change:
    """The write that makes ``transition`` at ``now``: the target status and its timestamp (set
    once), the transition's conditions, and the caller's own attributes. A terminal target also
    takes the batch out of the open-batch index."""
    values = dict(values or {})
    defaults = dict(defaults or {})
    remove: tuple[str, ...] = ()
    if transition.target is not None:
        values["status"] = transition.target
        defaults.setdefault(STAMPS[transition.target], now)
        if is_terminal(transition.target):
            remove = BatchRecord.OPEN_ATTRIBUTES
    sources = transition.sources[0] if len(transition.sources) == 1 else tuple(transition.sources)
    conditions: dict[str, Any] = {} if transition.sources == STATUSES else {"status": sources}
    conditions.update(transition.expect)
    conditions.update(expect or {})
    return Change(
        values=values, defaults=defaults, add=dict(add or {}), remove=remove, expect=conditions, counter=counter
    )


def start(now: int, *, values: Mapping[str, Any], reservation: Reservation | None = None) -> Change:
    """validating -> in_progress, with what ingest learned (model, totals, chunks, budget) and,
    under an enqueued cap, the reservation taken in the same transaction (only within the caps,
    and only by a batch that holds none yet: a repeated ingest reserves nothing twice)."""
    if reservation is None:
        return change(START, now, values={**values, "accepting": True})
    held = {
        "reserved_model": reservation.model,
        "reserved_requests": reservation.requests,
        "reserved_tokens": reservation.tokens,
        HOLDS: True,
    }
    return change(START, now, values={**values, "accepting": True, **held}, expect={HOLDS: None}, counter=reservation)


def refuse(now: int, errors: Sequence[Mapping[str, Any]]) -> Change:
    """validating -> failed with ``errors`` (the batch's ``errors.data``)."""
    return change(REFUSE, now, values={"errors": [dict(e) for e in errors]})


def drain(now: int, *, expiring: bool, grace_seconds: int) -> Change:
    """Begin draining running chunks (their deadline set once): an expiring batch shows
    ``finalizing``; a cancelled one stays ``cancelling``."""
    return change(DRAIN_EXPIRY if expiring else DRAIN_CANCEL, now, defaults={"drain_deadline": now + grace_seconds})


def close(
    now: int, *, closed_for: str, planned_output_file_id: str, planned_error_file_id: str, finalizing: bool
) -> Change:
    """Stop the batch taking chunks and plan its files (``finalizing`` if asked). The planned file
    ids and ``closed_for`` are set only where absent, so every retry and every concurrent task
    writes the same files."""
    return change(
        CLOSE if finalizing else CLOSE_AS_IS,
        now,
        values={"accepting": False},
        defaults={
            "planned_output_file_id": planned_output_file_id,
            "planned_error_file_id": planned_error_file_id,
            "closed_for": closed_for,
        },
    )


def finish(now: int, *, status: str, closed_from: str, values: Mapping[str, Any]) -> Change:
    """The closed batch's terminal write (with its files, ``apply(files=...)``), only if it is still
    as the closing task left it (``closed_from``, not accepting)."""
    return change(FINISH[status], now, values=values, expect={"status": closed_from})


def fail_without_files(now: int, errors: Sequence[Mapping[str, Any]]) -> Change:
    return change(FAIL_WITHOUT_FILES, now, values={"accepting": False, "errors": [dict(e) for e in errors]})


def cancel_unstarted(now: int) -> Change:
    return change(CANCEL_UNSTARTED, now)


def note_token(token: str) -> Change:
    """The token the batch's workflow waits on."""
    return change(NOTE_TOKEN, 0, values={"task_token": token})


def note_enqueued() -> Change:
    """Ingest sent the work messages and started the workflow."""
    return change(NOTE_ENQUEUED, 0, values={"enqueued": True})


# --- the terminal write's rule (used by every BatchStore) ------------------------------------------
def release_of(batch: BatchRecord) -> Release | None:
    """What a batch's terminal write gives back to its enqueued-cap counter (None: holds nothing)."""
    if not batch.holds_reservation or batch.reserved_model is None:
        return None
    return Release(
        tenant=batch.tenant, model=batch.reserved_model, requests=batch.reserved_requests, tokens=batch.reserved_tokens
    )


def settle(change: Change, write: Callable[[Change], T], read: Callable[[], BatchRecord | None]) -> T:
    """Apply ``change`` with ``write`` (one conditional write or transaction; ConditionFailed if
    its condition does not hold). A terminal change releases the batch's reservation exactly once:
    first written on the condition that the batch holds none (a batch without one pays nothing
    more); if that fails, the reservation is read (``read``) and the write is made again with the
    counter's release in the same transaction, on the condition that the batch still holds it (and
    removing it). Bounded: a concurrent release or the caller's own failing condition ends in
    ConditionFailed after a few attempts."""
    if not change.terminal:
        return write(change)
    again = True  # one more plain attempt after a concurrent release (then the condition decides)
    for _ in range(3):
        try:
            return write(replace(change, expect={**change.expect, HOLDS: None}))
        except ConditionFailed:
            stored = read()
            release = release_of(stored) if stored is not None else None
            if release is None:
                if not again:
                    raise
                again = False
                continue  # the caller's own condition failed, or a concurrent release: once more
        try:
            return write(
                replace(change, remove=(*change.remove, HOLDS), expect={**change.expect, HOLDS: True}, counter=release)
            )
        except ConditionFailed:
            continue
    raise ConditionFailed("the batch's condition does not hold")


# --- applying, with the side effects -----------------------------------------------------------------
@dataclass(frozen=True)
class Outcome:
    """What ``apply`` did: the batch as stored afterwards, and whether this call's change was
    written (False: its condition did not hold; ``batch`` is as another writer left it)."""

    batch: BatchRecord
    moved: bool


def apply(
    stores: Stores, batch: BatchRecord, change: Change, *, files: Sequence[FileRecord] = (), publish: bool = True
) -> Outcome:
    """Write ``change`` to ``batch`` (with ``files`` in the same transaction). If its condition
    does not hold, the batch is read again and returned unmoved. A terminal move made by this
    call publishes the batch's status (``publish``; at least once: subscribers dedupe on id and
    status)."""
    try:
        moved = stores.batches.transition(batch.tenant, batch.id, change, files=files)
    except ConditionFailed:
        current = stores.batches.get(batch.tenant, batch.id)
        if current is None:
            raise LookupError(f"batch {batch.id} of tenant {batch.tenant} vanished") from None
        return Outcome(current, False)
    if publish and change.terminal:
        publish_status(stores.events, moved)
    return Outcome(moved, True)


def request_cancel(stores: Stores, batch: BatchRecord, now: int) -> BatchRecord:
    """The API's cancel: validating/in_progress -> cancelling, and the batch's waiting workflow
    resumed with ``Signal.CANCEL`` (ingest, or the workflow, finishes it as cancelled). A batch that
    cannot be cancelled any more is returned as stored."""
    if batch.status not in CANCELLABLE:
        return batch
    outcome = apply(stores, batch, change(REQUEST_CANCEL, now))
    # A batch counted on shards stops starting chunks when the resumed workflow drains it (the API
    # holds no write on chunk partitions: docs/lifecycle.md, "Counting shards").
    if outcome.moved and outcome.batch.task_token:
        signal(stores.workflows, outcome.batch.task_token, Signal.CANCEL)
    return outcome.batch


# --- workflow signals and lifecycle events ----------------------------------------------------------
#: The field of a signal's output that carries the signal (the state machine reads it).
SIGNAL_FIELD: Final = "outcome"


class Signal(StrEnum):
    """Why a waiting batch workflow resumes."""

    COMPLETE = "complete"
    CANCEL = "cancel"
    EXPIRE = "expire"

    def output(self) -> dict[str, str]:
        """The task output that carries this signal."""
        return {SIGNAL_FIELD: self.value}


def signal(workflows: Workflows, token: str, what: Signal) -> bool:
    """Resume the workflow waiting on ``token``; False if it no longer waits on it."""
    return workflows.signal(token, what.output())


def event_type(status: str) -> str:
    """The EventBridge detail-type of a batch reaching ``status``."""
    return f"batch.{status}"


def publish_status(events: Events, batch: BatchRecord) -> None:
    """Publish the batch's current status (at least once: subscribers dedupe on id and status)."""
    events.publish(event_type(batch.status), batch.event_detail())
