"""``batchctl audit verify|export|public-key`` and the operator's records (``keys``, ``tenants``)
against the deployed stack on moto, the appender signing with a KMS key (ECC_NIST_P256) as on
AWS: the operator's changes go through the audit queue like every writer's; verify says OK on
the untouched chain and exit 1 on a chain rewritten in the table (every later hash recomputed),
a cut tail, or a checkpoint signed with another key; exit 3 where the stack has no anchors."""

import json
from pathlib import Path

import boto3
import pytest

from functions.core import anchor, audit, deps, schema, signing
from functions.core.settings import Settings
from infra import names
from tests.integration.test_batchctl import create_stack, stack_outputs
from tests.integration.test_tenants_cli import env, run_cli

__all__ = ["env"]


@pytest.fixture
def kms_stack(aws: Settings, monkeypatch: pytest.MonkeyPatch) -> Settings:
    """The stack's outputs name its audit queue, Object Lock bucket and KMS key; the appender
    signs with that key (``audit_signing_key_id``, as the stack configures it)."""
    key = boto3.client("kms").create_key(KeySpec="ECC_NIST_P256", KeyUsage="SIGN_VERIFY")["KeyMetadata"]["Arn"]
    settings = aws.model_copy(update={"audit_signing_key_id": key, "audit_local_key_file": ""})
    monkeypatch.setenv(Settings.env_name("audit_signing_key_id"), key)
    monkeypatch.setenv(Settings.env_name("audit_local_key_file"), "")
    deps.reset()
    create_stack(names.STACK_NAME, stack_outputs(settings))
    return settings


def operator_changes(env) -> str:
    code, key, err = run_cli("keys", "create", "--tenant", "acme", env=env)
    assert code == 0, err
    assert run_cli("tenants", "create", "--tenant", "acme", "--batches-per-hour", "3", env=env)[0] == 0
    assert run_cli("tenants", "set", "--tenant", "acme", "--batches-per-hour", "4", env=env)[0] == 0
    assert run_cli("keys", "revoke", key.strip(), env=env)[0] == 0
    return key.strip()


def test_operator_changes_are_chained_and_verify_then_export(kms_stack, env, appender, tmp_path: Path) -> None:
    key = operator_changes(env)
    assert appender.chain.records("acme") == []  # sent, not appended yet: the appender does that
    records = appender.records("acme")
    actor = audit.key_actor(f"Bearer {key}")
    assert [(r.action, r.target, r.actor) for r in records] == [
        ("keys.create", actor, "operator"),
        ("tenants.create", "acme", "operator"),
        ("tenants.set", "acme", "operator"),
        ("keys.revoke", actor, "operator"),
    ]
    assert records[2].details["policy"]["batches_per_hour"] == 4
    assert key not in json.dumps([r.model_dump() for r in records])  # never the key itself

    code, out, err = run_cli("audit", "verify", "--tenant", "acme", env=env)
    assert (code, out) == (
        0,
        "OK: tenant 'acme': 4 records, 4 WORM copies, newest signed checkpoint at seq 4: 0 after "
        "it not anchored yet (0 of them not copied yet)\n",
    ), err

    target = tmp_path / "acme.jsonl"
    assert run_cli("audit", "export", "--tenant", "acme", "--out", str(target), env=env)[0] == 0
    exported = [audit.AuditRecord.model_validate_json(line) for line in target.read_text().splitlines()]
    assert exported == records

    s3 = boto3.client("s3")
    s3.create_bucket(Bucket="export")
    code, out, err = run_cli("audit", "export", "--tenant", "acme", "--s3", "export/audit", env=env)
    assert code == 0, err
    body = s3.get_object(Bucket="export", Key=f"audit/acme/{1:012d}-{4:012d}.jsonl")["Body"].read()
    assert body == target.read_bytes()


