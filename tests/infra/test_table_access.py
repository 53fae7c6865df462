"""Who may touch which table items: the GPU worker's task role reaches exactly the partitions it
uses (a tenant's batch partition and a batch's chunk partitions) through GetItem/PutItem/UpdateItem,
and never a tenant's file, upload or webhook records, an API key, the scaler's state or an
idempotency record (docs/security.md, "Table rights of the worker and the narrow Lambdas").
Governance adds, per role, exactly: the budget charge for the chunk counters, the reservation's release for the roles that make a batch terminal, ingest's policy,
counter and budget reads (``LAMBDA_RIGHTS``, ``WORKER_RIGHTS``). The audit chains (``AUDIT#*``) are
the audit appender's alone: no other role is granted them, and the table's resource policy denies
every other principal a write there (``test_only_the_appender_may_write_audit_items``).

The synthesized policy is evaluated the way IAM evaluates it: ``ForAllValues:StringLike`` on
``dynamodb:LeadingKeys`` (every partition key a request names must match one pattern; IAM's ``*``
matches any characters, as ``fnmatch``'s does), against keys produced by the real records, and
against every DynamoDB request the worker's real chunk path makes on moto.
"""

import fnmatch
from typing import Any

import pytest
from moto import mock_aws

from functions.core import clients, schema
from functions.core.aws import stores_from_settings
from functions.core.records import (
    ApiKeyRecord,
    ChunkRecord,
    ChunkRunRecord,
    FileRecord,
    UploadPartRecord,
    UploadRecord,
)
from functions.core.settings import Settings
from tests.builders import batch_record, cut, running_batch
from tests.conftest import PREFIX, TEST_SETTINGS
from tests.dynamodb_requests import touches
from tests.helpers import chat_jsonl
from tests.integration.worker.harness import run_one_chunk

#: The worker's table actions and partition patterns (docs/security.md): its batch items live in
#: ``T#<tenant>#BATCHES``, its chunk markers and run records in ``T#<tenant>#B#<batch>``.
WORKER_ACTIONS = ["dynamodb:GetItem", "dynamodb:PutItem", "dynamodb:UpdateItem"]
WORKER_PATTERNS = ["T#*#BATCHES", "T#*#B#*"]
#: Tenant names the API accepts (``[A-Za-z0-9][A-Za-z0-9_.-]{0,63}``), some shaped like the patterns' literals.
TENANTS = ["acme", "B", "BATCHES", "B.BATCHES", "a-B-", "T", "KEY", "x" * 64]


def _table_statements(synth, role: str) -> list[dict]:
    """The DynamoDB statements of the role with logical id ``role``."""
    found = []
    for policy in synth.resources("AWS::IAM::Policy").values():
        if {"Ref": role} in policy["Properties"]["Roles"]:
            for statement in policy["Properties"]["PolicyDocument"]["Statement"]:
                actions = statement["Action"] if isinstance(statement["Action"], list) else [statement["Action"]]
                if any(a.startswith("dynamodb:") for a in actions):
                    found.append(statement)
    return found


def _worker_statements(synth) -> dict[str, list[dict]]:
    """The DynamoDB statements of each model's task role, by task definition."""
    out = {
        name: _table_statements(synth, task["Properties"]["TaskRoleArn"]["Fn::GetAtt"][0])
        for name, task in synth.resources("AWS::ECS::TaskDefinition").items()
        if name.startswith("Workers")  # not the streaming front's task (tests/infra/test_stream_front.py)
    }
    assert len(out) == len(synth.config.models)
    return out


def _lambda_statements(synth, label: str) -> list[dict]:
    """The DynamoDB statements of a narrow Lambda: ``ingest``, ``dlq`` (dead-lettered chunks),
    ``ingest_dlq`` (dead-lettered ingest events), ``workflow`` or ``audit_append`` (the appender)."""
    function = {
        "ingest": synth.stack.ingest.function,
        "dlq": synth.stack.ingest.dlq_function,
        "ingest_dlq": synth.stack.ingest.ingest_dlq_function,
        "workflow": synth.stack.workflow.function,
        "audit_append": synth.stack.audit.function,
    }[label]
    return _table_statements(synth, synth.logical_id(function.role))


