"""``batchctl audit verify|export`` and the operator's records (``keys``, ``tenants``) against the
deployed stack on moto: verify says OK with the count, names the first broken link of a tampered
chain (exit 1); export writes the chain as JSONL to a file and to an S3 bucket."""

import json
from pathlib import Path

import boto3
import pytest

from functions.core import audit, deps, schema
from tests.integration.test_tenants_cli import env, run_cli, stack  # noqa: F401 - fixtures

__all__ = ["env", "stack"]


def test_operator_changes_are_chained_and_verify_then_export(stack, env, stores, tmp_path: Path) -> None:
    code, key, err = run_cli("keys", "create", "--tenant", "acme", env=env)
    assert code == 0, err
    assert run_cli("tenants", "create", "--tenant", "acme", "--batches-per-hour", "3", env=env)[0] == 0
    assert run_cli("tenants", "set", "--tenant", "acme", "--batches-per-hour", "4", env=env)[0] == 0
    assert run_cli("keys", "revoke", key.strip(), env=env)[0] == 0

    records = stores.audit.records("acme")
    actor = audit.key_actor(f"Bearer {key.strip()}")
    assert [(r.action, r.target, r.actor) for r in records] == [
        ("keys.create", actor, "operator"), ("tenants.create", "acme", "operator"),
        ("tenants.set", "acme", "operator"), ("keys.revoke", actor, "operator"),
    ]
    assert records[2].details["policy"]["batches_per_hour"] == 4
    assert key.strip() not in json.dumps([r.model_dump() for r in records])  # never the key itself

    code, out, _ = run_cli("audit", "verify", "--tenant", "acme", env=env)
    assert code == 0 and "OK" in out and "4 records" in out

    target = tmp_path / "acme.jsonl"
    assert run_cli("audit", "export", "--tenant", "acme", "--out", str(target), env=env)[0] == 0
    exported = [audit.AuditRecord.model_validate_json(line) for line in target.read_text().splitlines()]
    assert exported == records

    s3 = boto3.client("s3")
    s3.create_bucket(Bucket="worm")
    code, out, err = run_cli("audit", "export", "--tenant", "acme", "--s3", "worm/audit", env=env)
    assert code == 0, err
    body = s3.get_object(Bucket="worm", Key=f"audit/acme/{1:012d}-{4:012d}.jsonl")["Body"].read()
    assert body == target.read_bytes()


@pytest.mark.parametrize("tamper", ["edit", "delete"])
def test_verify_names_the_first_broken_link(stack, env, stores, tamper: str) -> None:
    for i in range(3):
        audit.append(stores.audit, "acme", at=i, actor="operator", action="tenants.set", outcome="ok")
    table = boto3.resource("dynamodb").Table(deps.settings().table_name)
    key = {schema.PK: schema.audit_pk("acme"), schema.SK: schema.audit_seq_sk(2)}
    if tamper == "edit":
        item = table.get_item(Key=key)["Item"]
        table.put_item(Item={**item, "record": item["record"].replace('"outcome":"ok"', '"outcome":"no"')})
    else:
        table.delete_item(Key=key)
    code, out, _ = run_cli("audit", "verify", "--tenant", "acme", env=env)
    assert code == 1 and "BROKEN" in out and "seq" in out
    assert ("(seq 2)" in out and "edited" in out) if tamper == "edit" else ("(seq 3)" in out)
