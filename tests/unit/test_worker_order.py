"""The order lines enter the engine (``gpu_worker.admission.Admission``, ``WorkerConfig.order``) on
the in-memory fakes: ``smart`` sends the longest expected output first and lines sharing a first
message together, across the chunks a worker has open; ``file`` keeps arrival order. Either way
each chunk's result parts keep input order and the chunk counts exactly once (a duplicate
delivery; a crash mid-chunk with checkpoints, then redelivery); a chunk's slow last line does not
keep the next chunk out. Nothing here waits on wall-clock time for its verdict."""

import asyncio
import json

import pytest
from pydantic import ValidationError

from functions.core import schema
from functions.core.messages import WorkMessage
from functions.core.wire import BatchOutputLine
from gpu_worker.admission import Admission, expected_output, length_class, prefix_of
from gpu_worker.attempt import RunPolicy
from gpu_worker.config import WorkerConfig
from gpu_worker.engine_client import EngineDown
from tests.builders import assert_fields, cut, running_batch
from tests.chunks import part_bytes, process_chunk
from tests.fakes.aws import fake_stores
from tests.fakes.engine import CrashingEngine, InProcessEngine, chat_answer, content
from tests.unit.test_worker_loop import NOW, PATIENCE, Rig, seed, until

CHAT = "/v1/chat/completions"
SYSTEM = {name: f"You are assistant {name}. " + "Follow these long shared instructions. " * 20 for name in "ABC"}
#: (max_tokens or None, system prompt) of lines 0..7; chunks of 4 lines.
LINES = [(16, "A"), (300, "B"), (64, "A"), (300, "A"), (64, "B"), (None, "C"), (300, "B"), (16, "A")]
#: Unbounded first; then 300 (A's group before B's: A was seen first), 64, 16; ties by arrival.
SMART = [5, 3, 1, 6, 2, 4, 0, 7]


def body(i: int, max_tokens: int | None, system: str) -> dict:
    b = {
        "model": "test-chat",
        "messages": [{"role": "system", "content": SYSTEM[system]}, {"role": "user", "content": f"hi {i}"}],
    }
    if max_tokens is not None:
        b["max_tokens"] = max_tokens
    return b


def seed_lines(stores, specs=LINES, per_chunk=4) -> list[WorkMessage]:
    """An in_progress batch of ``specs`` chat lines (custom_id req-<i>, user message "hi <i>")."""
    raw = [
        (json.dumps({"custom_id": f"req-{i}", "method": "POST", "url": CHAT, "body": body(i, *spec)}) + "\n").encode()
        for i, spec in enumerate(specs)
    ]
    key = schema.batch_input_key("acme", "batch_1")
    stores.objects.put(key, b"".join(raw))
    chunks = cut(raw, per_chunk)
    batch = running_batch(created_at=NOW, total=len(raw), chunk_count=len(chunks), model="test-chat")
    stores.batches.put(batch)
    return [batch.work_message(chunk) for chunk in chunks]


async def direct(fn, *args, **kwargs):
    return fn(*args, **kwargs)


def chunk(stores, message, engine, admission, **kwargs):
    return process_chunk(
        stores,
        message,
        engine,
        io=direct,
        max_line_bytes=1 << 20,
        now=lambda: 1000,
        admission=admission,
        owner=message.chunk,
        **kwargs,
    )


def sent(engine) -> list[int]:
    return [int(c.split()[1]) for c in engine.contents()]


def results(stores, chunk_number):
    """The counted (custom_id, answer content) of a chunk's output part, and of its error part."""
    marker = stores.batches.counted_chunk("acme", "batch_1", chunk_number)
    assert marker is not None, f"chunk {chunk_number} not counted"

    def read(kind):
        data = part_bytes(stores.objects, "acme", "batch_1", chunk_number, marker.attempt, kind)
        lines = [BatchOutputLine.model_validate_json(l) for l in data.splitlines()]
        return [
            (l.custom_id, l.response.body["choices"][0]["message"]["content"] if l.response else l.error.code)
            for l in lines
        ]

    return read("out"), read("err")


