"""The budget is charged what the engine spent on a chunk, every attempt included: an answer with a
non-2xx status and a usage, an output the policy blocked, answers never read (timeouts, too large:
estimated from the line's limit), lines run by an attempt that ended benignly and ran again, and a
dead-lettered chunk's recorded attempts; the batch's own usage stays its counted lines'."""

import asyncio
from typing import Any

from functions.chunk_dlq import logic as dlq
from functions.core import chunk_lifecycle, tenants
from functions.core.budgets import BudgetCaps
from functions.core.guard import GuardPolicy
from functions.core.work import Spend, Work, unread_spend
from gpu_worker.engine_client import ENGINE_TIMEOUT, RESPONSE_TOO_LARGE, Reply
from tests.chunks import process_chunk
from tests.fakes.aws import fake_stores
from tests.fakes.engine import InProcessEngine, chat_answer, content
from tests.unit.test_worker_loop import NOW, seed

MONTH = tenants.budget_sk("month", 1000)


async def direct(fn, *args, **kwargs):
    return fn(*args, **kwargs)


def budgeted(stores, n: int, **message):
    (msg,) = seed(stores, n, per_chunk=n)
    stores.batches.set("acme", "batch_1", budget_period="month")
    return msg.model_copy(update={"budget_period": "month", **message})


def run(stores, message, engine):
    return asyncio.run(process_chunk(stores, message, engine, io=direct, max_line_bytes=1 << 20, now=lambda: 1000))


def test_a_4xx_with_usage_and_a_blocked_output_are_charged_but_not_the_batchs_usage():
    def respond(path, body, seen):
        if content(body) == "hi 1":
            return 400, {"error": {"message": "no"}, "usage": {"prompt_tokens": 7, "completion_tokens": 0}}
        return 200, chat_answer(body, completion_tokens=5, prompt_tokens=20)  # its text: "echo <content>"

    stores = fake_stores()
    message = budgeted(stores, 3, guard=GuardPolicy(output_deny_patterns=["echo hi 2"]))
    report = run(stores, message, InProcessEngine(respond))
    assert (report.completed, report.failed) == (1, 2)
    assert (report.usage.input_tokens, report.usage.output_tokens) == (20, 5)  # the batch's: line 0 only
    marker = stores.batches.counted_chunk("acme", "batch_1", 0)
    assert (marker.spent_input_tokens, marker.spent_output_tokens) == (20 + 7 + 20, 5 + 0 + 5)
    spent = stores.batches.budget_used("acme", MONTH)
    assert (spent.input_tokens, spent.output_tokens) == (47, 10)


class Unread:
    """An engine whose answers are never read: every line times out after ``attempts`` tries, or
    answers too much."""

    def __init__(self, code: str, attempts: int):
        self.code, self.attempts, self.bodies = code, attempts, []

    async def healthy(self) -> bool:
        return True

    async def wait_healthy(self, timeout: float, interval: float = 1.0) -> float:
        return 0.0

    async def post(self, path: str, body: dict[str, Any]) -> Reply:
        self.bodies.append(body)
        return Reply(None, None, "req_x", self.attempts, self.code, "never read")


def test_answers_never_read_are_charged_their_limit_for_each_attempt():
    stores = fake_stores()
    message = budgeted(stores, 2, max_line_output_tokens=64)  # the lines set no limit: each gets 64
    engine = Unread(ENGINE_TIMEOUT, attempts=4)
    assert run(stores, message, engine).failed == 2
    assert {b["max_completion_tokens"] for b in engine.bodies} == {64}
    marker = stores.batches.counted_chunk("acme", "batch_1", 0)
    assert marker.spent_output_tokens == 2 * 64 * 4 and marker.spent_input_tokens > 0
    assert (marker.output_tokens, marker.input_tokens) == (0, 0)  # nothing counted for the batch


def test_an_unbounded_line_whose_answer_was_too_large_is_charged_the_documented_ceiling():
    assert unread_spend(Work(n=2, inputs=1, output_limit=None), 40, 1) == Spend(10, 2 * 4096)
    stores = fake_stores()
    message = budgeted(stores, 1)
    run(stores, message, Unread(RESPONSE_TOO_LARGE, attempts=1))
    assert stores.batches.budget_used("acme", MONTH).output_tokens == 4096


def test_lines_run_by_an_attempt_that_ended_benignly_are_charged_with_the_count():
    stores = fake_stores()
    message = budgeted(stores, 2)
    # An earlier attempt ran both lines, recorded their spend at its benign end, wrote nothing.
    chunk_lifecycle.begin_run(stores, message, "a1", max_strikes=3, max_failures=10)
    chunk_lifecycle.end_run(stores, message, "a1", spent=Spend(30, 12))
    run(stores, message, InProcessEngine(lambda p, b, s: (200, chat_answer(b, completion_tokens=6, prompt_tokens=15))))
    marker = stores.batches.counted_chunk("acme", "batch_1", 0)
    assert (marker.output_tokens, marker.spent_output_tokens) == (12, 12 + 12)  # both runs, charged once
    assert stores.batches.budget_used("acme", MONTH).output_tokens == 24
    assert stores.batches.get("acme", "batch_1").output_tokens == 12  # the batch's usage: its lines once


def test_a_checkpointed_line_is_charged_once_though_a_later_attempt_reuses_it():
    stores = fake_stores()
    message = budgeted(stores, 2)
    answers = InProcessEngine(lambda p, b, s: (200, chat_answer(b, completion_tokens=6, prompt_tokens=15)))
    from gpu_worker.attempt import RunPolicy

    report = asyncio.run(
        process_chunk(
            stores,
            message,
            answers,
            io=direct,
            max_line_bytes=1 << 20,
            now=lambda: 1000,
            policy=RunPolicy(checkpoint_min_seconds=0, checkpoint_lines=1),
        )
    )
    assert report.completed == 2
    run_record = stores.batches.chunk_run("acme", "batch_1", 0)
    assert run_record.spend().output_tokens == 6  # the first line's checkpoint; the last is the commit's
    assert stores.batches.counted_chunk("acme", "batch_1", 0).spent_output_tokens == 12


def test_a_dead_lettered_chunk_charges_what_its_attempts_recorded():
    stores = fake_stores()
    message = budgeted(stores, 2)
    chunk_lifecycle.begin_run(stores, message, "a1", max_strikes=3, max_failures=10)
    chunk_lifecycle.end_run(stores, message, "a1", spent=Spend(11, 33))
    assert dlq.fail_chunk(stores, message, now=NOW).action == "recorded"
    assert stores.batches.budget_used("acme", tenants.budget_sk("month", NOW)).output_tokens == 33


def test_a_line_the_budget_stopped_costs_nothing():
    stores = fake_stores()
    message = budgeted(stores, 1, budget_stop=BudgetCaps(output_tokens=10))
    stores.batches.charge("acme", MONTH, output_tokens=10)
    from gpu_worker.budget import BudgetWatch

    engine = InProcessEngine()
    report = asyncio.run(
        process_chunk(
            stores,
            message,
            engine,
            io=direct,
            max_line_bytes=1 << 20,
            now=lambda: 1000,
            budget=BudgetWatch(stores, direct, now=lambda: 1000),
        )
    )
    assert report.failed == 1 and engine.requests == []
    assert stores.batches.counted_chunk("acme", "batch_1", 0).spent_output_tokens == 0