def leading_keys(statement: dict, operator_: str = "ForAllValues:StringLike") -> list[str]:
    """The ``dynamodb:LeadingKeys`` patterns of one condition operator (the statement has only
    ``ForAllValues:StringLike`` and, optionally, ``ForAllValues:StringNotLike``)."""
    assert set(statement["Condition"]) <= {"ForAllValues:StringLike", "ForAllValues:StringNotLike"}
    assert "ForAllValues:StringLike" in statement["Condition"]
    patterns = statement["Condition"].get(operator_, {}).get("dynamodb:LeadingKeys", [])
    return patterns if isinstance(patterns, list) else [patterns]


def allows(statement: dict, action: str, partition_keys: list[str]) -> bool:
    """IAM's answer for ``action`` on items of ``partition_keys``: the action is granted and every
    key matches a pattern and no excluded pattern (ForAllValues; the operators are ANDed). An empty
    key set is a Scan, never granted here."""
    actions = statement["Action"] if isinstance(statement["Action"], list) else [statement["Action"]]
    patterns = leading_keys(statement)
    excluded = leading_keys(statement, "ForAllValues:StringNotLike")
    return (
        statement["Effect"] == "Allow"
        and action in actions
        and bool(partition_keys)
        and all(any(fnmatch.fnmatchcase(k, p) for p in patterns) for k in partition_keys)
        and not any(fnmatch.fnmatchcase(k, p) for p in excluded for k in partition_keys)
    )


def allows_any(statements: list[dict], action: str, partition_keys: list[str]) -> bool:
    """IAM's answer with several Allow statements (no Deny): any one of them allows the request."""
    return any(allows(s, action, partition_keys) for s in statements)


#: The audit appender charges a counted chunk's token budget with its receipt (UpdateItem on
#: ``T#*#BUDGET``); the chunk counters (the worker, the chunk DLQ consumer) write no budget item
#: and send their receipts to the audit queue (sqs:SendMessage), never to the table.
CHARGE = (["dynamodb:UpdateItem"], ["T#*#BUDGET"])
#: The audit appender: GetItem a dedupe marker or a record, Query a head, PutItem the record and
#: its marker (``AUDIT#*``); GetItem a chunk's count marker (a receipt's numbers).
APPEND = (["dynamodb:GetItem", "dynamodb:PutItem", "dynamodb:Query"], ["AUDIT#*"])
#: A role that makes a batch terminal releases its enqueued-cap reservation in that transaction.
RELEASE = (["dynamodb:UpdateItem"], ["T#*#ENQUEUED"])
#: The workflow's finalize counts the output files it creates: their markers and the counter's ADD.
STORAGE_CHARGE = (["dynamodb:PutItem", "dynamodb:UpdateItem"], ["T#*#STORAGE"])
#: The worker reads the budget item (a ``stop`` budget stops its lines: gpu_worker/budget.py).
WATCH = (["dynamodb:GetItem"], ["T#*#BUDGET"])
#: The worker reads a chunk's marker and run record together (``BatchStore.chunk_state``).
CHUNK_STATE = (["dynamodb:BatchGetItem"], ["T#*#B#*"])
#: An attempt opens only while its batch (or shard) takes chunks: a ConditionCheck in its transaction.
WORKER_RIGHTS = [(["dynamodb:ConditionCheckItem", *WORKER_ACTIONS], WORKER_PATTERNS), WATCH, CHUNK_STATE]


def _rights(statements: list[dict]) -> list[tuple]:
    """(actions, patterns[, excluded patterns]) of each statement, sorted."""
    return sorted(
        (
            _actions(s),
            sorted(leading_keys(s)),
            *([ex] if (ex := sorted(leading_keys(s, "ForAllValues:StringNotLike"))) else []),
        )
        for s in statements
    )


def _expected(rights: list[tuple]) -> list[tuple]:
    return sorted((sorted(r[0]), *(sorted(p) for p in r[1:])) for r in rights)