def rewrite_from(table, tenant: str, seq: int, **change) -> None:
    """What a principal with write access to the table can do: change record ``seq`` and
    recompute every later hash, so the chain's own links hold."""
    items = table.query(
        KeyConditionExpression="pk = :pk AND begins_with(sk, :seq)",
        ExpressionAttributeValues={":pk": schema.audit_pk(tenant), ":seq": schema.AUDIT_SEQ_PREFIX},
    )["Items"]
    prev = audit.GENESIS
    for item in items:
        record = audit.AuditRecord.model_validate_json(item["record"])
        if record.seq >= seq:
            content = record.content() | (change if record.seq == seq else {})
            record = audit.link(content.pop("tenant"), record.seq, prev, **content)
            table.put_item(Item={**item, "record": record.to_json()})
        prev = record.hash


@pytest.mark.parametrize("tamper", ["rewrite", "cut_tail"])
def test_verify_finds_a_rewritten_chain_and_a_cut_tail(kms_stack, env, appender, tamper: str) -> None:
    operator_changes(env)
    appender.drain()
    table = boto3.resource("dynamodb").Table(kms_stack.table_name)
    if tamper == "rewrite":
        rewrite_from(table, "acme", 2, details={"policy": {"batches_per_hour": 1000}})
        assert audit.verify(appender.chain.records("acme")) is None  # the table alone looks intact
    else:
        table.delete_item(Key={schema.PK: schema.audit_pk("acme"), schema.SK: schema.audit_seq_sk(4)})
    code, out, _ = run_cli("audit", "verify", "--tenant", "acme", env=env)
    assert code == 1 and out.startswith("BROKEN: tenant 'acme'")
    if tamper == "rewrite":
        assert "seq 2: rewritten: differs from its WORM copy" in out and "seq 4: rewritten" in out
    else:
        assert "seq 4: cut_tail" in out and "beyond the table's head (seq 3)" in out


def test_a_checkpoint_signed_with_another_key_is_reported_and_a_pinned_key_is_used(
    kms_stack, env, appender, tmp_path: Path
) -> None:
    operator_changes(env)
    appender.drain()
    kms = boto3.client("kms")
    other = kms.create_key(KeySpec="ECC_NIST_P256", KeyUsage="SIGN_VERIFY")["KeyMetadata"]["Arn"]
    head = appender.chain.head("acme")
    forged = anchor.Checkpoint(
        tenant="acme", seq=head.seq + 1, hash="f" * 64, at=1, key_id=kms_stack.audit_signing_key_id
    )
    signature = kms.sign(KeyId=other, Message=forged.message(), MessageType="RAW", SigningAlgorithm="ECDSA_SHA_256")
    appender.worm.put_once(
        anchor.checkpoint_key("acme", head.seq + 1), anchor.signed(forged, signature["Signature"]).to_json().encode()
    )
    code, out, _ = run_cli("audit", "verify", "--tenant", "acme", env=env)
    assert code == 1 and "seq 5: forged_checkpoint" in out

    code, pem, err = run_cli("audit", "public-key", env=env)
    assert code == 0, err
    assert signing.public_key_der(pem.encode()) == kms.get_public_key(KeyId=kms_stack.audit_signing_key_id)["PublicKey"]
    # Pinned to another key, the deployment's checkpoint (one: the four intents came in one batch) does not hold.
    pinned = tmp_path / "other.pem"
    pinned.write_bytes(signing.public_key_pem(kms.get_public_key(KeyId=other)["PublicKey"]))
    code, out, _ = run_cli("audit", "verify", "--tenant", "acme", "--public-key", str(pinned), env=env)
    assert code == 1 and out.count("forged_checkpoint") == 1 and "seq 4: forged_checkpoint" in out
    assert "seq 5: cut_tail" in out  # the forged one holds under that key: it names a seq the table never had


def test_verify_without_anchors_is_not_verifiable(aws, env) -> None:
    create_stack(names.STACK_NAME, stack_outputs(aws.model_copy(update={"audit_bucket_name": ""})))
    code, _, err = run_cli("audit", "verify", "--tenant", "acme", env=env)
    assert code == 3 and "no audit anchors" in err
