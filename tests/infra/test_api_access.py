"""The table rights of the authorizer, the API and the reaper, evaluated the way IAM evaluates them
(``test_table_access``'s helpers): the authorizer reads API key items (``KEY#<sha256>``) and
nothing else; the API reads the table but writes only its own partitions, never a key, a key's
listing or id, or a tenant policy (those are the operator's, batchctl); the reaper releases
stored bytes on the ledger and touches nothing else there. The API's and the authorizer's real
request paths on moto (files, uploads, batches, a rate-limited tenant, a quota refusal) make only
requests their policies allow."""

import json
import threading
from typing import Any

import pytest

from functions.core import clients, schema
from functions.core.records import ApiKeyRecord
from functions.core.tenants import TenantPolicy
from functions.webhooks.store import webhooks_pk
from tests.infra.test_table_access import _operation_keys, _table_statements, allows

KEY_HASH = "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08"


def _statements(synth, function: Any) -> list[dict]:
    return _table_statements(synth, synth.logical_id(function.role))


def granted(statements: list[dict], action: str, keys: list[str], *, index: bool = False) -> bool:
    """IAM's answer for ``action`` on items of ``keys`` (on the index when ``index``): a statement
    without a condition (``grant_read_data``) allows its actions on its resources, the others as
    ``test_table_access.allows`` evaluates them (table only)."""
    for statement in statements:
        actions = statement["Action"] if isinstance(statement["Action"], list) else [statement["Action"]]
        if "Condition" not in statement:
            resources = statement["Resource"] if isinstance(statement["Resource"], list) else [statement["Resource"]]
            on_index = any("/index/" in str(r) for r in resources)
            if action in actions and (on_index or not index):
                return True
        elif not index and allows(statement, action, keys):
            return True
    return False


WRITES = ("dynamodb:PutItem", "dynamodb:UpdateItem", "dynamodb:DeleteItem")
READS = ("dynamodb:GetItem", "dynamodb:Query")


def test_the_authorizer_reads_key_items_and_nothing_else(synth):
    statements = _statements(synth, synth.stack.api.authorizer_function)
    assert len(statements) == 1 and statements[0]["Condition"] == {
        "ForAllValues:StringLike": {"dynamodb:LeadingKeys": ["KEY#*"]}
    }
    key = ApiKeyRecord(key_hash=KEY_HASH, tenant="acme", created_at=1, hint="abcd")
    assert granted(statements, "dynamodb:GetItem", [key.keys()[schema.PK]])
    others = [
        key.listing_item()[schema.PK],
        key.id_item()[schema.PK],
        schema.TENANTS_PK,
        schema.tenant_pk("acme"),
        schema.batches_pk("acme"),
        schema.audit_pk("acme"),
        schema.stored_pk("acme"),
        "IDEMPOTENCY#create_batch#key",
    ]
    for pk in others:
        assert not granted(statements, "dynamodb:GetItem", [pk]), pk
    for action in (*WRITES, "dynamodb:Query", "dynamodb:Scan", "dynamodb:BatchGetItem"):
        assert not granted(statements, action, [key.keys()[schema.PK]]), action
    assert not granted(statements, "dynamodb:Query", [key.keys()[schema.PK]], index=True)


def test_the_api_writes_its_own_partitions_never_keys_or_policies(synth):
    statements = _statements(synth, synth.stack.api.api_function)
    key = ApiKeyRecord(key_hash=KEY_HASH, tenant="acme", created_at=1, hint="abcd")
    policy_pk = TenantPolicy(tenant="acme").to_item()[schema.PK]
    # Keys, their listings and ids, policies: the operator's. Budgets, enqueued counters, chunk
    # partitions, webhook records, the scaler's state: other roles'.
    for pk in (
        key.keys()[schema.PK],
        key.listing_item()[schema.PK],
        key.id_item()[schema.PK],
        policy_pk,
        schema.budget_pk("acme"),
        schema.enqueued_pk("acme"),
        schema.chunks_pk("acme", "batch_x"),
        webhooks_pk("acme"),
        schema.scaler_pk("m"),
    ):
        for action in WRITES:
            assert not granted(statements, action, [pk]), (action, pk)
    # A transaction naming one of its partitions and a key item is denied as a whole.
    assert not granted(statements, "dynamodb:PutItem", [schema.tenant_pk("acme"), key.keys()[schema.PK]])
    for pk in (
        schema.tenant_pk("acme"),
        schema.batches_pk("acme"),
        schema.creations_pk("acme"),
        schema.requests_pk("acme"),
        schema.stored_pk("acme"),
        "IDEMPOTENCY#create_batch#key",
    ):
        for action in WRITES:
            assert granted(statements, action, [pk]), (action, pk)
    # The audit chains: only the appender writes them (the API sends it intents).
    for action in WRITES:
        assert not granted(statements, action, [schema.audit_pk("acme")]), action
    # It reads the policies (its per-request checks), files by purpose (the index), anything else.
    assert granted(statements, "dynamodb:GetItem", [policy_pk])
    assert granted(statements, "dynamodb:Query", [], index=True)
    for action in ("dynamodb:BatchWriteItem",):
        assert not granted(statements, action, [schema.tenant_pk("acme")])