def test_worker_policy_names_only_its_actions_and_partitions(synth):
    for name, statements in _worker_statements(synth).items():
        assert _rights(statements) == _expected(WORKER_RIGHTS), name
        for statement in statements:
            assert statement["Effect"] == "Allow"
            # The table itself: no index ARN (no Query of any index).
            assert synth.render(statement["Resource"]) == f"<{synth.logical_id(synth.stack.storage.table)}.Arn>"


#: The narrow Lambdas, each granted only what it needs, as (actions, partition
#: patterns) per statement: ingest and the ingest DLQ consumer read a batch and update it; the
#: chunk DLQ consumer counts a chunk as the worker does; the workflow reads and updates the batch,
#: queries its chunk markers, and puts the output File records in the tenant's partition.
#: With governance: ingest reads a tenant's policy, reserves on its enqueued counters and reads its
#: budget item; the ingest DLQ consumer and the workflow release a reservation (their terminal
#: writes). The audit appender appends to the chains, reads count markers and charges budgets.
LAMBDA_RIGHTS = {
    "ingest": [
        (["dynamodb:GetItem", "dynamodb:UpdateItem"], ["T#*#BATCHES"]),
        (["dynamodb:PutItem"], ["T#*#B#*"]),  # a big batch's counting shards, written once
        (["dynamodb:GetItem"], ["TENANTS"]),
        (["dynamodb:GetItem", "dynamodb:UpdateItem"], ["T#*#ENQUEUED"]),
        (["dynamodb:GetItem"], ["T#*#BUDGET"]),
    ],
    "ingest_dlq": [(["dynamodb:GetItem", "dynamodb:UpdateItem"], ["T#*#BATCHES"]), RELEASE],
    "dlq": [(WORKER_ACTIONS, WORKER_PATTERNS)],  # the worker's, without the budget read
    "workflow": [
        (["dynamodb:GetItem", "dynamodb:Query", "dynamodb:UpdateItem"], ["T#*#B#*", "T#*#BATCHES"]),
        (["dynamodb:BatchGetItem"], ["T#*#B#*"]),  # a batch's counting shards, read together
        (["dynamodb:PutItem"], ["T#*"], ["T#*#*"]),  # a tenant's own partition only (its File records)
        RELEASE,
        STORAGE_CHARGE,  # its output files counted on the tenant's stored-bytes ledger (governance on)
    ],
    "audit_append": [APPEND, (["dynamodb:BatchGetItem", "dynamodb:GetItem"], ["T#*#B#*"]), CHARGE],
}


def _actions(statement: dict) -> list[str]:
    return sorted(statement["Action"] if isinstance(statement["Action"], list) else [statement["Action"]])


@pytest.mark.parametrize("label", LAMBDA_RIGHTS)
def test_narrow_lambdas_name_only_their_actions_and_partitions(synth, label):
    statements = _lambda_statements(synth, label)
    assert _rights(statements) == _expected(LAMBDA_RIGHTS[label])
    table = f"<{synth.logical_id(synth.stack.storage.table)}.Arn>"
    for statement in statements:
        assert statement["Effect"] == "Allow" and synth.render(statement["Resource"]) == table
    # None reads a tenant's file or upload records, an API key, the scaler's state; none deletes.
    others = [schema.key_pk("abc"), schema.scaler_pk("m"), "IDEMPOTENCY#create_batch#key"]
    for kind, item_keys in _records("acme").items():
        if kind not in ALLOWED_KINDS:
            others.append(item_keys[schema.PK])
    for pk in others:
        assert not allows_any(statements, "dynamodb:GetItem", [pk]), (label, pk)
        assert not allows_any(statements, "dynamodb:Query", [pk]), (label, pk)
    for action in ("dynamodb:DeleteItem", "dynamodb:Scan", "dynamodb:BatchWriteItem", "dynamodb:BatchGetItem"):
        assert not allows_any(statements, action, [schema.batches_pk("acme")]), (label, action)


