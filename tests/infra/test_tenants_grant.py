"""The table rights of governance. Ingest may read a tenant policy (GetItem on the ``TENANTS``
partition) and nothing more there: no write, no Query (no listing of every tenant's policy), and
the pattern has no wildcard, so it opens no other partition. Every role that makes a batch terminal
may release its enqueued-cap reservation (UpdateItem on ``T#*#ENQUEUED``); the chunk counters (GPU
worker, chunk DLQ consumer) write no budget item and send their chunk receipts to the audit queue;
only the audit appender reaches the audit chains (``AUDIT#*``) and charges the token budgets
(``T#*#BUDGET``), and the table's policy denies every other principal a budget write."""

import fnmatch

from functions.core import schema
from functions.core.tenants import TenantPolicy
from tests.infra.test_governance_switch import ungoverned
from tests.infra.test_table_access import _lambda_statements, allows_any


def test_ingest_may_read_a_tenant_policy_and_do_nothing_else_with_it(synth):
    statements = _lambda_statements(synth, "ingest")
    policy_pk = TenantPolicy(tenant="acme").to_item()[schema.PK]
    assert allows_any(statements, "dynamodb:GetItem", [policy_pk])
    for action in ("dynamodb:PutItem", "dynamodb:UpdateItem", "dynamodb:Query", "dynamodb:DeleteItem"):
        assert not allows_any(statements, action, [policy_pk]), action
    for pk in ("TENANTSX", "TENANTS#acme", schema.creations_pk("acme"), schema.tenant_pk("acme")):
        assert not allows_any(statements, "dynamodb:GetItem", [pk]), pk
    for label in ("ingest_dlq", "dlq", "workflow"):  # only ingest validates lines
        assert not allows_any(_lambda_statements(synth, label), "dynamodb:GetItem", [policy_pk]), label


def test_ingest_may_reserve_on_the_enqueued_counters_only(synth):
    """The enqueued caps: ingest reads and conditionally updates ``T#<tenant>#ENQUEUED`` items
    (inside the move's transaction), and that grant opens no other partition."""
    statements = _lambda_statements(synth, "ingest")
    counter_pk = schema.enqueued_pk("acme")
    for action in ("dynamodb:GetItem", "dynamodb:UpdateItem"):
        assert allows_any(statements, action, [counter_pk]), action
    for action in ("dynamodb:PutItem", "dynamodb:Query", "dynamodb:DeleteItem"):
        assert not allows_any(statements, action, [counter_pk]), action
    for pk in (schema.tenant_pk("acme"), schema.creations_pk("acme"), "TENANTS", "KEY#x"):
        assert not allows_any(statements, "dynamodb:UpdateItem", [pk]), pk


def test_the_budget_items_ingest_reads_and_only_the_appender_charges(synth):
    budget_pk = schema.budget_pk("acme")
    ingest, dlq = _lambda_statements(synth, "ingest"), _lambda_statements(synth, "dlq")
    appender = _lambda_statements(synth, "audit_append")
    assert allows_any(ingest, "dynamodb:GetItem", [budget_pk])
    assert not allows_any(ingest, "dynamodb:UpdateItem", [budget_pk])  # ingest never charges
    assert not allows_any(dlq, "dynamodb:UpdateItem", [budget_pk])  # nor the chunk DLQ consumer
    assert allows_any(appender, "dynamodb:UpdateItem", [budget_pk])
    for action in ("dynamodb:PutItem", "dynamodb:DeleteItem", "dynamodb:Query"):
        assert not allows_any(appender, action, [budget_pk]), action
    for pk in (schema.tenant_pk("acme"), schema.enqueued_pk("acme"), "TENANTS"):
        assert not allows_any(appender, "dynamodb:UpdateItem", [pk]), pk


#: Every role that makes a batch terminal (``BatchRepo.update``/``finish`` with a terminal status),
#: hence may release its enqueued-cap reservation in that write's transaction. The API and the
#: sweeper have the whole table (``grant_read_write_data``); ingest reserves there already.
TERMINAL_WRITERS = ("workflow", "ingest_dlq", "ingest")


def test_every_terminal_writer_may_release_a_reservation_and_nothing_more_there(synth):
    counter_pk = schema.enqueued_pk("acme")
    for label in TERMINAL_WRITERS:
        statements = _lambda_statements(synth, label)
        assert allows_any(statements, "dynamodb:UpdateItem", [counter_pk]), label
        for action in ("dynamodb:PutItem", "dynamodb:Query", "dynamodb:DeleteItem"):
            assert not allows_any(statements, action, [counter_pk]), (label, action)
        # The release grant is of the counters only: a budget item or a tenant's files stay closed.
        for pk in (schema.budget_pk("acme"), schema.creations_pk("acme"), "TENANTS"):
            assert not allows_any(statements, "dynamodb:UpdateItem", [pk]), (label, pk)
    # The chunk DLQ consumer counts chunks but never makes a batch terminal: no release right.
    assert not allows_any(_lambda_statements(synth, "dlq"), "dynamodb:UpdateItem", [counter_pk])


