"""The audit chains' anchors in the stack (infra/constructs/audit.py): with governance on (the
default), an Object Lock bucket with the configured mode and retention whose policy makes every
key write-once and undeletable, a KMS signing key (ECC_NIST_P256), the FIFO audit queue and its
DLQ, and the appender on it with exactly its rights; the config refuses governance without the
bucket."""

import json

import pydantic
import pytest

from functions.core import anchor
from infra.config import DeployConfig
from infra.constructs.audit import BATCH_SIZE, BUCKET_DENIED


def _list(value):
    return value if isinstance(value, list) else [value]


def test_the_bucket_is_on_by_default_and_governance_cannot_go_without_it():
    assert DeployConfig().audit_object_lock is not None
    assert (DeployConfig().audit_object_lock.mode, DeployConfig().audit_object_lock.retention_days) == (
        "governance",
        365,
    )
    with pytest.raises(pydantic.ValidationError, match="audit_object_lock"):
        DeployConfig.model_validate({"audit_object_lock": None})
    assert DeployConfig.model_validate({"audit_object_lock": None, "governance": False}).audit_object_lock is None


def test_the_locked_bucket_and_its_policy(synth):
    bucket = synth.stack.audit.bucket
    props = synth.resources("AWS::S3::Bucket")[synth.logical_id(bucket)]
    assert props["DeletionPolicy"] == "Retain"
    assert props["Properties"]["ObjectLockEnabled"] is True
    assert props["Properties"]["ObjectLockConfiguration"] == {
        "ObjectLockEnabled": "Enabled",
        "Rule": {"DefaultRetention": {"Mode": "GOVERNANCE", "Days": 30}},
    }
    assert props["Properties"]["VersioningConfiguration"] == {"Status": "Enabled"}
    (policy,) = [
        p["Properties"]["PolicyDocument"]["Statement"]
        for p in synth.resources("AWS::S3::BucketPolicy").values()
        if p["Properties"]["Bucket"] == {"Ref": synth.logical_id(bucket)}
    ]
    by_sid = {s.get("Sid"): s for s in policy}
    write_once = by_sid["WriteOnce"]
    assert (write_once["Effect"], write_once["Principal"], write_once["Action"]) == (
        "Deny",
        {"AWS": "*"},
        "s3:PutObject",
    )
    assert write_once["Condition"] == {"Null": {"s3:if-none-match": "true"}}
    never = by_sid["NeverRemoved"]
    assert never["Effect"] == "Deny" and never["Principal"] == {"AWS": "*"} and "Condition" not in never
    assert (
        set(_list(never["Action"]))
        == set(BUCKET_DENIED)
        >= {"s3:DeleteObject", "s3:DeleteObjectVersion", "s3:BypassGovernanceRetention"}
    )


def test_the_signing_key_and_the_queue(synth):
    audit = synth.stack.audit
    key = synth.resources("AWS::KMS::Key")[synth.logical_id(audit.key)]
    assert (key["Properties"]["KeySpec"], key["Properties"]["KeyUsage"], key["DeletionPolicy"]) == (
        "ECC_NIST_P256",
        "SIGN_VERIFY",
        "Retain",
    )
    queues = synth.resources("AWS::SQS::Queue")
    queue, dlq = (
        queues[synth.logical_id(audit.queue)]["Properties"],
        queues[synth.logical_id(audit.dead_letters)]["Properties"],
    )
    assert queue["FifoQueue"] is True and dlq["FifoQueue"] is True
    assert (queue["DeduplicationScope"], queue["FifoThroughputLimit"]) == ("messageGroup", "perMessageGroupId")
    assert queue["RedrivePolicy"]["deadLetterTargetArn"] == {
        "Fn::GetAtt": [synth.logical_id(audit.dead_letters), "Arn"]
    }
    (mapping,) = [
        m["Properties"]
        for m in synth.resources("AWS::Lambda::EventSourceMapping").values()
        if m["Properties"]["FunctionName"] == {"Ref": synth.logical_id(audit.function)}
    ]
    assert mapping["BatchSize"] == BATCH_SIZE == 10 and mapping["FunctionResponseTypes"] == ["ReportBatchItemFailures"]
    assert "audit-append" in json.dumps(synth.json["Resources"])  # its DLQ alarm / dashboard label


def test_the_appender_puts_and_reads_its_two_prefixes_of_the_locked_bucket_only(synth):
    audit = synth.stack.audit
    role = synth.logical_id(audit.function.role)
    locked = f"<{synth.logical_id(audit.bucket)}.Arn>"
    pairs = synth.permissions(role)
    on_locked = {
        (a, r.strip('"')) for a, r in ((a, synth.render(json.loads(r))) for a, r in pairs) if r.startswith(locked)
    }
    assert on_locked == {
        ("s3:PutObject", f"{locked}/{anchor.CHAIN_PREFIX}*"),
        ("s3:GetObject", f"{locked}/{anchor.CHAIN_PREFIX}*"),
        ("s3:PutObject", f"{locked}/{anchor.CHECKPOINT_PREFIX}*"),
        ("s3:GetObject", f"{locked}/{anchor.CHECKPOINT_PREFIX}*"),
        ("s3:ListBucket", locked),
    }
    assert not any(a.startswith("s3:") and "Delete" in a for a, _ in pairs)