def _records(tenant: str) -> dict[str, dict[str, Any]]:
    """One record of each kind for ``tenant``, as the stores write them (their ``keys()``)."""
    batch = batch_record(tenant=tenant, id="batch_abc", input_file_id="file-in", created_at=1)
    return {
        "batch": batch.keys(),
        "terminal batch": batch.model_copy(update={"status": "completed"}).keys(),
        "chunk marker": ChunkRecord(
            tenant=tenant,
            batch_id="batch_abc",
            chunk=3,
            attempt="a1",
            completed=1,
            failed=0,
            recorded_at=1,
            expires_at=2,
        ).keys(),
        "chunk run": ChunkRunRecord(tenant=tenant, batch_id="batch_abc", chunk=3, expires_at=2).keys(),
        "file": FileRecord.model_validate(
            {
                "tenant": tenant,
                "id": "file-abc",
                "filename": "in.jsonl",
                "purpose": "batch",
                "bytes": 1,
                "created_at": 1,
                "s3_key": schema.file_key(tenant, "file-abc"),
            }
        ).keys(),
        "upload": UploadRecord.model_validate(
            {
                "tenant": tenant,
                "id": "upload_abc",
                "filename": "in.jsonl",
                "purpose": "batch",
                "bytes": 1,
                "mime_type": "text/jsonl",
                "created_at": 1,
                "expires_at": 3_601,
            }
        ).keys(),
        "upload part": UploadPartRecord.model_validate(
            {
                "tenant": tenant,
                "upload_id": "upload_abc",
                "id": "part_abc",
                "created_at": 1,
                "bytes": 1,
                "s3_key": "k",
                "expires_at": 3_601,
            }
        ).keys(),
    }


ALLOWED_KINDS = {"batch", "terminal batch", "chunk marker", "chunk run"}


@pytest.mark.parametrize("tenant", TENANTS)
def test_worker_reaches_batch_and_chunk_items_never_file_or_upload_records(synth, tenant):
    records = _records(tenant)
    for name, statements in _worker_statements(synth).items():
        for kind, item_keys in records.items():
            for action in WORKER_ACTIONS:
                assert allows_any(statements, action, [item_keys[schema.PK]]) == (kind in ALLOWED_KINDS), (
                    name,
                    kind,
                    item_keys,
                )
        # A transaction naming a file and the batch is denied as a whole (ForAllValues).
        assert not allows_any(statements, "dynamodb:PutItem", [records["batch"][schema.PK], records["file"][schema.PK]])
        # The budget item: read (a stop budget), never written (the appender charges it) or
        # queried; the audit chain: never (its receipts go to the audit queue); the enqueued
        # counters: never.
        budget, chain = schema.budget_pk(tenant), schema.audit_pk(tenant)
        assert allows_any(statements, "dynamodb:GetItem", [budget])
        for action in ("dynamodb:PutItem", "dynamodb:UpdateItem", "dynamodb:DeleteItem", "dynamodb:Query"):
            assert not allows_any(statements, action, [budget]), (name, action)
        for action in (
            "dynamodb:GetItem",
            "dynamodb:PutItem",
            "dynamodb:Query",
            "dynamodb:UpdateItem",
            "dynamodb:DeleteItem",
        ):
            assert not allows_any(statements, action, [chain]), (name, action)
        for action in WORKER_ACTIONS:
            assert not allows_any(statements, action, [schema.enqueued_pk(tenant)]), (name, action)
        # BatchGetItem: a chunk partition's items only, not the batch items nor anything else.
        chunk_pk = records["chunk marker"][schema.PK]
        assert allows_any(statements, "dynamodb:BatchGetItem", [chunk_pk])
        for kind, item_keys in records.items():
            if item_keys[schema.PK] != chunk_pk:
                assert not allows_any(statements, "dynamodb:BatchGetItem", [item_keys[schema.PK]]), (name, kind)


