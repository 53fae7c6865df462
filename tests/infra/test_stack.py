"""Stack shape: name, outputs, no account/region baked in, no lookups."""

import json

from infra import names


def test_stack_name_and_outputs(synth):
    # docs/deploy.md: the stack is named BatchApi and prints ApiUrl, TableName and BucketName, and,
    # with governance on (the default), the audit queue, Object Lock bucket and signing key.
    assert synth.stack.stack_name == names.STACK_NAME == "BatchApi"
    assert (
        set(synth.json["Outputs"])
        == {
            names.OUTPUT_API_URL,
            names.OUTPUT_TABLE,
            names.OUTPUT_BUCKET,
            names.OUTPUT_AUDIT_QUEUE,
            names.OUTPUT_AUDIT_BUCKET,
            names.OUTPUT_AUDIT_KEY,
        }
        == {"ApiUrl", "TableName", "BucketName", "AuditQueueUrl", "AuditBucketName", "AuditSigningKeyArn"}
    )
    assert synth.json["Outputs"][names.OUTPUT_TABLE]["Value"] == {"Ref": synth.one("AWS::DynamoDB::Table")[0]}
    assert synth.json["Outputs"][names.OUTPUT_BUCKET]["Value"] == {"Ref": synth.logical_id(synth.stack.storage.bucket)}


def test_environment_agnostic_without_config(synth):
    text = json.dumps(synth.json)
    assert "AWS::Region" in text and "AWS::AccountId" in text
    assert synth.stack.resolve(synth.stack.region).get("Ref") == "AWS::Region"


def test_synth_looks_nothing_up(synth):
    # Availability zones are deploy-time values (Fn::GetAZs), the GPU AMI an SSM parameter resolved
    # by CloudFormation: no context lookups that would call AWS at synth time.
    manifest = json.loads((synth.outdir / "manifest.json").read_text())
    assert not manifest.get("missing"), manifest.get("missing")
    subnets = synth.resources("AWS::EC2::Subnet").values()
    assert all("Fn::GetAZs" in json.dumps(s["Properties"]["AvailabilityZone"]) for s in subnets)
    (parameter,) = [p for name, p in synth.json["Parameters"].items() if name.startswith("SsmParameterValue")]
    assert parameter["Type"] == "AWS::SSM::Parameter::Value<AWS::EC2::Image::Id>"
    assert parameter["Default"] == "/aws/service/ecs/optimized-ami/amazon-linux-2023/gpu/recommended/image_id"
