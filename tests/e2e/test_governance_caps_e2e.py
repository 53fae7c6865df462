"""Enqueued caps end to end (docs/governance.md): an operator sets a tiny enqueued-token
cap with ``batchctl tenants set`` (no redeploy); through the official SDK a batch over it ends
``failed`` with ``token_limit_exceeded`` and OpenAI's wording, one under it completes, and the
tenant's counter (``batchctl tenants get``'s usage) is back at zero afterwards."""

import io
import json
import re

import pytest

from batchctl import cli
from functions.core.tenants import estimate_tokens
from tests.e2e.test_batches_e2e import chat_line, submit, wait

pytestmark = [pytest.mark.e2e, pytest.mark.engine, pytest.mark.slow]


def batchctl(deployment, *argv: str) -> dict:
    out, err = io.StringIO(), io.StringIO()
    assert cli.main(list(argv), env=deployment.env, out=out, err=err) == 0, err.getvalue()
    return json.loads(out.getvalue())


def test_a_batch_over_the_enqueued_token_cap_fails_one_under_it_completes_and_the_counter_returns_to_zero(
    deployment_with_models, chat_model, request
):
    name = "e2e-caps-" + re.sub(r"[^A-Za-z0-9_.-]", "-", request.node.name)[:40]
    tenant = deployment_with_models.tenant(name)
    small = [chat_line(i, model=chat_model, max_tokens=4) for i in range(2)]
    large = [chat_line(i, model=chat_model, max_tokens=4) for i in range(10)]
    small_tokens = sum(estimate_tokens(len(json.dumps(r).encode()) + 1) for r in small)
    cap = small_tokens + small_tokens // 2  # room for the small batch, not for the large one
    batchctl(
        deployment_with_models, "tenants", "set", "--tenant", tenant, "--max-enqueued-tokens", f"{chat_model}={cap}"
    )
    sdk = deployment_with_models.client(deployment_with_models.new_key(name))

    refused = wait(sdk, submit(sdk, large).id)
    assert refused.status == "failed", refused
    (error,) = refused.errors.data
    assert error.code == "token_limit_exceeded" and error.line is None and error.param is None
    assert error.message == (
        f"Enqueued token limit reached for {chat_model} in organization {tenant}. Limit: {cap} enqueued tokens. "
        "Please try again once some in_progress batches have been completed."
    )

    done = wait(sdk, submit(sdk, small).id)
    assert done.status == "completed", done
    assert (done.request_counts.completed, done.request_counts.total) == (2, 2)
    usage = batchctl(deployment_with_models, "tenants", "get", "--tenant", tenant)["usage"]
    assert usage["enqueued"] == {chat_model: {"requests": 0, "tokens": 0}}
