"""The fault-injection suite (docs/reliability.md, "Fault-injection suite"): one batch of 6 requests in 3 chunks of 2 lines
driven end to end through the real logic (ingest -> the worker's chunk path -> the workflow's
tasks -> terminal) by ``tests/unit/fault_driver.py``, with ONE fault injected at one step of one
path. Each row asserts where the batch ends:

- its terminal status, reached within the bound (soon after its work is done; for an expiring
  batch within one reconcile period after ``expires_at``);
- its request counts and both files line by line: every custom_id exactly once across output and
  error file, each file in input order, completed == output lines, failed == error lines
  (tests/agreement.py); which lines are in the output file, each holding the engine's answer for
  that very request; and the error code of every error line.

The faults: a transient AWS error once (what an adapter raises after its own retries gave up:
throttling, a transaction conflict, a timeout), a non-transient one on every attempt
(``AccessDeniedException``), a SIGKILL between two steps (``Killed``, a BaseException, raised at
the store call that would come next: nothing after it runs), a lost or duplicated message or
signal. ``CASES`` is also the table in docs/reliability.md ("Fault-injection suite");
``test_the_doc_table_is_the_parametrization`` keeps the two the same (regenerate it with
``python -m tests.unit.test_fault_matrix``).

A row the code cannot pass yet is ``xfail(strict=True)`` with its reason and what would fix it:
when the fix lands it passes, strict xfail fails, and the row must be turned green."""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from botocore.exceptions import ClientError

from functions.api.batches import cancel_batch
from functions.core.wire import TERMINAL_STATUSES
from gpu_worker.engine_client import EngineDown
from tests.agreement import assert_stores_agree
from tests.builders import assert_fields
from tests.fakes.aws import conflict, throttle
from tests.fakes.engine import REJECTED, chat_answer, content
from tests.unit.fault_driver import (
    BATCH,
    LINES,
    RECONCILE,
    START,
    TENANT,
    WINDOW,
    Driver,
    Killed,
    custom_ids,
    engine_answer,
)

DOC = Path(__file__).resolve().parents[2] / "docs" / "reliability.md"
NODE = "tests/unit/test_fault_matrix.py::test_fault"
EVERY = 10_000  # "on every attempt"


# --- the faults ------------------------------------------------------------------------------------
def access_denied() -> ClientError:
    """A non-transient AWS error, as botocore raises it (no adapter retries it)."""
    return ClientError({"Error": {"Code": "AccessDeniedException", "Message": "not authorized"}}, "Call")


def transient_for(op: str) -> Callable[[], BaseException]:
    """The transient error each store raises once its SDK retries gave up."""
    if op.startswith("batches."):
        return conflict  # TransactionConflict: botocore's standard mode never retries it
    if op.startswith("objects."):
        return TimeoutError
    return throttle


def _transient(phase: str, op: str, skip: int) -> Callable[[Driver], None]:
    return lambda d: d.fail(phase, op, transient_for(op), skip=skip)


def _kill(phase: str, op: str, skip: int) -> Callable[[Driver], None]:
    return lambda d: d.fail(phase, op, Killed, skip=skip)


def _persistent(phase: str, op: str, skip: int) -> Callable[[Driver], None]:
    # In the worker: chunk 0's every attempt (the signal: the last chunk's, the only one that signals).
    chunk = 0 if phase == "worker" and op != "workflows.signal" else None
    return lambda d: d.fail(phase, op, access_denied, skip=skip, times=EVERY, chunk=chunk)


# --- the expectations -------------------------------------------------------------------------------
ALL = tuple(range(LINES))


def but(*lines: int) -> tuple[int, ...]:
    return tuple(i for i in ALL if i not in lines)


