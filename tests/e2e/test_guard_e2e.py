"""Prompt policy end to end (docs/governance.md, "Prompt and output policies"): a tenant whose policy refuses prompts with secrets
(set with batchctl, no redeploy) submits a batch through the official SDK in which one line holds
an AWS access key: that line ends in the error file with ``prompt_secret_detected`` (its message
names the type, never the key), the others complete, and the key is in neither file."""

import io
import json
import re

import pytest

from batchctl import cli
from tests.e2e.test_batches_e2e import chat_line, lines, submit, wait
from tests.unit.test_guard import SECRETS

pytestmark = [pytest.mark.e2e, pytest.mark.engine, pytest.mark.slow]


def test_a_line_with_an_aws_key_is_refused_and_the_others_complete(deployment_with_models, chat_model, request):
    name = "e2e-guard-" + re.sub(r"[^A-Za-z0-9_.-]", "-", request.node.name)[:40]
    tenant = deployment_with_models.tenant(name)
    out, err = io.StringIO(), io.StringIO()
    code = cli.main(
        ["tenants", "set", "--tenant", tenant, "--prompt-secrets", "refuse"],
        env=deployment_with_models.env,
        out=out,
        err=err,
    )
    assert code == 0, err.getvalue()
    assert json.loads(out.getvalue())["guard"]["prompt_secrets"] == "refuse"
    sdk = deployment_with_models.client(deployment_with_models.new_key(name))

    key = SECRETS["AWS access key id"][1]
    rows = [chat_line(i, model=chat_model, max_tokens=8) for i in range(4)]
    rows[2] = chat_line(2, content=f"Why is my key {key} rejected by S3?", model=chat_model, max_tokens=8)
    batch = wait(sdk, submit(sdk, rows).id)

    assert batch.status == "completed", batch
    assert (batch.request_counts.completed, batch.request_counts.failed, batch.request_counts.total) == (3, 1, 4)
    errors = lines(sdk, batch.error_file_id)
    assert [(e.custom_id, e.error.code) for e in errors] == [("chat-2", "prompt_secret_detected")]
    assert "AWS Access Key" in errors[0].error.message
    assert sorted(o.custom_id for o in lines(sdk, batch.output_file_id)) == ["chat-0", "chat-1", "chat-3"]
    for file_id in (batch.output_file_id, batch.error_file_id):
        assert key not in sdk.files.content(file_id).text
