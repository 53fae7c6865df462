"""A small deterministic driver that runs one batch end to end through the REAL logic on the
in-memory fakes, playing the parts the platform plays, so a test can inject one fault at a seam and
assert where the batch ends:

- ingest (``functions.ingest.logic.ingest``) runs on the S3 event; SQS redelivers an event whose
  processing raised or was killed, up to ``names.INGEST_MAX_RECEIVES`` receives, then
  dead-letters it to the ingest DLQ's consumer (``functions.ingest_dlq.logic``);
- the GPU worker's chunk path (``gpu_worker.chunk.ChunkRunner``) runs message by message off the
  fake work queue, as the worker loop does: delete on success, release on an exception, nothing on
  a SIGKILL (the message comes back when its visibility ends); after ``names.WORK_MAX_RECEIVES``
  receives SQS dead-letters it and the DLQ handler (``functions.chunk_dlq.logic.fail_chunk``) fails it;
- the workflow (``functions.workflow.logic``) runs as infra/workflow.py's state machine does:
  WaitForSignal (register, then wait for a signal on the token or time out), Check, Drain,
  Finalize, each task retried 3 times (``States.TaskFailed``/``States.ALL``, MaxAttempts 3) before
  the Catch sends the execution to Fail (itself retried 3 times);
- the sweeper (``functions.sweeper.logic.sweep``) every ``sweep_seconds`` while the batch is
  still open after its workflow ended or never started;
- the clock: the waits advance ``now``; nothing sleeps.

Faults are scoped to a phase ("ingest", "worker", "dlq", "register", "check", "drain", "finalize",
"fail", "api") so that "the second ``objects.put`` of the worker" means what it says, whatever
the other phases call. A ``Killed`` (a ``BaseException``: no ``except Exception`` catches it) at a
store call is a SIGKILL between the step before that call and the call itself: nothing after it
runs, and whoever redelivers does.
"""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from functions.chunk_dlq import logic as dlq
from functions.core import chunk_lifecycle, names, schema
from functions.core.messages import WorkMessage
from functions.core.records import BatchRecord
from functions.core.settings import ModelRoute, Settings
from functions.core.wire import TERMINAL_STATUSES
from functions.ingest import logic as ingest_logic
from functions.ingest_dlq.logic import handle_dead_letter
from functions.sweeper.logic import sweep
from functions.workflow import logic as workflow
from functions.workflow.tasks import TaskError
from tests.builders import batch_record
from tests.chunks import open_attempt, process_chunk
from tests.fakes.aws import FakeStores, fake_stores
from tests.fakes.engine import InProcessEngine, chat_answer, content

CHAT = "/v1/chat/completions"
#: A batch id the API accepts (the cancel rows go through it).
TENANT, BATCH = "acme", "batch_01m8r6rtx4jqk82dr5ccwad9fe"
QUEUE = "fake://work-chat"
START = 1_000
#: "24h": the batch's expires_at is START + 86_400.
WINDOW = 86_400
LINES, PER_CHUNK = 6, 2
RECONCILE = 300
SETTINGS = Settings(
    table_name="t",
    bucket_name="b",
    chunk_max_lines=PER_CHUNK,
    drain_grace_seconds=120,
    drain_poll_seconds=5,
    reconcile_seconds=RECONCILE,
    models={"chat": ModelRoute(endpoints=(CHAT,), queue_url=QUEUE)},
)
#: infra/workflow.py: every task state retries MaxAttempts 3 (interval 2 s, backoff 2).
TASK_RETRIES = 3
#: The ingest DLQ's consumer and the work DLQ's handler are Lambdas on SQS too: a few receives.
HANDLER_ATTEMPTS = 5
#: How long after expires_at the driver keeps the clock running before it gives up.
GIVE_UP_AFTER_EXPIRY = 3_600


class Killed(BaseException):
    """SIGKILL: the process is gone; nothing after the call that raised it runs."""


def custom_ids() -> list[str]:
    return [f"req-{i}" for i in range(LINES)]


def request_line(i: int) -> str:
    return json.dumps(
        {
            "custom_id": f"req-{i}",
            "method": "POST",
            "url": CHAT,
            "body": {"model": "chat", "messages": [{"role": "user", "content": f"line {i}"}]},
        }
    )