@dataclass(frozen=True)
class Case:
    id: str
    path: str
    step: str
    fault: str
    setup: Callable[[Driver], None]
    #: Allowed terminal statuses.
    status: tuple[str, ...]
    #: Input lines (0-based) whose engine answers are the output file (None: any subset).
    output: tuple[int, ...] | None = ALL
    #: Error code of each line in the error file ("500": the engine's status); None: any code.
    errors: dict[int, str] | None = field(default_factory=dict)
    respond: str = "echo"
    order: str = "register_first"
    #: The batch may end only after its expiry (its work cannot finish before).
    late: bool = False
    #: Seconds after the batch's creation by which it must have ended (overrides ``late``).
    bound: int | None = None
    #: Seconds after the batch's creation before which it must NOT have ended (a drain waiting
    #: out its grace for a running chunk).
    waits: int = 0
    #: The engine sees each request exactly once (no GPU work redone).
    once: bool = False
    #: No chunk's poison budget was spent (a store error is a benign end).
    benign: bool = False
    xfail: str | None = None

    def outcome(self) -> str:
        status = " or ".join(self.status)
        if self.output is None:
            return f"{status}; every request once across the files, counts = lines"
        out = "all" if self.output == ALL else ("none" if not self.output else ",".join(str(i) for i in self.output))
        text = f"{status}; output: {out}"
        if self.errors:
            by_code: dict[str, list[int]] = {}
            for line, code in sorted(self.errors.items()):
                by_code.setdefault(code, []).append(line)
            text += "; errors: " + "; ".join(
                f"{','.join(map(str, lines))} {'HTTP ' + code if code.isdigit() else code}"
                for code, lines in by_code.items()
            )
        elif self.errors is None:
            text += "; errors: the rest (any code)"
        if self.once:
            text += "; each request run once"
        if self.benign:
            text += "; no poison budget spent"
        if self.waits:
            text += f"; not before t+{self.waits} s"
        return text


def rows(path: str, steps: list[tuple[str, str, str, int]], expect: dict[str, dict], **common) -> list[Case]:
    """One case per (step, fault): ``steps`` are (slug, words, op, skip); ``expect`` maps a fault
    ("transient", "kill", "persistent") to the Case fields it expects (a callable of the step slug
    for step-dependent expectations)."""
    makers = {"transient": _transient, "kill": _kill, "persistent": _persistent}
    words = {
        "transient": "transient AWS error once",
        "kill": "SIGKILL before this call",
        "persistent": "AccessDenied on every attempt",
    }
    out = []
    for slug, step, op, skip in steps:
        for fault, fields in expect.items():
            fields = fields(slug) if callable(fields) else fields
            if fields is None:
                continue
            out.append(
                Case(
                    id=f"{path}-{slug}-{fault}",
                    path=path,
                    step=f"{step} (`{op}`{f' #{skip + 1}' if skip else ''})",
                    fault=words[fault],
                    setup=makers[fault](PHASE[path], op, skip),
                    **{**common, **fields},
                )
            )
    return out


PHASE = {"ingest": "ingest", "chunk": "worker", "finalize": "finalize", "fail": "fail"}
COMPLETED = ("completed",)
FAILED = ("failed",)

#: The sweeper's documented deadlines (docs/lifecycle.md, "Liveness"): a batch still validating 5 h 15 min
#: after its creation is failed, by a sweep that runs every 5 minutes.
VALIDATING_TIMEOUT, SWEEP = 5 * 3600 + 15 * 60, 300
#: An open batch 15 minutes past its expiry is finalized expired by the sweeper.
EXPIRY_GRACE = 900
#: Drain waits this long for chunks still running (the driver's settings: 120 s).
DRAIN_GRACE = 120
#: A batch cancelled before it started is ended cancelled 5 minutes after the cancel.
ENQUEUE_GRACE = 300

# --- ingest: every store call of a fresh batch's ingest, in order --------------------------------------
INGEST_STEPS = [
    ("read-batch", "read the batch", "batches.get", 0),
    ("size-input", "size the input", "objects.get", 0),
    ("read-input", "read the input to validate it", "objects.get", 1),
    ("write-manifest", "write the chunk manifest", "objects.put", 0),
    ("to-in-progress", "move the batch to in_progress", "batches.transition", 0),
    ("read-manifest", "read the manifest back", "objects.get", 2),
    ("send-work", "send the work messages", "queue.send", 0),
    ("start-workflow", "start the workflow", "workflows.start", 0),
    ("mark-enqueued", "mark the batch enqueued", "batches.transition", 1),
]