def test_the_chunk_counters_never_charge_a_budget_nor_reach_the_chains(synth):
    """The worker's task roles and the chunk DLQ consumer (both count chunks): no write of a budget
    item; nothing on the audit chains, which only the appender reaches (append-only: no update or
    delete there either; a transaction naming the chain and a file record is denied)."""
    from tests.infra.test_table_access import _worker_statements

    budget_pk, chain_pk = schema.budget_pk("acme"), schema.audit_pk("acme")
    counters = {
        "dlq": _lambda_statements(synth, "dlq"),
        **{f"worker {n}": s for n, s in _worker_statements(synth).items()},
    }
    for label, statements in counters.items():
        assert not allows_any(statements, "dynamodb:UpdateItem", [budget_pk]), label
        for action in (
            "dynamodb:GetItem",
            "dynamodb:PutItem",
            "dynamodb:Query",
            "dynamodb:UpdateItem",
            "dynamodb:DeleteItem",
        ):
            assert not allows_any(statements, action, [chain_pk]), (label, action)
    appender = _lambda_statements(synth, "audit_append")
    for action in ("dynamodb:GetItem", "dynamodb:PutItem", "dynamodb:Query"):
        assert allows_any(appender, action, [chain_pk]), action
    for action in ("dynamodb:UpdateItem", "dynamodb:DeleteItem"):
        assert not allows_any(appender, action, [chain_pk]), action
    assert not allows_any(appender, "dynamodb:PutItem", [chain_pk, schema.tenant_pk("acme")])
    for label in ("ingest", "ingest_dlq", "workflow"):
        assert not allows_any(_lambda_statements(synth, label), "dynamodb:Query", [chain_pk]), label


def test_a_receipt_s_part_reads_are_granted_to_the_appender(synth):
    """A receipt sent without digests LISTs the counted attempt's parts (ListBucket with its
    prefix) and GETs each, in the appender: ``grant_read`` on the parts (ListBucket on the bucket,
    GetObject on ``batches/*/*/parts/*``)."""
    from infra.constructs.ingest import PART_KEYS

    bucket = f"<{synth.logical_id(synth.stack.storage.bucket)}.Arn>"
    roles = [synth.stack.audit.function.role]
    for role in roles:
        statements = [
            st
            for policy in synth.resources("AWS::IAM::Policy").values()
            if {"Ref": synth.logical_id(role)} in policy["Properties"]["Roles"]
            for st in policy["Properties"]["PolicyDocument"]["Statement"]
        ]

        def granted(action: str, resource: str) -> bool:
            for st in statements:
                actions = st["Action"] if isinstance(st["Action"], list) else [st["Action"]]
                resources = st["Resource"] if isinstance(st["Resource"], list) else [st["Resource"]]
                if any(fnmatch.fnmatchcase(action, a) for a in actions) and resource in [
                    synth.render(r) for r in resources
                ]:
                    return True
            return False

        assert granted("s3:ListBucket", bucket), role
        assert granted("s3:GetObject", f"{bucket}/{PART_KEYS}"), role


def test_governance_off_grants_no_receipts(ungoverned):
    """Off, the stores send no intents (``stores_from_settings``): no audit queue, appender, key or
    Object Lock bucket, no role reaches the chains, the table has no resource policy."""
    from tests.infra.test_table_access import _worker_statements

    audit = ungoverned.stack.audit
    assert (audit.queue, audit.function, audit.key, audit.bucket) == (None, None, None, None)
    assert not ungoverned.resources("AWS::KMS::Key")
    assert not [b for b in ungoverned.resources("AWS::S3::Bucket").values() if "ObjectLockEnabled" in b["Properties"]]
    (_, table) = ungoverned.one("AWS::DynamoDB::Table")
    assert "ResourcePolicy" not in table["Properties"]
    assert not [q for q in ungoverned.resources("AWS::SQS::Queue").values() if q["Properties"].get("FifoQueue")]
    chain_pk = schema.audit_pk("acme")
    counters = [_lambda_statements(ungoverned, "dlq"), *_worker_statements(ungoverned).values()]
    for statements in counters:
        for action in ("dynamodb:GetItem", "dynamodb:PutItem", "dynamodb:Query"):
            assert not allows_any(statements, action, [chain_pk]), action