def run_all_waiting(order: str, engine=None):
    """Both chunks of LINES through one admission of capacity 1, every line waiting before the
    first enters (a slot is held until then); returns the engine, the stores and the reports."""
    stores, engine = fake_stores(), engine or InProcessEngine()
    messages = seed_lines(stores)
    admission = Admission(1, order)

    async def scenario():
        release = asyncio.Event()

        async def occupy():
            async with admission.slot({}):
                await release.wait()

        holder = asyncio.create_task(occupy())
        await asyncio.sleep(0)
        runs = []
        for m in messages:  # the chunks arrive one after the other, as the loop receives them
            runs.append(asyncio.create_task(chunk(stores, m, engine, admission)))
            await until(lambda: admission.waiting_for(m.chunk) == m.line_count, f"chunk {m.chunk} waiting")
        assert admission.waiting == len(LINES)
        release.set()
        await holder
        return await asyncio.gather(*runs)

    return engine, stores, asyncio.run(scenario())


def test_smart_order_sends_the_longest_first_and_a_shared_prefix_together_across_chunks():
    engine, _, _ = run_all_waiting("smart")
    assert sent(engine) == SMART


def test_file_order_sends_lines_as_they_came():
    engine, _, _ = run_all_waiting("file")
    assert sent(engine) == list(range(len(LINES)))


def test_the_output_parts_keep_input_order_and_equal_file_orders():
    _, smart_stores, smart = run_all_waiting("smart")
    _, file_stores, _file = run_all_waiting("file")
    for number in (0, 1):
        out, err = results(smart_stores, number)
        assert [c for c, _ in out] == [f"req-{i}" for i in range(4 * number, 4 * number + 4)] and err == []
        assert (out, err) == results(file_stores, number)
    assert [(r.completed, r.failed) for r in smart] == [(4, 0), (4, 0)]
    batch = smart_stores.batches.get("acme", "batch_1")
    assert_fields(batch, completed=8, failed=0, chunks_done=2)


def test_a_duplicate_delivery_of_a_reordered_chunk_counts_once():
    stores, engine = fake_stores(), InProcessEngine()
    first, _ = seed_lines(stores)
    admission = Admission(2, "smart")

    async def twice():  # SQS delivered the chunk twice: both copies run at once on one worker
        return await asyncio.gather(chunk(stores, first, engine, admission), chunk(stores, first, engine, admission))

    reports = asyncio.run(twice())
    assert sum(bool(r.outcome and r.outcome.counted) for r in reports) == 1
    out, err = results(stores, 0)
    assert [c for c, _ in out] == ["req-0", "req-1", "req-2", "req-3"] and err == []
    batch = stores.batches.get("acme", "batch_1")
    assert_fields(batch, completed=4, failed=0, chunks_done=1)


def test_a_crash_mid_chunk_with_checkpoints_then_redelivery_gives_file_orders_output_once():
    """Smart order, checkpoints every 2 lines, the engine dies on a line after others answered
    (what finished in order is checkpointed); the redelivery runs the rest: the chunk's parts are
    those of a file-order run, each line once, counted once."""
    specs = [(16, "A"), (300, "B"), (64, "A"), (300, "A"), (16, "B"), (300, "C"), (64, "B"), (16, "A")]

    def deliver(order, engine):
        stores = fake_stores()
        (message,) = seed_lines(stores, specs, per_chunk=8)
        policy = RunPolicy(checkpoint_min_seconds=0, checkpoint_lines=2, checkpoint_seconds=0)
        for _ in range(10):
            try:
                report = asyncio.run(chunk(stores, message, engine, Admission(2, order), policy=policy))
                return stores, report
            except EngineDown:
                if order == "smart":
                    assert stores.batches.chunk_run("acme", "batch_1", 0).written() > 0  # a checkpoint was kept
                engine.poison.clear()  # it crashed the engine once (a transient fault)
                engine.restart()
        raise AssertionError("never counted")

    smart_engine = CrashingEngine("hi 6", crash_after=4)  # "hi 6" (64 tokens) enters after the 300s
    smart_stores, smart = deliver("smart", smart_engine)
    file_stores, _ = deliver("file", InProcessEngine())
    assert smart_engine.crashes == 1 and smart.reused > 0
    assert results(smart_stores, 0) == results(file_stores, 0)
    out, _ = results(smart_stores, 0)
    assert [c for c, _ in out] == [f"req-{i}" for i in range(8)]
    batch = smart_stores.batches.get("acme", "batch_1")
    assert (batch.completed + batch.failed, batch.chunks_done) == (8, 1)