def test_worker_never_reaches_keys_scaler_state_idempotency_or_webhooks(synth):
    from functions.webhooks.store import AttemptRecord, EndpointRecord

    api_key = ApiKeyRecord(key_hash="9f86d081884c7d659a2feaa0c55ad015", tenant="acme", created_at=1, hint="abcd")
    endpoint = EndpointRecord(
        tenant="acme",
        id="we_1",
        url="https://example.com/hook",
        events=["batch.completed"],
        secret="whsec_x",
        created_at=1,
        updated_at=1,
    )
    attempt = AttemptRecord(
        tenant="acme",
        endpoint_id="we_1",
        webhook_id="msg_1",
        event_id="evt_1",
        event_type="batch.completed",
        attempt=1,
        at=1,
        outcome="delivered",
    )
    others = [
        api_key.keys()[schema.PK],
        schema.scaler_pk("org/Chat-Model-7B"),
        "IDEMPOTENCY#create_batch#key",  # functions/api/idempotency.py's partition
        endpoint.to_item()[schema.PK],
        attempt.to_item()[schema.PK],
    ]
    others += ["TENANTS", schema.creations_pk("acme"), schema.tenant_pk("acme")]
    for name, statements in _worker_statements(synth).items():
        for pk in others:
            for action in (*WORKER_ACTIONS, "dynamodb:Query"):
                assert not allows_any(statements, action, [pk]), (name, pk)
        for action in ("dynamodb:Query", "dynamodb:Scan", "dynamodb:DeleteItem", "dynamodb:BatchWriteItem"):
            assert not allows_any(statements, action, [schema.batches_pk("acme")]), (name, action)


# --- every request the worker's chunk path makes, checked against the policy ------------------
def _operation_keys(operation: str, params: dict[str, Any]) -> list[tuple[str, list[str]]]:
    """(IAM action, partition keys) pairs a DynamoDB request is authorized by. A transaction is
    authorized item by item, with the action of each item's operation."""
    if operation == "Query" and "IndexName" in params:  # an index's ARN: none of the roles checked here has one
        return [("dynamodb:Query(index)", [])]
    found = [(f"dynamodb:{t.action}", [t.pk]) for t in touches(operation, params)]
    return found or [(f"dynamodb:{operation}", [])]


CHAT = "/v1/chat/completions"


@pytest.fixture
def moto_stores(monkeypatch):
    from infra.local.resources import create_resources

    with mock_aws():
        clients.reset()
        settings: Settings = create_resources(
            TEST_SETTINGS,
            clients.client,
            prefix=PREFIX,
            workflow_function_arn="arn:aws:lambda:us-east-1:123456789012:function:batch-api-test-workflow",
        )
        yield settings, stores_from_settings(settings)
        clients.reset()


def test_every_table_request_of_the_worker_chunk_path_is_allowed(synth, moto_stores):
    """Two chunks of a batch through the worker's real path on moto (the second delivered twice),
    every DynamoDB request recorded and evaluated against each model's worker policy."""
    settings, stores = moto_stores
    calls: list[tuple[str, dict[str, Any]]] = []
    events = clients.dynamodb_table(settings.table_name).meta.client.meta.events
    events.register("provide-client-params.dynamodb.*", lambda params, model, **_: calls.append((model.name, params)))

    tenant, batch_id, now = "acme", "batch_abc", 1_000
    data = chat_jsonl(4)
    key = schema.batch_input_key(tenant, batch_id)
    stores.objects.put(key, data)
    batch = running_batch(
        tenant=tenant, id=batch_id, input_file_id="file-in", created_at=now, model="test-chat", total=4, chunk_count=2
    )
    stores.batches.create(batch)
    messages = [batch.work_message(chunk) for chunk in cut(data.splitlines(keepends=True), 2)]
    del calls[:]  # the setup above is not the worker's
    assert run_one_chunk(stores, messages[0]).outcome.counted
    assert run_one_chunk(stores, messages[1]).outcome.last
    assert run_one_chunk(stores, messages[1]).skipped  # a redelivery: reads the marker and the batch
    assert stores.batches.get(tenant, batch_id).completed == 4

    requests = [pair for operation, params in calls for pair in _operation_keys(operation, params)]
    operations = {operation for operation, _ in calls}
    # The worker's path made every kind of call it has: item reads, the marker and run record read
    # together, the transactions that open an attempt and count a chunk; none on the audit chain
    # (its receipts went to the audit queue).
    assert operations == {"GetItem", "BatchGetItem", "TransactWriteItems"}, operations
    assert {k for _, keys in requests for k in keys} == {schema.batches_pk(tenant), schema.chunks_pk(tenant, batch_id)}
    sqs = clients.client("sqs")
    sent = sqs.get_queue_attributes(QueueUrl=settings.audit_queue_url, AttributeNames=["ApproximateNumberOfMessages"])
    assert int(sent["Attributes"]["ApproximateNumberOfMessages"]) == 2  # one receipt per counted chunk
    for name, statements in _worker_statements(synth).items():
        denied = [(a, k) for a, k in requests if not allows_any(statements, a, k)]
        assert denied == [], (name, denied)


