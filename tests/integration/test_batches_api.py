"""Batches API (create, retrieve, list, cancel) and models, through the local front with the SDK."""

import json
import time

import openai
import pytest
from openai.types import Batch, Model

from functions.core import schema
from functions.core.lifecycle import Change
from tests.builders import set_batch
from tests.helpers import assert_error, assert_openai_shape

CHAT = "/v1/chat/completions"


def line(i, model="test-chat", **extra):
    body = {"model": model, "messages": [{"role": "user", "content": f"hi {i}"}]}
    return json.dumps({"custom_id": f"req-{i}", "method": "POST", "url": CHAT, "body": body, **extra})


def input_file(client, lines, name="in.jsonl"):
    return client.files.create(file=(name, ("\n".join(lines) + "\n").encode()), purpose="batch")


@pytest.fixture
def batch_file(client):
    return input_file(client, [line(i) for i in range(3)])


def test_create_matches_openai_and_snapshots_the_input(raw, batch_file, stores, client):
    response = raw.post(
        "/batches",
        json={
            "input_file_id": batch_file.id,
            "endpoint": CHAT,
            "completion_window": "24h",
            "metadata": {"team": "nlp"},
        },
    )
    assert response.status_code == 200, response.text
    batch = assert_openai_shape(Batch, response.json())
    assert batch.id.startswith("batch_") and batch.object == "batch" and batch.status == "validating"
    assert batch.input_file_id == batch_file.id and batch.endpoint == CHAT and batch.completion_window == "24h"
    assert batch.expires_at == batch.created_at + 86_400
    assert batch.metadata == {"team": "nlp"}
    assert batch.request_counts.model_dump() == {"completed": 0, "failed": 0, "total": 0}
    assert batch.output_file_id is None and batch.error_file_id is None and batch.errors is None
    snapshot = stores.objects.get(schema.batch_input_key("acme", batch.id))
    assert snapshot == client.files.content(batch_file.id).content
    # the batch keeps its input even if the file goes
    client.files.delete(batch_file.id)
    assert stores.objects.get(schema.batch_input_key("acme", batch.id)) == snapshot
    assert client.batches.retrieve(batch.id).id == batch.id


def test_without_a_key_every_create_is_a_new_batch(client, batch_file):
    """As on OpenAI: no Idempotency-Key, no deduplication (the SDK's own retries send no key)."""
    args = {"input_file_id": batch_file.id, "endpoint": CHAT, "completion_window": "24h"}
    first = client.batches.create(**args)
    second = client.batches.create(**args)
    assert second.id != first.id
    assert client.batches.cancel(first.id).status in ("cancelling", "cancelled")
    third = client.batches.create(**args)  # create -> cancel -> create again: a new, live batch
    assert third.id not in (first.id, second.id) and third.status == "validating"
    assert sorted(b.id for b in client.batches.list().data) == sorted([first.id, second.id, third.id])


def idempotency_records(settings, scope="create_batch#key"):
    from boto3.dynamodb.conditions import Key

    from functions.core import clients

    table = clients.dynamodb_table(settings.table_name)
    return table.query(KeyConditionExpression=Key("pk").eq(f"IDEMPOTENCY#{scope}"))["Items"]


def test_same_key_and_body_return_the_first_batch_for_24_hours(client, batch_file, settings):
    args = {"input_file_id": batch_file.id, "endpoint": CHAT, "completion_window": "24h", "metadata": {"team": "nlp"}}
    before = int(time.time())
    first = client.batches.create(**args, extra_headers={"Idempotency-Key": "k1"})
    again = client.batches.create(**args, extra_headers={"Idempotency-Key": "k1"})
    assert again.model_dump() == first.model_dump()
    other_key = client.batches.create(**args, extra_headers={"Idempotency-Key": "k2"})
    after = int(time.time())
    assert other_key.id != first.id
    assert sorted(b.id for b in client.batches.list().data) == sorted([other_key.id, first.id])
    records = idempotency_records(settings)
    assert len(records) == 2 and {r["status"] for r in records} == {"COMPLETED"}
    for record in records:
        assert before + 24 * 3_600 <= record["ttl"] <= after + 24 * 3_600
    client.batches.create(input_file_id=batch_file.id, endpoint=CHAT, completion_window="24h")
    assert len(idempotency_records(settings)) == 2  # a create without a key keeps no record
    assert idempotency_records(settings, "create_batch#body") == []


