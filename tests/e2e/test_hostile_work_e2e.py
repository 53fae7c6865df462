"""A tenant asking for more work than its lines may, end to end (the real engine, the real worker,
the audit appender): the operator bounds the tenant's lines with batchctl (no redeploy); a batch
with a line asking ``n: 64`` and one asking more output than the bound fails at validation with
OpenAI's codes, line numbers and params, before anything runs; a batch whose lines set no output
limit gets the bound's share per sequence from the worker; and the tenant's budget items end up
charged exactly what the engine reported for its lines (input and output), by the appender, with
no write of the worker's."""

import io
import json
import re

import pytest

from batchctl import cli
from tests.e2e.target import eventually
from tests.e2e.test_batches_e2e import chat_line, check_invariants, submit, wait

pytestmark = [pytest.mark.e2e, pytest.mark.engine]

MAX_N, MAX_OUTPUT = 4, 24


def batchctl(deployment, *argv: str) -> dict:
    out, err = io.StringIO(), io.StringIO()
    code = cli.main(list(argv), env=deployment.env, out=out, err=err)
    assert code == 0, err.getvalue()
    return json.loads(out.getvalue())


def test_work_over_the_bounds_fails_validation_and_every_answer_is_charged(deployment_with_models, chat_model, request):
    name = "e2e-work-" + re.sub(r"[^A-Za-z0-9_.-]", "-", request.node.name)[:40]
    tenant = deployment_with_models.tenant(name)
    batchctl(
        deployment_with_models,
        "tenants",
        "set",
        "--tenant",
        tenant,
        "--line-max-n",
        str(MAX_N),
        "--line-max-output-tokens",
        str(MAX_OUTPUT),
        "--output-token-budget",
        "1000000",
        "--input-token-budget",
        "1000000",
        "--budget-period",
        "day",
    )
    sdk = deployment_with_models.client(deployment_with_models.new_key(name))

    many = chat_line(1, model=chat_model, max_tokens=4)
    many["body"]["n"] = 64
    long = chat_line(2, model=chat_model, max_tokens=MAX_OUTPUT)
    long["body"]["n"] = 2  # 2 x 24 = 48 output tokens > 24
    refused = wait(sdk, submit(sdk, [chat_line(0, model=chat_model, max_tokens=4), many, long]).id)
    assert refused.status == "failed", refused
    errors = {(e.code, e.line, e.param) for e in refused.errors.data}
    assert errors == {("integer_above_max_value", 2, "body.n"), ("integer_above_max_value", 3, "body.max_tokens")}, (
        errors
    )
    assert refused.output_file_id is None and refused.error_file_id is None  # nothing ran

    unbounded = [chat_line(i, model=chat_model) for i in range(3)]
    for row in unbounded:
        del row["body"]["max_tokens"]  # no limit of its own: the worker gives each its share
        row["body"]["ignore_eos"] = True  # vLLM's: generate up to the limit
    unbounded[1]["body"].update(n=2, temperature=1.0, seed=7)  # vLLM refuses n > 1 with greedy sampling
    done = wait(sdk, submit(sdk, unbounded).id, timeout=600)
    assert done.status == "completed", done
    out, err = check_invariants(sdk, done, [r["custom_id"] for r in unbounded])
    assert err == [] and len(out) == 3
    usage = {o.custom_id: o.response.body["usage"] for o in out}
    assert {k: u["completion_tokens"] for k, u in usage.items()} == {
        "chat-0": MAX_OUTPUT,
        "chat-1": MAX_OUTPUT,
        "chat-2": MAX_OUTPUT,
    }  # 2 x 12 for n=2
    spent = {
        "output_tokens": sum(u["completion_tokens"] for u in usage.values()),
        "input_tokens": sum(u["prompt_tokens"] for u in usage.values()),
    }

    def charged() -> bool:
        budget = batchctl(deployment_with_models, "tenants", "get", "--tenant", tenant)["usage"]["budget"]
        return {k: budget[k] for k in spent} == spent

    assert eventually(charged, within=60, interval=1), (
        spent,
        batchctl(deployment_with_models, "tenants", "get", "--tenant", tenant)["usage"],
    )