def _ingest_persistent(slug: str) -> dict:
    if slug in ("read-batch", "size-input", "read-input", "write-manifest", "to-in-progress"):
        # Never validated: the ingest DLQ's consumer fails it with a clear error, no files.
        return {"status": FAILED, "output": ()}
    if slug == "mark-enqueued":
        # Messages sent and workflow started: the batch completes although the event dead-letters.
        return {"status": COMPLETED}
    # Validated, but the fan-out or the workflow start kept failing: the consumer (or the
    # sweeper) fans out and starts it again; it completes with every line.
    return {"status": COMPLETED}


CASES: list[Case] = rows(
    "ingest",
    INGEST_STEPS,
    {
        "transient": {"status": COMPLETED, "once": True},
        "kill": {"status": COMPLETED, "once": True},
        "persistent": _ingest_persistent,
    },
)
CASES += [
    Case(
        "ingest-start-workflow-persistent-dlq-too",
        "ingest",
        "start the workflow (`workflows.start`)",
        "AccessDenied on every attempt of ingest and of the ingest DLQ consumer",
        lambda d: (
            d.fail("ingest", "workflows.start", access_denied, times=EVERY),
            d.fail("dlq", "workflows.start", access_denied, times=EVERY),
        ),
        COMPLETED,
        bound=WINDOW,
    ),
    Case(
        "ingest-cancelled-before-ingest-event-lost",
        "ingest",
        "the S3 event (SQS), after the tenant cancelled",
        "never delivered",
        lambda d: (setattr(d, "lose_ingest_event", True), d.before_ingest.append(_cancel_now)),
        ("cancelled",),
        output=(),
        bound=ENQUEUE_GRACE + SWEEP,
    ),
    Case(
        "ingest-event-duplicated",
        "ingest",
        "the S3 event (SQS)",
        "delivered twice",
        lambda d: setattr(d, "duplicate_ingest_event", True),
        COMPLETED,
        once=True,
    ),
    Case(
        "ingest-event-lost",
        "ingest",
        "the S3 event (SQS)",
        "never delivered",
        lambda d: setattr(d, "lose_ingest_event", True),
        FAILED,
        output=(),
        bound=VALIDATING_TIMEOUT + SWEEP,
    ),
]

# --- the chunk path: every store call of a chunk, in order (the fault hits chunk 0, or the last chunk
# for the signal) ----------------------------------------------------------------------------------------
CHUNK_STEPS = [
    ("state", "read its count marker and run record (poison budget)", "batches.chunk_state", 0),
    ("read-lines", "read its lines (ranged GET)", "objects.get", 0),
    ("open-attempt", "open an attempt on its run record, while the batch takes chunks", "batches.save_chunk_run", 0),
    ("output-part", "write its output part", "objects.put", 0),
    ("count", "count it (the transaction)", "batches.count_chunk", 0),
    ("reread", "read the batch after counting", "batches.get", 0),
    ("signal", "signal the workflow (last chunk)", "workflows.signal", 0),
    ("delete", "delete the message", "queue.delete", 0),
]
_DEAD_LETTERED = {"status": COMPLETED, "output": but(0, 1), "errors": {0: "server_error", 1: "server_error"}}


def _chunk_persistent(slug: str) -> dict:
    # Before it is counted the chunk never succeeds: SQS dead-letters it and the DLQ handler fails
    # its two lines. Once counted, every redelivery skips it and the workflow completes the batch.
    return (
        _DEAD_LETTERED
        if slug
        in (
            "state",
            "read-lines",
            "open-attempt",
            "output-part",
            "error-part",
        )
        else {"status": COMPLETED}
    )


