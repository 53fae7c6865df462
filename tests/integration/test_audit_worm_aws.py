"""The WORM copy on moto (docs/audit.md, "WORM copy"): records appended to the deployment's table
become the stream's INSERT records as the event source mapping passes them (INSERTs of audit records, ``infra.constructs.audit.stream_filter``), the real
exporter handler writes each to an S3 bucket with Object Lock, a second PUT of a key is refused
by S3 (If-None-Match), and ``batchctl audit verify --worm`` compares the table with the copies."""

import argparse
import io

import pytest

from batchctl import audit as audit_cli
from functions.audit_export import handler as export_handler
from functions.core import audit, clients, deps, schema
from functions.core.aws.s3 import WormObjects
from functions.core.settings import Settings
from infra.local.lambda_context import LocalLambdaContext

LOCKED = "batch-api-test-audit-locked"


@pytest.fixture
def worm(aws: Settings, monkeypatch: pytest.MonkeyPatch) -> WormObjects:
    s3 = clients.client("s3")
    s3.create_bucket(Bucket=LOCKED, ObjectLockEnabledForBucket=True)
    s3.put_object_lock_configuration(Bucket=LOCKED, ObjectLockConfiguration={
        "ObjectLockEnabled": "Enabled", "Rule": {"DefaultRetention": {"Mode": "GOVERNANCE", "Days": 1}}})
    monkeypatch.setenv(Settings.env_name("audit_bucket_name"), LOCKED)
    deps.reset()
    return WormObjects(s3, LOCKED)


def stream_events(table_name: str) -> list[dict]:
    """The INSERT change record DynamoDB's stream carries for each item of the table (new image:
    the item as written, in DynamoDB JSON). moto 5.2 does implement the DynamoDB Streams API, but
    this botocore's DescribeStream reaches it as "404 Not yet implemented", so the records are
    built from the items moto stored, as the stream builds them."""
    dynamodb = clients.client("dynamodb")
    items = [i for page in dynamodb.get_paginator("scan").paginate(TableName=table_name) for i in page["Items"]]
    return [{"eventName": "INSERT", "eventSource": "aws:dynamodb", "dynamodb": {
        "Keys": {schema.PK: item[schema.PK], schema.SK: item[schema.SK]}, "NewImage": item,
        "StreamViewType": "NEW_AND_OLD_IMAGES"}} for item in items]


def passes_filter(record: dict) -> bool:
    """``infra.constructs.audit.stream_filter``, as the event source mapping applies it."""
    keys = record["dynamodb"]["Keys"]
    return (record["eventName"] == "INSERT" and keys[schema.PK]["S"].startswith(schema.audit_pk(""))
            and keys[schema.SK]["S"].startswith(schema.AUDIT_SEQ_PREFIX))


def test_appended_records_reach_the_locked_bucket_once(aws: Settings, stores, worm: WormObjects):
    for i in range(3):
        audit.append(stores.audit, "acme", at=100 + i, actor="operator", action="tenants.set", outcome="ok")
    audit.append(stores.audit, "acme", at=200, actor="worker", action=audit.CHUNK_RECEIPT, outcome="ok",
                 dedupe=audit.receipt_key("batch_1", 0))  # with its dedupe marker beside it
    records = [r for r in stream_events(aws.table_name) if passes_filter(r)]
    assert len(records) == 4 and all("NewImage" in r["dynamodb"] for r in records)
    event = {"Records": records}
    export_handler.handler(event, LocalLambdaContext("audit-export"))
    keys = worm.list_keys(audit.worm_prefix("acme"))
    assert keys == [audit.worm_key("acme", s) for s in (1, 2, 3, 4)]
    assert [worm.get(k).decode() for k in keys] == [r.to_json() for r in stores.audit.records("acme")]
    export_handler.handler(event, LocalLambdaContext("audit-export"))  # redelivered: S3 refuses a second write of a key
    assert not worm.put_once(keys[0], b"{}")
    versions = clients.client("s3").list_object_versions(Bucket=LOCKED)["Versions"]
    assert len(versions) == 4  # one locked version each, however often the stream delivers

    out = io.StringIO()
    code = audit_cli.run(argparse.Namespace(action="verify", tenant="acme"), stores.audit, out=out, err=io.StringIO(),
                         worm=worm)
    assert code == 0 and "4 match their WORM copies" in out.getvalue()
