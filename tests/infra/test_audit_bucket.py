"""The audit export bucket (infra/constructs/audit.py): Object Lock with the configured mode and
retention only when ``audit_object_lock`` is set; the session synth (flag off) has no such bucket."""

import aws_cdk as cdk
import pytest
from aws_cdk import aws_s3 as s3
from aws_cdk.assertions import Match, Template

from infra.config import DeployConfig
from infra.constructs.audit import OUTPUT_AUDIT_BUCKET, AuditExport


def template(config: DeployConfig) -> Template:
    stack = cdk.Stack(cdk.App(), "T")
    AuditExport(stack, "Audit", config=config, access_logs=s3.Bucket(stack, "Logs"))
    return Template.from_stack(stack)


@pytest.mark.parametrize(("mode", "cfn_mode"), [("governance", "GOVERNANCE"), ("compliance", "COMPLIANCE")])
def test_the_flag_creates_a_locked_bucket(mode, cfn_mode):
    t = template(DeployConfig.model_validate({"audit_object_lock": {"mode": mode, "retention_days": 400}}))
    t.has_resource("AWS::S3::Bucket", {
        "Properties": {
            "ObjectLockEnabled": True,
            "ObjectLockConfiguration": {
                "ObjectLockEnabled": "Enabled",
                "Rule": {"DefaultRetention": {"Mode": cfn_mode, "Days": 400}},
            },
            "VersioningConfiguration": {"Status": "Enabled"},
            "LoggingConfiguration": Match.object_like({"LogFilePrefix": "audit/"}),
        },
        "DeletionPolicy": "Retain",
    })
    assert OUTPUT_AUDIT_BUCKET in t.to_json()["Outputs"]


def test_without_the_flag_there_is_no_locked_bucket():
    t = template(DeployConfig())
    assert [b for b in t.find_resources("AWS::S3::Bucket").values() if "ObjectLockEnabled" in b.get("Properties", {})] == []
    assert OUTPUT_AUDIT_BUCKET not in t.to_json().get("Outputs", {})


def test_the_session_synth_has_no_locked_bucket(synth):
    buckets = synth.resources("AWS::S3::Bucket").values()
    assert buckets and not any("ObjectLockEnabled" in b.get("Properties", {}) for b in buckets)
    assert synth.stack.audit.bucket is None
