"""The API's audit hook through the official SDK, on moto: every mutating action (and a refusal)
sends one intent to the audit queue, which the appender (the real handler) turns into one record
of the tenant's chain with the request's id; reads send nothing."""

import io

import openai
import pytest

from functions.core import audit
from tests.integration.batch_helpers import line


def test_api_actions_are_chained_with_request_ids(client, other_client, keys, appender):
    created = client.files.with_raw_response.create(
        file=("in.jsonl", io.BytesIO((line(1) + "\n").encode())), purpose="batch"
    )
    file = created.parse()
    batch = client.batches.with_raw_response.create(
        input_file_id=file.id, endpoint="/v1/chat/completions", completion_window="24h"
    )
    batch_id = batch.parse().id
    client.batches.retrieve(batch_id)  # a read: not audited
    client.files.list()
    cancelled = client.batches.with_raw_response.cancel(batch_id)
    with pytest.raises(openai.NotFoundError) as refused:
        client.batches.cancel("batch_nope")

    records = appender.records("acme")
    assert [(r.action, r.target, r.outcome) for r in records] == [
        ("files.create", file.id, "200"),
        ("batches.create", batch_id, "200"),
        ("batches.cancel", batch_id, "200"),
        ("batches.cancel", "batch_nope", "404"),
    ]
    assert [r.request_id for r in records] == [
        created.headers["x-request-id"],
        batch.headers["x-request-id"],
        cancelled.headers["x-request-id"],
        refused.value.response.headers["x-request-id"],
    ]
    assert all(r.request_id for r in records)
    assert records[3].details["error_code"] == refused.value.code
    assert {r.actor for r in records} == {audit.key_actor(f"Bearer {keys['acme']}")}
    assert audit.verify(records) is None
    assert appender.records("globex") == []  # one chain per tenant
    assert appender.drain() == 0  # each intent appended once
