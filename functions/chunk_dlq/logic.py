"""Dead-lettered work messages: a chunk received ``WORK_MAX_RECEIVES`` times without being
counted (the last resort: the workers' own poison budget normally ends a chunk that keeps dying,
docs/reliability.md "Poison isolation"). The lines its workers checkpointed keep their results;
every other line gets a clear error line, and the chunk is counted through the shared ``chunk_lifecycle``,
so the batch still finishes (the last chunk signals the workflow as usual)."""

from dataclasses import dataclass

from functions.core import chunk_lifecycle, results
from functions.core.messages import WorkMessage
from functions.core.ports import Stores
from functions.core.work import Spend

#: The error code of a dead-lettered chunk's lines (OpenAI's code for a failure on its side).
ERROR_CODE = "server_error"


def error_message(message: WorkMessage) -> str:
    return (
        f"The request was not processed: its chunk (chunk {message.chunk}, from input line "
        f"{message.first_line}) failed on the GPU workers on every attempt and was dead-lettered. "
        "A request in it may crash or stall the engine; retry these requests in a new batch."
    )


@dataclass(frozen=True)
class DeadLetterOutcome:
    #: "recorded" (lines failed, chunk counted), "already_counted", "batch_closed" or "no_batch".
    action: str
    failed: int = 0
    last: bool = False


def fail_chunk(stores: Stores, message: WorkMessage, *, now: int) -> DeadLetterOutcome:
    """Keep the chunk's checkpointed results, write an error line for every other request line,
    and count the chunk (once)."""
    batch = stores.batches.get(message.tenant, message.batch_id)
    if batch is None:
        return DeadLetterOutcome("no_batch")
    if not batch.accepting:
        # Finalize already closed the batch: its requests got batch_expired/batch_cancelled lines.
        return DeadLetterOutcome("batch_closed")
    if stores.batches.counted_chunk(message.tenant, message.batch_id, message.chunk, message.shards) is not None:
        # A worker did count it (and died before deleting the message): keep its results, and do
        # what that worker may not have done after its count (fold its shard, signal, the receipt).
        return DeadLetterOutcome("already_counted", last=chunk_lifecycle.signal_if_all_counted(stores, message))
    run = stores.batches.chunk_run(message.tenant, message.batch_id, message.chunk, message.shards)
    lines = results.salvaged_lines(
        stores.objects, message, run.cover() if run is not None else [], ERROR_CODE, error_message(message)
    )
    usage = chunk_lifecycle.Usage()
    for line in lines:
        usage.add_response(results.usage_of(line))  # None for the error lines
    parts = results.write_parts(stores.objects, message, lines)
    spent = run.spend() if run is not None else Spend()  # what its attempts recorded (they never committed)
    outcome = chunk_lifecycle.record_chunk(stores, message, parts=parts, usage=usage, now=now, spent=spent)
    return DeadLetterOutcome("recorded" if outcome.counted else "already_counted", parts.failed, outcome.last)