def _chunk_transient(slug: str) -> dict:
    # A store error is a benign end wherever it happens, the commit included (found by this suite,
    # fixed in fbe135c): the redelivery neither spends the poison budget nor reruns finished lines.
    return {"status": COMPLETED, "benign": True, "once": True}


CASES += rows(
    "chunk",
    CHUNK_STEPS,
    {
        "transient": _chunk_transient,
        "kill": {"status": COMPLETED},
        "persistent": _chunk_persistent,
    },
)
# A chunk whose lines all succeed writes no error part: the error part's step, on a chunk 0 whose
# second line the engine rejects (so its attempt writes both parts).
_REJECTED_1 = {"respond": "reject-1", "output": but(1), "errors": {1: "400"}}
CASES += rows(
    "chunk",
    [("error-part", "write its error part (a chunk with an error line)", "objects.put", 1)],
    {
        "transient": {**_chunk_transient("error-part"), **_REJECTED_1},
        "kill": {"status": COMPLETED, **_REJECTED_1},
        "persistent": {**_chunk_persistent("error-part"), "respond": "reject-1"},
    },
)
CASES += [
    Case(
        "chunk-message-lost",
        "chunk",
        "the work message (SQS)",
        "chunk 0's message lost",
        lambda d: d.queue.drop_next(1),
        ("expired",),
        output=but(0, 1),
        errors={0: "batch_expired", 1: "batch_expired"},
        late=True,
    ),
    Case(
        "chunk-message-lost-drain-conflict",
        "chunk",
        "the work message lost; at expiry, drain shows the batch finalizing (`batches.transition`)",
        "TransactionConflict once",
        lambda d: (d.queue.drop_next(1), d.fail("drain", "batches.transition", conflict)),
        ("expired",),
        output=but(0, 1),
        errors={0: "batch_expired", 1: "batch_expired"},
        late=True,
    ),
    Case(
        "chunk-message-lost-finalize-killed",
        "chunk",
        "the work message lost; at expiry, finalize's transaction (`batches.transition`)",
        "SIGKILL before it",
        lambda d: (d.queue.drop_next(1), d.fail("finalize", "batches.transition", Killed)),
        ("expired",),
        output=but(0, 1),
        errors={0: "batch_expired", 1: "batch_expired"},
        late=True,
    ),
    Case(
        "chunk-message-duplicated",
        "chunk",
        "the work message (SQS)",
        "chunk 0's message delivered twice",
        lambda d: d.queue.duplicate_next(1),
        COMPLETED,
        once=True,
    ),
    Case(
        "chunk-last-message-redelivered-after-count",
        "chunk",
        "the last chunk's message (SQS)",
        "redelivered after it was counted and signalled (SIGKILL before delete)",
        lambda d: d.fail("worker", "queue.delete", Killed, skip=2),
        COMPLETED,
        once=True,
    ),
    Case(
        "chunk-worker-hangs-to-expiry",
        "chunk",
        "a worker runs chunk 0",
        "hangs (its message stays in flight) until expiry",
        lambda d: setattr(d, "hang_chunk", 0),
        ("expired",),
        output=but(0, 1),
        errors={0: "batch_expired", 1: "batch_expired"},
        bound=WINDOW + RECONCILE + DRAIN_GRACE + 60,
        waits=WINDOW + DRAIN_GRACE,
    ),
    Case(
        "chunk-engine-error-status",
        "chunk",
        "the engine answers one line",
        "HTTP 400",
        lambda d: None,
        COMPLETED,
        output=but(3),
        errors={3: "400"},
        respond="reject-3",
        once=True,
    ),
    Case(
        "chunk-engine-down-once",
        "chunk",
        "the engine client",
        "EngineDown on the first request",
        lambda d: None,
        COMPLETED,
        respond="down-once",
    ),
    Case(
        "chunk-poison-engine-crash",
        "chunk",
        "the engine client",
        "one line crashes the engine on every attempt",
        lambda d: None,
        COMPLETED,
        output=but(1),
        errors={1: "engine_crashed"},
        respond="crash-1",
    ),
    Case(
        "chunk-poison-worker-killed",
        "chunk",
        "the engine client",
        "one line SIGKILLs the worker on every attempt",
        lambda d: None,
        COMPLETED,
        output=but(1),
        errors={1: "engine_crashed"},
        respond="kill-1",
    ),
]