# --- the real paths on moto: API, ingest, worker, the two DLQ consumers ------------------------
from tests.integration.conftest import api_url, aws, client, deployed, keys, stores  # noqa: E402 - fixtures


class Recorder:
    """Every DynamoDB request made in this process, tagged with the role that made it (``as_``)."""

    def __init__(self) -> None:
        self.role = "setup"
        self.calls: list[tuple[str, str, dict[str, Any]]] = []

    def __call__(self, params: dict[str, Any], model: Any, **_: Any) -> None:
        self.calls.append((self.role, model.name, params))

    def requests(self, role: str) -> list[tuple[str, list[str]]]:
        return [pair for r, operation, params in self.calls if r == role for pair in _operation_keys(operation, params)]


@pytest.mark.settings(chunk_max_lines=2)
@pytest.mark.parametrize("shards", [1, 2])
def test_every_table_request_of_ingest_worker_dlq_consumers_and_workflow_is_allowed(
    synth, client, stores, deployed, shards, monkeypatch
):
    """A batch through the real handlers (ingest, one chunk by the worker's path, the other by the
    chunk DLQ consumer, the workflow's check, drain and finalize), and a second batch's ingest
    event through the ingest DLQ consumer: each role's DynamoDB requests are evaluated against its
    synthesized policy. With ``shards`` 2 the batch counts on two counting shards (a shard a chunk),
    as a big batch does (docs/lifecycle.md, "Counting shards")."""
    from functions.core import limits

    monkeypatch.setattr(limits, "COUNT_SHARD_CHUNKS", 2 // shards)
    from functions.chunk_dlq import handler as chunk_dlq_handler
    from functions.ingest_dlq import handler as ingest_dlq_handler
    from functions.workflow import handler as workflow_handler
    from infra.local.lambda_context import LocalLambdaContext
    from infra.local.pollers import drain_queue
    from infra.local.resources import ingest_dlq_url, ingest_queue_url
    from tests.integration.batch_helpers import line, run_ingest, submit, take_work
    from tests.integration.worker.harness import dlq_url

    recorder = Recorder()
    clients.dynamodb_table(deployed.table_name).meta.client.meta.events.register(
        "provide-client-params.dynamodb.*", recorder
    )
    sqs = clients.client("sqs")

    batch = submit(client, ("\n".join(line(i) for i in range(4)) + "\n").encode())
    recorder.role = "ingest"
    assert run_ingest() == 1
    recorder.role = "setup"
    first, second = take_work(deployed)
    recorder.role = "worker"
    assert run_one_chunk(stores, first).outcome.counted
    recorder.role = "dlq"
    dlq = dlq_url(deployed.models["test-chat"].queue_url)
    sqs.send_message(QueueUrl=dlq, MessageBody=second.model_dump_json())
    assert drain_queue(sqs, dlq, chunk_dlq_handler.handler, name="dlq") == 1
    recorder.role = "workflow"
    for event in (
        {"action": "check", "reconcile_seconds": 60},
        {"action": "drain", "signal": "complete"},
        {"action": "finalize", "signal": "complete"},
    ):
        workflow_handler.handler({"tenant": "acme", "batch_id": batch.id, **event}, LocalLambdaContext("workflow"))
    recorder.role = "setup"
    after = stores.batches.get("acme", batch.id)
    assert (after.status, after.completed, after.failed, after.chunks_done) == ("completed", 2, 2, 2)
    assert after.count_shards == shards
    assert client.files.retrieve(after.output_file_id).purpose == "batch_output"

    # A second batch's ingest event, dead-lettered: the ingest DLQ consumer ends or resumes it.
    other = submit(client, (line(0) + "\n").encode())
    url = ingest_queue_url(clients.client, PREFIX)
    events = sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10)["Messages"]
    for message in events:
        sqs.send_message(QueueUrl=ingest_dlq_url(clients.client, PREFIX), MessageBody=message["Body"])
        sqs.delete_message(QueueUrl=url, ReceiptHandle=message["ReceiptHandle"])
    recorder.role = "ingest_dlq"
    assert drain_queue(sqs, ingest_dlq_url(clients.client, PREFIX), ingest_dlq_handler.handler, name="ingest-dlq") >= 1
    recorder.role = "setup"
    assert stores.batches.get("acme", other.id).status != "validating"
    # The API's actions and the chunks' receipts, appended by the audit appender.
    from functions.audit_append import handler as append_handler

    recorder.role = "audit_append"
    assert drain_queue(sqs, deployed.audit_queue_url, append_handler.handler, name="audit-append") >= 1
    recorder.role = "setup"

    policies = {label: _lambda_statements(synth, label) for label in LAMBDA_RIGHTS}
    policies.update({f"worker {name}": s for name, s in _worker_statements(synth).items()})
    for role, statements in policies.items():
        requests = recorder.requests(role.split()[0])
        assert requests, f"{role} made no table request"
        denied = [(a, k) for a, k in requests if not allows_any(statements, a, k)]
        assert denied == [], (role, denied)
    # The paths made the calls these rights exist for (the workflow's Query and its File put; the
    # appender's head Query, its record transaction and a receipt's count marker).
    appended = recorder.requests("audit_append")
    assert ("dynamodb:Query", [schema.audit_pk("acme")]) in appended
    assert ("dynamodb:PutItem", [schema.audit_pk("acme")]) in appended
    assert ("dynamodb:BatchGetItem", [schema.chunks_pk("acme", batch.id)]) in appended
    assert not any(
        schema.audit_pk("acme") in keys
        for role in ("ingest", "worker", "dlq", "workflow", "ingest_dlq")
        for _, keys in recorder.requests(role)
    )
    assert ("dynamodb:Query", [schema.chunks_pk("acme", batch.id)]) in recorder.requests("workflow")
    if shards > 1:  # ingest opened the shards, the workflow's close stopped them
        assert ("dynamodb:PutItem", [schema.chunks_pk("acme", batch.id, 1)]) in recorder.requests("ingest")
        assert ("dynamodb:UpdateItem", [schema.chunks_pk("acme", batch.id, 1)]) in recorder.requests("workflow")
    assert ("dynamodb:PutItem", [schema.tenant_pk("acme")]) in recorder.requests("workflow")
    # The API wrote the tenant's files in T#acme: the partition the others never touch.
    assert any(schema.tenant_pk("acme") in keys for _, keys in recorder.requests("setup"))