def echo(path: str, body: dict[str, Any], seen: int) -> Any:
    """The fake engine's answer: 200 with "echo <content>" (what the output lines must hold)."""
    return 200, chat_answer(body)


@dataclass
class Fault:
    """Raise ``error()`` at calls of ``op`` made in ``phase``: after letting ``skip`` calls
    through, the next ``times`` calls raise (before doing anything)."""

    phase: str
    op: str
    error: Callable[[], BaseException]
    skip: int = 0
    times: int = 1
    #: Only while the worker processes this chunk (None: any).
    chunk: int | None = None
    raised: int = 0


@dataclass
class Driver:
    respond: Callable[..., Any] = echo
    #: "register_first": the workflow waits before the workers run (the worker's last chunk
    #: signals); "work_first": the chunks are counted before register stores its token.
    order: str = "register_first"
    stores: FakeStores = field(default_factory=fake_stores)
    now: int = START
    phase: str = "setup"
    faults: list[Fault] = field(default_factory=list)
    #: (phase, op) -> calls made so far.
    calls: Counter[tuple[str, str]] = field(default_factory=Counter)
    #: Signals to lose: the call "succeeds" and nothing resumes (the worker died right after it).
    lose_signals: int = 0
    #: Called with the driver before the n-th work message (0-based) is processed.
    before_message: dict[int, Callable[[Driver], None]] = field(default_factory=dict)
    #: A chunk whose worker starts it and then hangs, keeping its message in flight (its
    #: heartbeat extends the visibility) and never finishing it.
    hang_chunk: int | None = None
    #: Ingest events to lose (never delivered) and to duplicate (delivered twice).
    lose_ingest_event: bool = False
    #: Task states whose Lambda runs twice (the first answer lost: Step Functions retries it).
    duplicate_tasks: set[str] = field(default_factory=set)
    #: Called with the driver before the ingest event is delivered (e.g. the tenant cancels).
    before_ingest: list[Callable[[Driver], None]] = field(default_factory=list)
    duplicate_ingest_event: bool = False
    # What happened, for the assertions.
    log: list[str] = field(default_factory=list)
    execution: str = "not started"
    finished_at: int | None = None
    messages_processed: int = 0
    #: The chunk the worker is processing (None outside the worker).
    chunk: int | None = None
    dead_lettered_chunks: list[int] = field(default_factory=list)
    ingest_dead_lettered: bool = False

    def __post_init__(self) -> None:
        self.engine = InProcessEngine(self.respond)
        self.queue = self.stores.queues.queue(QUEUE)
        original = self.stores.faults.check

        def check(op: str) -> None:
            self.calls[(self.phase, op)] += 1
            for f in self.faults:
                if (
                    f.phase == self.phase
                    and f.op == op
                    and f.raised < f.times
                    and f.chunk in (None, self.chunk)
                    and self.calls[(self.phase, op)] > f.skip
                ):
                    f.raised += 1
                    raise f.error()
            original(op)

        self.stores.faults.check = check  # type: ignore[method-assign]
        signal = self.stores.workflows.signal

        def lossy_signal(token: str, output: dict[str, Any]) -> bool:
            if self.lose_signals:
                self.stores.faults.check("workflows.signal")
                self.lose_signals -= 1
                self.log.append(f"signal {output} on {token} lost")
                return True
            return signal(token, output)

        self.stores.workflows.signal = lossy_signal  # type: ignore[method-assign]

    def fail(
        self,
        phase: str,
        op: str,
        error: Callable[[], BaseException],
        *,
        skip: int = 0,
        times: int = 1,
        chunk: int | None = None,
    ) -> Fault:
        fault = Fault(phase, op, error, skip, times, chunk)
        self.faults.append(fault)
        return fault

    # --- the batch -------------------------------------------------------------------------------
    def submit(self) -> None:
        """What the API's create did: a validating batch over its input snapshot."""
        key = schema.batch_input_key(TENANT, BATCH)
        self.stores.objects.data[key] = ("\n".join(request_line(i) for i in range(LINES)) + "\n").encode()
        self.stores.batches.put(
            batch_record(tenant=TENANT, id=BATCH, created_at=START, expires_at=START + WINDOW, input_key=key)
        )

    def batch(self) -> BatchRecord:
        record = self.stores.batches.items[(TENANT, BATCH)]
        return BatchRecord.model_validate(record)

    # --- ingest (S3 event through SQS) --------------------------------------------------------------
    def deliver_ingest(self) -> None:
        for hook in self.before_ingest:
            hook(self)
        if self.lose_ingest_event:
            self.log.append("ingest event lost")
            return
        for _ in range(2 if self.duplicate_ingest_event else 1):
            self._ingest_event()

    def _ingest_event(self) -> None:
        for receive in range(1, names.INGEST_MAX_RECEIVES + 1):
            self.phase = "ingest"
            try:
                status = ingest_logic.ingest(self.stores, SETTINGS, TENANT, BATCH, now=self.now)
                self.log.append(f"ingest -> {status}")
                return
            except (Exception, Killed) as exc:  # redelivered after its visibility timeout
                self.log.append(f"ingest receive {receive} raised {type(exc).__name__}")
        self.ingest_dead_lettered = True
        self.log.append("ingest event dead-lettered")
        self._ingest_dead_letter()

    def _ingest_dead_letter(self) -> None:
        """The ingest DLQ's consumer (``functions.ingest_dlq.logic``)."""
        self._handler("dlq", lambda: handle_dead_letter(self.stores, SETTINGS, TENANT, BATCH, now=self.now))

    def _handler(self, phase: str, call: Callable[[], Any]) -> None:
        for _ in range(HANDLER_ATTEMPTS):
            self.phase = phase
            try:
                call()
                return
            except (Exception, Killed) as exc:
                self.log.append(f"{phase} raised {type(exc).__name__}")

    # --- the GPU worker ----------------------------------------------------------------------------
    def work(self) -> None:
        """Process every visible work message, one at a time, as a worker would."""
        while True:
            self.phase = "sqs"
            received = self.queue.receive(1, 0, 600)
            if not received:
                return
            r = received[0]
            n = self.messages_processed
            self.messages_processed += 1
            if (hook := self.before_message.get(n)) is not None:
                hook(self)
            self.phase = "worker"
            message = WorkMessage.model_validate_json(r.body)
            if message.chunk == self.hang_chunk:
                open_attempt(self.stores, message)
                self.log.append(f"worker hangs on chunk {message.chunk}")
                continue  # the message stays in flight
            self.chunk = message.chunk
            try:
                asyncio.run(
                    process_chunk(
                        self.stores, message, self.engine, io=_direct, max_line_bytes=1024 * 1024, now=lambda: self.now
                    )
                )
                self.queue.delete(r.receipt)
                continue
            except Killed:
                self.log.append(f"worker killed on chunk {message.chunk}")
                self._visible_again(r.receipt)  # its visibility timeout ends: SQS delivers it again
            except Exception as exc:
                self.log.append(f"chunk {message.chunk} raised {type(exc).__name__}")
                self.phase = "sqs"
                if not self.queue.release(r.receipt, 0):
                    self._visible_again(r.receipt)
            finally:
                self.chunk = None
            if r.receive_count >= names.WORK_MAX_RECEIVES:
                self._dead_letter(r.receipt, message)

    def _visible_again(self, receipt: str) -> None:
        for m in self.queue.messages:
            if m.receipt == receipt:
                m.visible = True

    def _dead_letter(self, receipt: str, message: WorkMessage) -> None:
        self.queue.messages = [m for m in self.queue.messages if m.receipt != receipt]
        self.dead_lettered_chunks.append(message.chunk)
        self.log.append(f"chunk {message.chunk} dead-lettered")
        self._handler("dlq", lambda: dlq.fail_chunk(self.stores, message, now=self.now))

    # --- the workflow (infra/workflow.py's state machine) -------------------------------------------
    def task(self, phase: str, call: Callable[[], dict[str, Any]]) -> dict[str, Any]:
        """One task state: 1 + TASK_RETRIES attempts (2, 4, 8 s apart), then the error."""
        error: BaseException | None = None
        for attempt in range(1 + TASK_RETRIES):
            if attempt:
                self.now += 2 * 2 ** (attempt - 1)
            self.phase = phase
            try:
                if phase in self.duplicate_tasks and not attempt:
                    call()  # its answer is lost: the state retries the task
                    self.log.append(f"{phase}'s answer lost")
                return call()
            except (Exception, Killed) as exc:
                self.log.append(f"{phase} attempt {attempt + 1} raised {type(exc).__name__}")
                error = exc
        assert error is not None
        raise _TaskFailed(error)

    def run_workflow(self) -> None:
        started = self.stores.workflows.started.get(BATCH)
        if started is None:
            self.execution = "never started"
            return
        self.execution = "running"
        try:
            signal = self._wait(int(started["timeout_seconds"]))
            if signal is None:
                return
            while True:
                drained = self.task(
                    "drain", lambda: workflow.drain(self.stores, SETTINGS, TENANT, BATCH, signal, self.now)
                )
                if drained["drained"]:
                    break
                self.now += SETTINGS.drain_poll_seconds
                self.work()
            reason = drained["reason"]
            self.task("finalize", lambda: workflow.finalize(self.stores, TENANT, BATCH, reason, self.now))
            self.execution = "succeeded"
        except _TaskFailed as failed:
            cause = failed.error
            try:
                self.task(
                    "fail",
                    lambda: workflow.fail(
                        self.stores,
                        TENANT,
                        BATCH,
                        TaskError(Error=type(cause).__name__, Cause=str(cause)),
                        self.now,
                    ),
                )
                self.execution = "failed (Fail state)"
            except _TaskFailed:
                self.execution = "failed (Fail task failed)"

    def _wait(self, timeout: int) -> str | None:
        """WaitForSignal, Check, WaitAgain until a signal (or Check) says what to do."""
        tokens = 0
        while self.now <= START + WINDOW + GIVE_UP_AFTER_EXPIRY:
            tokens += 1
            token = f"token-{tokens}"
            seen = len(self.stores.workflows.signals)
            self.task("register", lambda: workflow.register(self.stores, TENANT, BATCH, token))
            self.work()  # the workers run while the execution waits
            resumed = [out for t, out in self.stores.workflows.signals[seen:] if t == token]
            self.stores.workflows.closed.add(token)  # resumed or timed out: the token waits no more
            if resumed:
                return str(resumed[0]["outcome"])
            self.now += timeout  # States.Timeout -> Check
            checked = self.task("check", lambda: workflow.check(self.stores, TENANT, BATCH, RECONCILE, self.now))
            if checked["outcome"] != workflow.WAIT:
                return str(checked["outcome"])
            timeout = int(checked["timeout_seconds"])
        self.execution = "gave up waiting"
        return None

    # --- one whole run ------------------------------------------------------------------------------
    def run(self) -> Driver:
        self.submit()
        self.deliver_ingest()
        if self.order == "work_first":
            self.work()
        self.run_workflow()
        if self.batch().status not in TERMINAL_STATUSES:
            self._sweep()
        self.finished_at = self.now
        self.phase = "done"
        return self

    def _sweep(self) -> None:
        """The scheduled sweeper (``functions.sweeper.logic.sweep``): every ``sweep_seconds`` it
        ends or restarts the open batches the normal path left behind; a workflow it starts runs,
        and the workers take the messages it sends."""
        period = SETTINGS.sweep_seconds
        while self.batch().status not in TERMINAL_STATUSES and self.now <= START + WINDOW + GIVE_UP_AFTER_EXPIRY:
            self.now += period
            self.phase = "sweep"
            try:
                sweep(self.stores, SETTINGS, now=self.now)
            except (Exception, Killed) as exc:
                self.log.append(f"sweep raised {type(exc).__name__}")
            self.work()
            if self.stores.workflows.started.get(BATCH) is not None and self.execution in (
                "not started",
                "never started",
            ):
                self.log.append("the sweeper started the workflow")
                self.run_workflow()


class _TaskFailed(Exception):
    def __init__(self, error: BaseException):
        super().__init__(str(error))
        self.error = error


async def _direct(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    return fn(*args, **kwargs)


def engine_answer(custom_id: str) -> str:
    """What the fake engine answered for a request line (the assistant's content)."""
    return f"echo line {custom_id.removeprefix('req-')}"


__all__ = ["Driver", "Fault", "Killed", "content", "custom_ids", "engine_answer", "request_line"]