# --- the workflow's wait, check and drain ----------------------------------------------------------------
def _cancel_now(d: Driver) -> None:
    d.phase = "api"
    cancel_batch(d.stores, TENANT, BATCH, now=d.now)


def _cancel_at(message: int, *, lose: bool = False, throttled: bool = False) -> Callable[[Driver], None]:
    """The tenant cancels before the ``message``-th work message is processed (chunk 0 counted)."""

    def cancel(d: Driver) -> None:
        d.phase = "api"
        if lose:
            d.lose_signals = 1
        if throttled:
            d.fail("api", "workflows.signal", throttle)
        try:
            cancel_batch(d.stores, TENANT, BATCH, now=d.now)
        except Exception:
            d.log.append("cancel's signal raised")
        d.phase = "worker"

    return lambda d: d.before_message.__setitem__(message, cancel)


_CANCELLED = {"status": ("cancelled",), "output": (0, 1), "errors": {i: "batch_cancelled" for i in range(2, LINES)}}
_FAILED_KEEPING = {"status": FAILED}

CASES += [
    Case(
        "workflow-register-conflict",
        "workflow",
        "register the wait token (`batches.transition`)",
        "TransactionConflict once",
        lambda d: d.fail("register", "batches.transition", conflict),
        COMPLETED,
    ),
    Case(
        "workflow-register-throttled",
        "workflow",
        "register the wait token (`batches.get`)",
        "throttled twice",
        lambda d: d.fail("register", "batches.get", throttle, times=2),
        COMPLETED,
    ),
    Case(
        "workflow-register-persistent",
        "workflow",
        "register the wait token (`batches.transition`)",
        "AccessDenied on every attempt (chunks already counted)",
        lambda d: d.fail("register", "batches.transition", access_denied, times=EVERY),
        FAILED,
        order="work_first",
    ),
    Case(
        "workflow-register-killed",
        "workflow",
        "register, after storing the token (`workflows.signal`)",
        "SIGKILL before it signals itself (chunks already counted)",
        lambda d: d.fail("register", "workflows.signal", Killed),
        COMPLETED,
        order="work_first",
    ),
    Case(
        "workflow-signal-lost",
        "workflow",
        "the worker's complete signal",
        "lost (sent, never arrives)",
        lambda d: setattr(d, "lose_signals", 1),
        COMPLETED,
    ),
    Case(
        "workflow-check-conflict",
        "workflow",
        "check after a lost signal (`batches.get`)",
        "TransactionConflict once",
        lambda d: (setattr(d, "lose_signals", 1), d.fail("check", "batches.get", conflict)),
        COMPLETED,
    ),
    Case(
        "workflow-check-persistent",
        "workflow",
        "check after a lost signal (`batches.get`)",
        "AccessDenied on every attempt",
        lambda d: (setattr(d, "lose_signals", 1), d.fail("check", "batches.get", access_denied, times=EVERY)),
        FAILED,
    ),
    Case(
        "workflow-drain-conflict",
        "workflow",
        "drain (`batches.get`)",
        "TransactionConflict once",
        lambda d: d.fail("drain", "batches.get", conflict),
        COMPLETED,
    ),
    Case(
        "workflow-drain-persistent",
        "workflow",
        "drain (`batches.get`)",
        "AccessDenied on every attempt",
        lambda d: d.fail("drain", "batches.get", access_denied, times=EVERY),
        FAILED,
    ),
    Case(
        "workflow-fail-denied",
        "workflow",
        "drain, then Fail (`batches.get`)",
        "AccessDenied on every attempt of both: the execution fails, the batch is left open",
        lambda d: (
            d.fail("drain", "batches.get", access_denied, times=EVERY),
            d.fail("fail", "batches.get", access_denied, times=EVERY),
        ),
        # Every chunk counted: the sweeper finalizes it once quiet for a reconcile period plus
        # the expiry grace (a live workflow would have won that race), long before its expiry.
        COMPLETED,
        output=but(3),
        errors={3: "400"},
        respond="reject-3",
        bound=RECONCILE + EXPIRY_GRACE + 2 * SWEEP,
        waits=RECONCILE + EXPIRY_GRACE,
    ),
    Case(
        "workflow-cancel", "workflow", "cancel after chunk 0 ran", "none (reference row)", _cancel_at(1), **_CANCELLED
    ),
    Case(
        "workflow-cancel-signal-lost",
        "workflow",
        "the API's cancel signal",
        "lost (sent, never arrives)",
        _cancel_at(1, lose=True),
        **_CANCELLED,
    ),
    Case(
        "workflow-cancel-signal-throttled",
        "workflow",
        "the API's cancel signal",
        "throttled (the API answers 503)",
        _cancel_at(1, throttled=True),
        **_CANCELLED,
    ),
    Case(
        "workflow-cancel-while-a-chunk-hangs",
        "workflow",
        "drain a cancelled batch while chunk 1 runs",
        "its worker hangs: drain waits out its grace",
        lambda d: (_cancel_at(2)(d), setattr(d, "hang_chunk", 1)),
        waits=DRAIN_GRACE,
        **_CANCELLED,
    ),
    Case(
        "workflow-cancel-drain-conflict",
        "workflow",
        "drain a cancelled batch (`batches.transition`)",
        "TransactionConflict once",
        lambda d: (_cancel_at(1)(d), d.fail("drain", "batches.transition", conflict)),
        **_CANCELLED,
    ),
]