# --- the audit chains: the appender's alone (infra/constructs/audit.py) ---------------------------
def _table_resource_statements(synth) -> list[dict]:
    (_, table) = synth.one("AWS::DynamoDB::Table")
    return table["Properties"]["ResourcePolicy"]["PolicyDocument"]["Statement"]


def denied_by_table(synth, role_id: str, action: str, partition_keys: list[str]) -> bool:
    """The table's resource policy (Deny statements only) for a request of the role ``role_id``:
    ``ForAnyValue:StringLike`` on the keys, ``ArnNotEquals`` on ``aws:PrincipalArn`` (the role)."""
    for statement in _table_resource_statements(synth):
        assert statement["Effect"] == "Deny" and statement["Principal"] == {"AWS": "*"} and statement["Resource"] == "*"
        actions = statement["Action"] if isinstance(statement["Action"], list) else [statement["Action"]]
        condition = statement["Condition"]
        assert set(condition) <= {"ForAnyValue:StringLike", "ArnNotEquals"}
        patterns = condition["ForAnyValue:StringLike"]["dynamodb:LeadingKeys"]
        exempt = condition.get("ArnNotEquals", {}).get("aws:PrincipalArn")
        if (
            action in actions
            and any(fnmatch.fnmatchcase(k, p) for p in patterns for k in partition_keys)
            and (exempt is None or exempt != {"Fn::GetAtt": [role_id, "Arn"]})
        ):
            return True
    return False