@pytest.mark.parametrize(
    "change",
    [{"metadata": {"team": "cv"}}, {"metadata": None}, {"completion_window": "1h"}, {"endpoint": "/v1/completions"}],
)
def test_same_key_with_another_body_is_409(raw, client, batch_file, change):
    body = {"input_file_id": batch_file.id, "endpoint": CHAT, "completion_window": "24h", "metadata": {"team": "nlp"}}
    headers = {"Idempotency-Key": "k1"}
    first = raw.post("/batches", json=body, headers=headers)
    assert first.status_code == 200, first.text
    other = {k: v for k, v in {**body, **change}.items() if v is not None}
    assert_error(
        raw.post("/batches", json=other, headers=headers),
        409,
        "idempotency_key_reused",
        None,
        message="different request body",
    )
    with pytest.raises(openai.ConflictError) as info:
        client.batches.create(**other, extra_headers=headers)
    assert info.value.status_code == 409 and info.value.code == "idempotency_key_reused"
    assert info.value.type == "invalid_request_error"
    # the key still answers its own body with its batch, and nothing else was created
    assert raw.post("/batches", json=body, headers=headers).json()["id"] == first.json()["id"]
    assert [b.id for b in client.batches.list().data] == [first.json()["id"]]


def test_a_failed_keyed_create_keeps_no_record(raw, batch_file, settings):
    headers = {"Idempotency-Key": "k1"}
    body = {"input_file_id": batch_file.id, "endpoint": CHAT, "completion_window": "24h"}
    missing = {**body, "input_file_id": "file-01m8n7xjx1bekcr5r3de2q3dfv"}
    assert_error(raw.post("/batches", json=missing, headers=headers), 404, None, "input_file_id")
    assert idempotency_records(settings) == []
    created = raw.post("/batches", json=body, headers=headers)  # the key is free for the corrected body
    assert created.status_code == 200, created.text
    assert raw.post("/batches", json=body, headers=headers).json()["id"] == created.json()["id"]


def test_same_key_while_the_first_create_runs_is_409(raw, client, batch_file, api_url, keys, monkeypatch):
    from functions.api import batches
    from tests.helpers import raw_client

    body = {"input_file_id": batch_file.id, "endpoint": CHAT, "completion_window": "24h"}
    headers = {"Idempotency-Key": "k1"}
    real_create = batches.create_batch
    concurrent = []

    def create_while_another_arrives(*args, **kwargs):
        if not concurrent:  # the same create arrives while the first is still inside create_batch
            with raw_client(api_url, keys["acme"]) as second_client:
                concurrent.append(second_client.post("/batches", json=body, headers=headers))
        return real_create(*args, **kwargs)

    monkeypatch.setattr(batches, "create_batch", create_while_another_arrives)
    first = raw.post("/batches", json=body, headers=headers)
    assert first.status_code == 200, first.text
    assert_error(concurrent[0], 409, "idempotency_key_in_progress", None, message="still being processed")
    assert raw.post("/batches", json=body, headers=headers).json()["id"] == first.json()["id"]
    assert [b.id for b in client.batches.list().data] == [first.json()["id"]]


def test_idempotency_keys_are_per_tenant(client, other_client, batch_file):
    other_file = input_file(other_client, [line(0)])
    headers = {"Idempotency-Key": "same"}
    mine = client.batches.create(
        input_file_id=batch_file.id, endpoint=CHAT, completion_window="24h", extra_headers=headers
    )
    theirs = other_client.batches.create(
        input_file_id=other_file.id, endpoint=CHAT, completion_window="24h", extra_headers=headers
    )
    assert mine.id != theirs.id
    assert [b.id for b in client.batches.list().data] == [mine.id]
    assert [b.id for b in other_client.batches.list().data] == [theirs.id]
    # each tenant's key still returns its own batch
    assert (
        client.batches.create(
            input_file_id=batch_file.id, endpoint=CHAT, completion_window="24h", extra_headers=headers
        ).id
        == mine.id
    )
    assert (
        other_client.batches.create(
            input_file_id=other_file.id, endpoint=CHAT, completion_window="24h", extra_headers=headers
        ).id
        == theirs.id
    )


