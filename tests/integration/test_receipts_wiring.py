"""Chunk receipts under the AWS wiring (``stores_from_settings`` on moto, the local deployment's
stores): governance on, a counted chunk sends one ``chunk.receipt`` intent to the audit queue and
the appender (the real handler) appends it to its tenant's chain, once however often the chunk is
delivered; governance off, the stores keep no chain and nothing is sent (docs/audit.md)."""

import hashlib

import pytest
from moto import mock_aws

from functions.core import audit, clients, schema
from functions.core.aws import stores_from_settings
from functions.core.messages import WorkMessage
from functions.core.settings import Settings
from tests.builders import running_batch, work_message
from tests.conftest import PREFIX, TEST_SETTINGS
from tests.helpers import chat_jsonl
from tests.integration.worker.harness import run_one_chunk

CHAT = "/v1/chat/completions"
TENANT, BATCH, NOW = "acme", "batch_abc", 1_000


@pytest.fixture
def deployed_settings():
    """The resources as the local deployment creates them with governance off."""
    from infra.local.resources import create_resources

    with mock_aws():
        clients.reset()
        yield create_resources(
            TEST_SETTINGS.model_copy(update={"governance": False}),
            clients.client,
            prefix=PREFIX,
            workflow_function_arn="arn:aws:lambda:us-east-1:123456789012:function:batch-api-test-workflow",
        )
        clients.reset()


def _one_chunk_batch(settings: Settings) -> tuple[WorkMessage, "object"]:
    stores = stores_from_settings(settings)
    data = chat_jsonl(2)
    key = schema.batch_input_key(TENANT, BATCH)
    stores.objects.put(key, data)
    batch = running_batch(tenant=TENANT, id=BATCH, input_file_id="file-in", created_at=NOW, model="test-chat", total=2)
    stores.batches.create(batch)
    return work_message(batch, byte_end=len(data), line_count=2), stores


def test_governance_on_a_counted_chunk_appends_one_receipt(aws, appender):
    assert aws.governance  # the local deployment's default
    message, stores = _one_chunk_batch(aws)
    assert stores.audit_log is not None
    assert run_one_chunk(stores, message).outcome.counted
    assert run_one_chunk(stores, message).skipped  # a redelivery: its receipt is sent again, appended once

    (receipt,) = appender.records(TENANT)
    assert audit.verify([receipt]) is None
    assert (receipt.action, receipt.actor, receipt.target) == (audit.CHUNK_RECEIPT, audit.WORKER, BATCH)
    marker = stores.batches.counted_chunk(TENANT, BATCH, 0)
    assert receipt.details["attempt"] == marker.attempt and receipt.details["completed"] == 2
    out = stores.objects.get(schema.chunk_part_key(TENANT, BATCH, 0, marker.attempt, "out"))
    assert receipt.details["out_sha256"] == hashlib.sha256(out).hexdigest()


def test_governance_off_appends_no_receipt(deployed_settings):
    from functions.core.aws.audit import AuditRepo
    from functions.core.aws.dynamodb import Table

    settings = deployed_settings.model_copy(update={"governance": False})
    assert settings.audit_queue_url == ""  # created with governance off: no audit queue
    message, stores = _one_chunk_batch(settings)
    assert stores.audit_log is None
    assert run_one_chunk(stores, message).outcome.counted
    # Nothing in the audit partition.
    assert AuditRepo(Table(clients.dynamodb_table(settings.table_name))).records(TENANT) == []