def test_only_the_appender_may_write_audit_items(synth):
    """Whatever a role's identity policy grants (the API's full table rights, an operator's admin
    role), the table denies every principal but the appender a PutItem of an AUDIT# item, and
    everyone, the appender too, an update or delete there; nothing outside AUDIT# is denied."""
    appender = synth.logical_id(synth.stack.audit.function.role)
    writes = ("dynamodb:PutItem", "dynamodb:UpdateItem", "dynamodb:DeleteItem", "dynamodb:BatchWriteItem")
    chain = [schema.audit_pk("acme")]
    roles = set(synth.resources("AWS::IAM::Role")) | {"an operator's admin role"}
    assert appender in roles
    for role in roles:
        for action in writes:
            expected = not (role == appender and action == "dynamodb:PutItem")
            assert denied_by_table(synth, role, action, chain) == expected, (role, action)
            assert not denied_by_table(synth, role, action, [schema.batches_pk("acme")]), (role, action)
        # A transaction naming an audit item among others is denied as a whole (ForAnyValue).
        assert denied_by_table(synth, role, "dynamodb:PutItem", [schema.tenant_pk("acme"), chain[0]]) == (
            role != appender
        )
    for statements in (_lambda_statements(synth, label) for label in LAMBDA_RIGHTS if label != "audit_append"):
        assert not allows_any(statements, "dynamodb:PutItem", chain)
    assert allows_any(_lambda_statements(synth, "audit_append"), "dynamodb:PutItem", chain)


def test_only_the_appender_may_write_budget_items(synth):
    """What a tenant spent is the appender's to charge (with a counted chunk's receipt): the table
    denies every other principal, whatever its identity policy grants, any write of a budget item,
    alone or in a transaction; reads stay with the identity policies (ingest, the worker)."""
    appender = synth.logical_id(synth.stack.audit.function.role)
    budget = [schema.budget_pk("acme")]
    roles = set(synth.resources("AWS::IAM::Role")) | {"an operator's admin role"}
    for role in roles:
        for action in ("dynamodb:PutItem", "dynamodb:UpdateItem", "dynamodb:DeleteItem", "dynamodb:BatchWriteItem"):
            assert denied_by_table(synth, role, action, budget) == (role != appender), (role, action)
        assert denied_by_table(synth, role, "dynamodb:UpdateItem", [schema.batches_pk("acme"), budget[0]]) == (
            role != appender
        )
        assert not denied_by_table(synth, role, "dynamodb:GetItem", budget)
    for label in LAMBDA_RIGHTS:
        assert allows_any(_lambda_statements(synth, label), "dynamodb:UpdateItem", budget) == (label == "audit_append")


def _statements_on(synth, resource: str) -> dict[str, set[str]]:
    """Role logical id -> the actions its policies allow on ``resource`` (a rendered ARN)."""
    out: dict[str, set[str]] = {}
    for policy in synth.resources("AWS::IAM::Policy").values():
        for statement in policy["Properties"]["PolicyDocument"]["Statement"]:
            resources = statement["Resource"] if isinstance(statement["Resource"], list) else [statement["Resource"]]
            if resource in [synth.render(r) for r in resources]:
                actions = statement["Action"] if isinstance(statement["Action"], list) else [statement["Action"]]
                for role in policy["Properties"]["Roles"]:
                    out.setdefault(role["Ref"], set()).update(actions)
    return out


def test_writers_may_only_send_to_the_audit_queue_and_only_the_appender_signs(synth):
    audit = synth.stack.audit
    queue = f"<{synth.logical_id(audit.queue)}.Arn>"
    writers = {
        synth.logical_id(synth.stack.api.api_function.role),
        synth.logical_id(synth.stack.ingest.dlq_function.role),
        *(synth.logical_id(w.task_definition.task_role) for w in synth.stack.workers.workers.values()),
        synth.logical_id(synth.stack.stream_front.task_role),
    }
    on_queue = _statements_on(synth, queue)
    appender = synth.logical_id(audit.function.role)
    assert {role: actions for role, actions in on_queue.items() if role != appender} == {
        role: {"sqs:SendMessage"} for role in writers
    }
    assert "sqs:SendMessage" not in on_queue[appender] and "sqs:ReceiveMessage" in on_queue[appender]
    on_key = _statements_on(synth, f"<{synth.logical_id(audit.key)}.Arn>")
    assert on_key == {appender: {"kms:Sign"}}