# --- finalize: every store call, in order (line 3 answered 400, so both files are written) ---------------
FINALIZE_STEPS = [
    ("read-batch", "read the batch", "batches.get", 0),
    ("close", "close it to late chunks", "batches.transition", 0),
    ("markers", "read the count markers", "batches.counted_chunks", 0),
    ("manifest", "read the manifest", "objects.get", 0),
    ("read-part", "read a result part", "objects.get", 1),
    ("write", "write to the output file", "objects.writer.write", 0),
    ("complete-output", "complete the output file", "objects.writer.complete", 0),
    ("complete-error", "complete the error file", "objects.writer.complete", 1),
    ("finish", "create the files and set the state (transaction)", "batches.transition", 1),
    ("publish", "publish batch.completed", "events.publish", 0),
]
_FINAL_OUTPUT = {"output": but(3), "errors": {3: "400"}, "respond": "reject-3"}
_FINAL = _FINAL_OUTPUT


def _finalize_persistent(slug: str) -> dict:
    # After the retries the execution goes to Fail, which assembles the same files: failed, nothing
    # lost. Once the terminal state is set (publish) the batch stays completed.
    return {**_FINAL, "status": COMPLETED if slug == "publish" else FAILED}


CASES += [
    Case(
        f"{task}-answer-lost",
        "finalize" if task == "finalize" else "workflow",
        f"{task} (the Lambda invocation)",
        "ran, its answer lost: Step Functions runs it again",
        (lambda t: lambda d: d.duplicate_tasks.add(t))(task),
        COMPLETED,
        **_FINAL_OUTPUT,
    )
    for task in ("register", "drain", "finalize")
]
CASES += rows(
    "finalize",
    FINALIZE_STEPS,
    {
        "transient": {**_FINAL, "status": COMPLETED},
        "kill": {**_FINAL, "status": COMPLETED},
        "persistent": _finalize_persistent,
    },
)

