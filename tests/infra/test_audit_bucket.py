"""The audit export bucket (infra/constructs/audit.py): Object Lock with the configured mode and
retention only when ``audit_object_lock`` is set, and then the stream exporter of the WORM copy (the
session synth sets the flag)."""

import json

import aws_cdk as cdk
import pytest
from aws_cdk import aws_s3 as s3
from aws_cdk.assertions import Match, Template

from functions.core.settings import Settings
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


def test_the_session_synth_copies_each_new_audit_record_to_the_locked_bucket(synth):
    """The flag adds the exporter (docs/audit.md, "WORM copy"): on the table's stream, invoked only
    for INSERTs of audit records, dead letters alarmed; it may put and read objects under chain/
    of the locked bucket only (no delete, nothing else of the main bucket) and knows the bucket."""
    bucket, exporter = synth.stack.audit.bucket, synth.stack.audit.exporter
    assert bucket is not None and exporter is not None
    function_id = synth.logical_id(exporter)
    (mapping,) = [m["Properties"] for m in synth.resources("AWS::Lambda::EventSourceMapping").values()
                  if m["Properties"]["FunctionName"] == {"Ref": function_id}]
    assert mapping["EventSourceArn"] == {"Fn::GetAtt": [synth.one("AWS::DynamoDB::Table")[0], "StreamArn"]}
    (flt,) = mapping["FilterCriteria"]["Filters"]
    assert json.loads(flt["Pattern"]) == {
        "eventName": ["INSERT"],
        "dynamodb": {"Keys": {"pk": {"S": [{"prefix": "AUDIT#"}]}, "sk": {"S": [{"prefix": "SEQ#"}]}}},
    }
    assert mapping["DestinationConfig"]["OnFailure"]["Destination"] == {
        "Fn::GetAtt": [synth.logical_id(synth.stack.audit.dead_letters), "Arn"]}
    env = synth.resources("AWS::Lambda::Function")[function_id]["Properties"]["Environment"]["Variables"]
    assert env[Settings.env_name("audit_bucket_name")] == {"Ref": synth.logical_id(bucket)}
    # Its rights on S3: put and read under chain/ of the locked bucket, nothing else, no delete.
    role_id = synth.resources("AWS::Lambda::Function")[function_id]["Properties"]["Role"]["Fn::GetAtt"][0]
    statements = [s for p in synth.resources("AWS::IAM::Policy").values()
                  if {"Ref": role_id} in p["Properties"]["Roles"] for s in p["Properties"]["PolicyDocument"]["Statement"]]
    s3_statements = [s for s in statements if any(str(a).startswith("s3:") for a in _list(s["Action"]))]
    resources = {synth.render(r) for s in s3_statements for r in _list(s["Resource"])}
    locked = f"<{synth.logical_id(bucket)}.Arn>"
    assert resources <= {locked, f"{locked}/chain/*"}, resources
    assert not any("Delete" in a for s in s3_statements for a in _list(s["Action"]))
    assert "audit-export" in json.dumps(synth.json["Resources"])  # its DLQ alarm / dashboard label


def _list(value):
    return value if isinstance(value, list) else [value]
