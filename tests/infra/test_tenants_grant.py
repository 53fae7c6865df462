"""Ingest's table rights after issue 13: it may read a tenant policy (GetItem on the ``TENANTS``
partition) and nothing more there: no write, no Query (no listing of every tenant's policy), and
the pattern has no wildcard, so it opens no other partition."""

from functions.core import schema
from functions.core.tenants import TenantPolicy
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


def test_the_budget_items_ingest_reads_and_the_chunk_dlq_consumer_charges(synth):
    budget_pk = schema.budget_pk("acme")
    ingest, dlq = _lambda_statements(synth, "ingest"), _lambda_statements(synth, "dlq")
    assert allows_any(ingest, "dynamodb:GetItem", [budget_pk])
    assert not allows_any(ingest, "dynamodb:UpdateItem", [budget_pk])  # ingest never charges
    assert allows_any(dlq, "dynamodb:UpdateItem", [budget_pk])
    for pk in (schema.tenant_pk("acme"), schema.enqueued_pk("acme"), "TENANTS"):
        assert not allows_any(dlq, "dynamodb:UpdateItem", [pk]), pk