def test_a_chunks_slow_last_line_does_not_keep_the_next_chunk_out():
    """One chunk at a time (max_open_chunks 1): chunk 0's last line does not answer until chunk 1
    is counted. Its tail does not count as an open chunk, so chunk 1 is taken and runs."""
    rig = Rig(max_open_chunks=1)

    async def respond(path, body, seen):
        if content(body) == "hi 1":
            await until(lambda: rig.counted(1), "chunk 1 counted")
        return 200, chat_answer(body)

    rig.engine.respond = respond
    first, second = seed(rig.stores, 4, per_chunk=2)
    rig.queue.send([first.model_dump_json(), second.model_dump_json()])
    rig.run_until(lambda: rig.counted(0) and rig.counted(1), "both chunks counted")
    assert rig.engine.contents().index("hi 2") < rig.engine.contents().index("hi 1") + 2


def test_an_admission_whose_waiter_is_cancelled_hands_its_slot_on():
    admission = Admission(1, "smart")
    entered: list[str] = []

    async def line(name, hold):
        async with admission.slot({"max_tokens": 8}):
            entered.append(name)
            await hold.wait()

    async def scenario():
        hold = asyncio.Event()
        first = asyncio.create_task(line("first", hold))
        await asyncio.sleep(0)
        cancelled = asyncio.create_task(line("cancelled", hold))
        last = asyncio.create_task(line("last", hold))
        await until(lambda: admission.waiting == 2, "two waiting")
        cancelled.cancel()
        hold.set()
        await asyncio.wait_for(asyncio.gather(first, last, cancelled, return_exceptions=True), PATIENCE)
        assert (admission.in_flight, admission.waiting) == (0, 0)

    asyncio.run(scenario())
    assert entered == ["first", "last"]


def test_the_keys_of_the_order():
    assert expected_output({"max_completion_tokens": 5, "max_tokens": 9}) == 5
    assert expected_output({"max_output_tokens": 7}) == 7  # /v1/responses
    assert expected_output({}) == expected_output({"max_tokens": None}) == float("inf")
    assert length_class(64) == length_class(127) < length_class(128)
    assert prefix_of({"messages": [{"role": "system", "content": "s"}, {"role": "user", "content": "u"}]}) == prefix_of(
        {"messages": [{"content": "s", "role": "system"}, {"role": "user", "content": "other"}]}
    )
    assert prefix_of({"prompt": "x" * 2000}) == "x" * 512 and prefix_of({"input": ["a", "b"]}) == "a"
    assert prefix_of({"model": "m"}) is None


def test_the_order_is_configured_and_checked():
    assert WorkerConfig().order == "smart"
    assert WorkerConfig.from_env({"WORKER_ORDER": "file"}).order == "file"
    with pytest.raises(ValidationError):
        WorkerConfig(order="random")
    with pytest.raises(ValueError):
        Admission(4, "random")


def test_smart_order_keeps_about_max_num_seqs_in_the_engine_so_the_worker_picks_what_starts_next():
    """vLLM runs max_num_seqs and queues the rest first come, first served: in smart order only a
    quarter more than it runs is sent ahead (the rest waits in the worker's order); file order
    keeps the full cap (2 x) in flight."""
    assert WorkerConfig(engine_max_num_seqs=128, order="smart").admission_cap() == 160
    assert WorkerConfig(engine_max_num_seqs=128, order="file").admission_cap() == 256
    assert WorkerConfig(max_in_flight=8, order="smart").admission_cap() == 5  # 4 seqs implied by the cap
    assert WorkerConfig(engine_max_num_seqs=128, max_in_flight=100).admission_cap() == 100  # never above the cap
    assert WorkerConfig().admission_cap() == 320  # vLLM's default 256 seqs


def test_an_engine_that_schedules_by_priority_keeps_nearly_as_many_waiting_as_it_runs():
    """With the engine's queue in the worker's fair order (tags), it holds what it runs plus
    nearly as many again, as run-batch keeps it full; a quarter of max_num_seqs stays in reserve
    for a tenant that arrives, within the in-flight cap."""
    config = WorkerConfig(engine_max_num_seqs=128, engine_priority=True)
    assert (config.admission_cap(), config.admission_reserve(), config.in_flight_cap()) == (224, 32, 256)
    fcfs = WorkerConfig(engine_max_num_seqs=128)
    assert (fcfs.admission_cap(), fcfs.admission_reserve()) == (160, 32)
    assert WorkerConfig(engine_max_num_seqs=128, order="file").admission_reserve() == 0  # the cap is all in flight


def test_the_worker_admits_by_its_configured_order():
    for order, cap in (("smart", 5), ("file", 8)):
        rig = Rig(order=order)
        assert (rig.worker.admission.order, rig.worker.admission.capacity) == (order, cap)