def test_the_reaper_releases_stored_bytes_and_touches_nothing_else(synth):
    statements = _statements(synth, synth.stack.reaper.function)
    stored = schema.stored_pk("acme")
    for action in ("dynamodb:DeleteItem", "dynamodb:UpdateItem"):
        assert granted(statements, action, [stored]), action
    for action in ("dynamodb:PutItem", "dynamodb:GetItem", "dynamodb:Query"):
        assert not granted(statements, action, [stored]), action
    for pk in (schema.tenant_pk("acme"), schema.batches_pk("acme"), schema.key_pk(KEY_HASH), schema.TENANTS_PK):
        for action in (*WRITES, *READS):
            assert not granted(statements, action, [pk]), (action, pk)


def test_the_reaper_is_invoked_for_files_and_for_uploads_that_held_stored_bytes(synth):
    (mapping,) = [
        m
        for m in synth.resources("AWS::Lambda::EventSourceMapping").values()
        if m["Properties"]["FunctionName"] == {"Ref": synth.logical_id(synth.stack.reaper.function)}
    ]
    patterns = [f["Pattern"] for f in mapping["Properties"]["FilterCriteria"]["Filters"]]
    assert [json.loads(p) for p in patterns] == [
        {"eventName": ["REMOVE"], "dynamodb": {"OldImage": {"sk": {"S": [{"prefix": "FILE#"}]}}}},
        {
            "eventName": ["REMOVE"],
            "dynamodb": {"OldImage": {"sk": {"S": [{"prefix": "UPLOAD#"}]}, "holds_storage": {"BOOL": [True]}}},
        },
    ]


# --- the API's and the authorizer's real requests on moto --------------------------------------
from tests.integration.conftest import api_url, aws, client, deployed, keys, stores  # noqa: E402 - fixtures


class Recorder:
    """Every DynamoDB request, tagged by who made it: the local front runs the api Lambda on a
    thread named ``api-lambda`` and the authorizer on the request's own thread."""

    def __init__(self) -> None:
        self.on = False
        self.calls: list[tuple[str, str, dict[str, Any]]] = []

    def __call__(self, params: dict[str, Any], model: Any, **_: Any) -> None:
        if self.on:
            role = "api" if threading.current_thread().name == "api-lambda" else "authorizer"
            self.calls.append((role, model.name, params))

    def requests(self, role: str) -> list[tuple[str, list[str]]]:
        return [pair for r, operation, params in self.calls if r == role for pair in _operation_keys(operation, params)]


def test_every_table_request_of_the_api_and_the_authorizer_is_allowed(synth, client, stores, deployed):
    import openai

    stores.tenants.put(TenantPolicy(tenant="acme", requests_per_minute=1000, max_stored_bytes=200))
    recorder = Recorder()
    for boto in (clients.dynamodb_table(deployed.table_name).meta.client, clients.client("dynamodb")):
        boto.meta.events.register("provide-client-params.dynamodb.*", recorder)
    recorder.on = True
    lines = b'{"custom_id": "a", "method": "POST", "url": "/v1/chat/completions", "body": {"model": "test-chat"}}\n'
    batch_file = client.files.create(file=("in.jsonl", lines), purpose="batch")
    client.files.list(purpose="batch")  # the purpose index
    other = client.files.create(file=("x.txt", b"x" * 10), purpose="user_data")
    client.files.delete(other.id)
    with pytest.raises(openai.BadRequestError):  # over the quota: refused
        client.files.create(file=("big.txt", b"x" * 150), purpose="user_data")
    upload = client.uploads.create(bytes=4, filename="u.jsonl", mime_type="text/jsonl", purpose="batch")
    part = client.uploads.parts.create(upload.id, data=b"{}\n\n")
    client.uploads.complete(upload.id, part_ids=[part.id])
    cancelled = client.uploads.create(bytes=4, filename="c.jsonl", mime_type="text/jsonl", purpose="batch")
    client.uploads.cancel(cancelled.id)
    batch = client.batches.create(
        input_file_id=batch_file.id,
        endpoint="/v1/chat/completions",
        completion_window="24h",
        extra_headers={"Idempotency-Key": "k1"},
    )
    client.batches.retrieve(batch.id)
    client.batches.cancel(batch.id)
    recorder.on = False

    api, authorizer = recorder.requests("api"), recorder.requests("authorizer")
    assert authorizer and {a for a, _ in authorizer} == {"dynamodb:GetItem"}
    authorizer_statements = _statements(synth, synth.stack.api.authorizer_function)
    assert [(a, k) for a, k in authorizer if not granted(authorizer_statements, a, k)] == []
    api_statements = _statements(synth, synth.stack.api.api_function)
    denied = [
        (a, k) for a, k in api if not granted(api_statements, a.removesuffix("(index)"), k, index=a.endswith("(index)"))
    ]
    assert denied == []
    touched = {k for _, keys_ in api for k in keys_}
    # The paths these rights exist for were taken: the request counter, the ledger, idempotency,
    # and the policy read.
    for pk in (
        schema.requests_pk("acme"),
        schema.stored_pk("acme"),
        schema.TENANTS_PK,
        schema.tenant_pk("acme"),
        schema.batches_pk("acme"),
    ):
        assert pk in touched, pk
    assert any(k.startswith("IDEMPOTENCY#") for k in touched)
    assert not any(k.startswith(("KEY#", "KEYID#")) or k.endswith("#KEYS") for k in touched)