@pytest.mark.parametrize(
    ("change", "status", "code", "param"),
    [
        ({"input_file_id": "file-01m8n7xjx1bekcr5r3de2q3dfv"}, 404, None, "input_file_id"),
        ({"input_file_id": "nope"}, 404, None, "input_file_id"),
        ({"endpoint": "/v1/images/generations"}, 400, "invalid_value", "endpoint"),
        ({"completion_window": "48h"}, 400, "invalid_value", "completion_window"),
        ({"metadata": {f"k{i}": "v" for i in range(17)}}, 400, "invalid_value", "metadata"),
        ({"metadata": {"k" * 65: "v"}}, 400, "invalid_value", "metadata"),
        ({"metadata": {"k": "v" * 513}}, 400, "invalid_value", "metadata"),
        ({"metadata": {"k": 1}}, 400, "invalid_value", "metadata"),
        (
            {"output_expires_after": {"anchor": "created_at", "seconds": 10}},
            400,
            "invalid_value",
            "output_expires_after.seconds",
        ),
        (
            {"output_expires_after": {"anchor": "now", "seconds": 7200}},
            400,
            "invalid_value",
            "output_expires_after.anchor",
        ),
        ({"endpoint": None}, 400, "invalid_value", "endpoint"),
    ],
)
def test_bad_create_requests_are_immediate_4xx(raw, batch_file, client, change, status, code, param):
    body = {"input_file_id": batch_file.id, "endpoint": CHAT, "completion_window": "24h", **change}
    assert_error(raw.post("/batches", json=body), status, code, param)
    assert client.batches.list().data == []


def test_missing_parameter(raw, batch_file):
    assert_error(
        raw.post("/batches", json={"input_file_id": batch_file.id, "endpoint": CHAT}),
        400,
        "missing_required_parameter",
        "completion_window",
    )


def test_input_file_must_have_purpose_batch(raw, client):
    f = client.files.create(file=("x.jsonl", line(0).encode()), purpose="user_data")
    assert_error(
        raw.post("/batches", json={"input_file_id": f.id, "endpoint": CHAT, "completion_window": "24h"}),
        400,
        "invalid_file_purpose",
        "input_file_id",
    )


def test_another_tenants_file_or_batch_is_404(client, other_client, batch_file):
    with pytest.raises(openai.NotFoundError):
        other_client.batches.create(input_file_id=batch_file.id, endpoint=CHAT, completion_window="24h")
    batch = client.batches.create(input_file_id=batch_file.id, endpoint=CHAT, completion_window="24h")
    with pytest.raises(openai.NotFoundError) as info:
        other_client.batches.retrieve(batch.id)
    assert info.value.param == "batch_id"
    with pytest.raises(openai.NotFoundError):
        other_client.batches.cancel(batch.id)
    assert other_client.batches.list().data == []
    assert client.batches.retrieve(batch.id).status == "validating"


@pytest.mark.parametrize("batch_id", ["batch_01m8n7xjx1bekcr5r3de2q3dfv", "batch_nope", "file-x"])
def test_unknown_batch_is_404(raw, batch_id):
    assert_error(raw.get(f"/batches/{batch_id}"), 404, None, "batch_id", message=f"No such Batch object: {batch_id}")
    assert_error(raw.post(f"/batches/{batch_id}/cancel"), 404, None, "batch_id")