# --- fail: the last resort, itself faulted (the execution reached Fail: drain denied every time) -----------
FAIL_STEPS = [
    ("close", "close the batch", "batches.transition", 0),
    ("complete-output", "complete the output file", "objects.writer.complete", 0),
    ("finish", "create the files and set failed (transaction)", "batches.transition", 1),
]


def _drain_denied_then(step: Callable[[Driver], None]) -> Callable[[Driver], None]:
    def setup(d: Driver) -> None:
        d.fail("drain", "batches.get", access_denied, times=EVERY)
        step(d)

    return setup


CASES += [
    dataclasses.replace(c, setup=_drain_denied_then(c.setup))
    for c in rows(
        "fail",
        FAIL_STEPS,
        {
            "transient": {**_FINAL, "status": FAILED},
            "kill": {**_FINAL, "status": FAILED},
        },
    )
]


# --- the engines ------------------------------------------------------------------------------------------
def responder(name: str) -> Callable:
    def respond(path, body, seen):
        line = content(body)
        if (name, line) in (("reject-3", "line 3"), ("reject-1", "line 1")):
            return 400, REJECTED
        if name == "down-once" and line == "line 0" and seen == 0:
            raise EngineDown("connection refused; /health does not answer")
        if name == "crash-1" and line == "line 1":
            raise EngineDown("the engine died on this request")
        if name == "kill-1" and line == "line 1":
            raise Killed()
        return 200, chat_answer(body)

    return respond


# --- the test ---------------------------------------------------------------------------------------------
def _param(case: Case):
    marks = [pytest.mark.xfail(strict=True, reason=case.xfail)] if case.xfail else []
    return pytest.param(case, id=case.id, marks=marks)


@pytest.mark.parametrize("case", [_param(c) for c in CASES])
def test_fault(case: Case):
    d = Driver(respond=responder(case.respond), order=case.order)
    case.setup(d)
    d.run()
    assert_outcome(d, case)


def assert_outcome(d: Driver, case: Case) -> None:
    batch = d.batch()
    trace = f"log: {d.log[-12:]}; execution {d.execution}"
    for fault in d.faults:  # the row tests what it says: its fault was injected
        assert fault.raised, f"the fault at {fault.phase} {fault.op} #{fault.skip + 1} never fired; {trace}"
    assert batch.status in TERMINAL_STATUSES, f"stuck in {batch.status} at t+{d.now - START}s; {trace}"
    assert batch.status in case.status, f"{batch.status}, expected {case.status}; {trace}"
    # Within the bound: soon after the work is done, or one reconcile period after expiry.
    bound = START + (case.bound or (WINDOW + RECONCILE + 60 if case.late else 2 * RECONCILE))
    assert d.finished_at is not None and d.finished_at <= bound, f"ended at t+{d.finished_at - START}s; {trace}"
    assert d.finished_at >= START + case.waits, f"ended at t+{d.finished_at - START}s, before t+{case.waits}s; {trace}"
    for error in batch.errors or []:
        assert len(error["message"]) <= 500 and not re.search(r"Traceback|arn:|AccessDenied|Killed", error["message"])
    if batch.status == "failed" and batch.in_progress_at is not None:
        assert [e["code"] for e in batch.errors or []] == ["batch_failed"], batch.errors
    if batch.in_progress_at is None:
        # Never validated: no files; failed with one clear error (the ingest DLQ consumer's or the
        # sweeper's), or cancelled by its tenant.
        if batch.status == "failed":
            assert [e["code"] for e in batch.errors or []] == ["ingest_failed"], batch
        assert_fields(batch, output_file_id=None, error_file_id=None, completed=0, failed=0)
        return
    output, errors = assert_stores_agree(d.stores, TENANT, BATCH, custom_ids())
    # No result file the batch does not name is visible to its tenant (a retried or duplicated
    # finalize or fail created its files once).
    results = {i for (t, i), f in d.stores.files.items.items() if t == TENANT and f.purpose == "batch_output"}
    assert results == {i for i in (batch.output_file_id, batch.error_file_id) if i}, results
    for line in output:  # the engine's answer for this very request
        assert line.response.body["choices"][0]["message"]["content"] == engine_answer(line.custom_id)
    if case.output is not None:
        assert [l.custom_id for l in output] == [f"req-{i}" for i in case.output], trace
    if case.errors is not None and case.output is not None:
        codes = {
            int(l.custom_id.removeprefix("req-")): str(l.response.status_code) if l.response else l.error.code
            for l in errors
        }
        assert codes == case.errors, trace
    if case.benign:
        spent = {k[2]: r.failures for k, r in d.stores.batches.runs.items() if r.failures}
        assert not spent, (
            f"a store error spent the poison budget of chunks {spent}; engine ran {len(d.engine.requests)} requests"
        )
    if case.once:
        ran = d.engine.contents()
        assert len(ran) == len(set(ran)), f"a request ran twice: {sorted(ran)}"