def test_list_newest_first_with_cursor(client, raw, batch_file):
    made = [
        client.batches.create(
            input_file_id=batch_file.id,
            endpoint=CHAT,
            completion_window="24h",
            extra_headers={"Idempotency-Key": str(i)},
        ).id
        for i in range(7)
    ]
    page = client.batches.list(limit=3)
    assert [b.id for b in page.data] == made[::-1][:3] and page.has_more
    body = raw.get("/batches", params={"limit": 3}).json()
    assert set(body) == {"object", "data", "first_id", "last_id", "has_more"}
    for item in body["data"]:
        assert_openai_shape(Batch, item)
    assert [b.id for b in client.batches.list(limit=3)] == made[::-1]  # SDK auto-pagination
    assert_error(raw.get("/batches", params={"limit": 101}), 400, "invalid_value", "limit")
    assert_error(raw.get("/batches", params={"after": "x"}), 400, "invalid_value", "after")


def test_cancel_while_validating_then_repeat(client, batch_file):
    batch = client.batches.create(input_file_id=batch_file.id, endpoint=CHAT, completion_window="24h")
    cancelled = client.batches.cancel(batch.id)
    assert cancelled.status == "cancelling" and cancelled.cancelling_at is not None
    assert client.batches.cancel(batch.id) == cancelled  # unchanged, like OpenAI


@pytest.fixture
def signals(stores, monkeypatch):
    """Every workflow signal the API sends, as (token, output)."""
    sent = []
    monkeypatch.setattr(stores.workflows, "signal", lambda token, output: sent.append((token, output)) or True)
    return sent


def test_cancel_in_progress_signals_the_workflow_once(client, stores, batch_file, signals):
    batch = client.batches.create(input_file_id=batch_file.id, endpoint=CHAT, completion_window="24h")
    set_batch(stores, "acme", batch.id, status="in_progress", task_token="token-1")
    cancelled = client.batches.cancel(batch.id)
    assert cancelled.status == "cancelling" and cancelled.cancelling_at is not None
    assert signals == [("token-1", {"outcome": "cancel"})]
    assert client.batches.cancel(batch.id) == cancelled
    assert len(signals) == 1


@pytest.mark.parametrize("status", ["cancelling", "finalizing", "completed", "failed", "expired", "cancelled"])
def test_cancel_of_a_finalizing_or_terminal_batch_returns_it_unchanged(client, stores, batch_file, signals, status):
    batch = client.batches.create(input_file_id=batch_file.id, endpoint=CHAT, completion_window="24h")
    set_batch(stores, "acme", batch.id, status=status, task_token="token-1")
    before = client.batches.retrieve(batch.id)
    assert before.status == status
    assert client.batches.cancel(batch.id) == before
    assert client.batches.retrieve(batch.id) == before
    assert signals == []


def test_cancel_racing_the_workflow_returns_the_batch_as_it_moved_on(client, stores, batch_file, signals, monkeypatch):
    """The batch moves to finalizing (expiry) between cancel's read and its conditional write."""
    batch = client.batches.create(input_file_id=batch_file.id, endpoint=CHAT, completion_window="24h")
    set_batch(stores, "acme", batch.id, status="in_progress", task_token="token-1")
    transition = stores.batches.transition

    def racing(tenant, batch_id, change, **kwargs):
        transition(tenant, batch_id, Change(values={"status": "finalizing", "finalizing_at": 1_234}))  # the expiry's
        return transition(tenant, batch_id, change, **kwargs)

    monkeypatch.setattr(stores.batches, "transition", racing)
    answer = client.batches.cancel(batch.id)
    assert answer.status == "finalizing" and answer.finalizing_at == 1_234 and answer.cancelling_at is None
    monkeypatch.setattr(stores.batches, "transition", transition)
    assert client.batches.retrieve(batch.id) == answer
    assert signals == []


def test_models(client, raw):
    models = client.models.list()
    assert sorted(m.id for m in models) == ["test-chat", "test-embed"]
    body = raw.get("/models").json()
    assert set(body) == {"object", "data"} and body["object"] == "list"
    for item in body["data"]:
        assert_openai_shape(Model, item)
    assert client.models.retrieve("test-chat").id == "test-chat"
    assert_error(raw.get("/models/gpt-x"), 404, None, "model")