# --- the table in docs/reliability.md ---------------------------------------------------------------------
TABLE_START = "<!-- fault-matrix:start (generated: python -m tests.unit.test_fault_matrix) -->"
TABLE_END = "<!-- fault-matrix:end -->"


def table() -> str:
    head = "| path | step | fault | asserted outcome | test |\n|---|---|---|---|---|\n"
    body = "".join(f"| {c.path} | {c.step} | {c.fault} | {c.outcome()}{_note(c)} | `{NODE}[{c.id}]` |\n" for c in CASES)
    return head + body


def _note(case: Case) -> str:
    """A pending row's note in the table: which slice it waits for, or whose bug it shows."""
    if not case.xfail:
        return ""
    if case.xfail.startswith("pending:"):
        return " **(pending: " + case.xfail.removeprefix("pending:").split("(")[0].strip() + ")**"
    return " **(xfail, " + case.xfail.split(":")[0] + ")**"


def test_the_doc_table_is_the_parametrization():
    text = DOC.read_text()
    assert TABLE_START in text and TABLE_END in text, "docs/reliability.md lacks the fault-matrix table"
    documented = text.split(TABLE_START, 1)[1].split(TABLE_END, 1)[0].strip()
    assert documented == table().strip(), "the table drifted: regenerate it with python -m tests.unit.test_fault_matrix"


FAILURE_MODES_START, FAILURE_MODES_END = "<!-- failure-modes:start -->", "<!-- failure-modes:end -->"


def test_the_failure_modes_table_names_real_tests():
    """Every test the "Failure modes and their tests" table names exists: its file defines the
    function, and a parametrized id is one of its cases (the matrix's ids are CASES); every
    failure mode names at least one test."""
    text = DOC.read_text()
    assert FAILURE_MODES_START in text and FAILURE_MODES_END in text, (
        'docs/reliability.md lacks the "Failure modes and their tests" table (its markers)'
    )
    section = text.split(FAILURE_MODES_START, 1)[1].split(FAILURE_MODES_END, 1)[0]
    rows = [r for r in section.splitlines() if r.startswith("| ") and not r.startswith("| failure mode")]
    assert len(rows) == 9, "one row per failure mode: nine"
    root = DOC.parents[1]
    named = re.findall(r"`(tests/[\w/]+\.py)::(\w+)(?:\[([^\]]+)\])?`", section)
    assert len(named) >= 9
    for path, name, param in named:
        source = (root / path).read_text()
        assert f"def {name}(" in source, f"{path} has no {name}"
        if path == "tests/unit/test_fault_matrix.py" and param:
            assert param in {c.id for c in CASES}, f"no fault-matrix row {param}"
        elif param:
            assert repr(param) in source or f'"{param}"' in source, f"{path}::{name} has no case {param}"
    for row in rows:
        assert "`tests/" in row, f"a failure mode without a test: {row[:80]}"


def test_the_case_ids_are_unique():
    ids = [c.id for c in CASES]
    assert len(ids) == len(set(ids))


if __name__ == "__main__":
    print(TABLE_START)
    print(table(), end="")
    print(TABLE_END)
