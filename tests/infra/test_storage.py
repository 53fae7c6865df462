"""Bucket and table: security settings and the schema the code uses."""

import pytest
from aws_cdk.assertions import Match

from functions.core import schema
from infra.constructs.storage import UPLOADS_PREFIX


def _bucket(synth):
    return synth.resources("AWS::S3::Bucket")[synth.logical_id(synth.stack.storage.bucket)]


@pytest.mark.parametrize("which", ["bucket", "access_logs"])
def test_buckets_are_encrypted_private_and_tls_only(synth, which):
    bucket = getattr(synth.stack.storage, which)
    props = synth.resources("AWS::S3::Bucket")[synth.logical_id(bucket)]["Properties"]
    assert props["BucketEncryption"]["ServerSideEncryptionConfiguration"][0]["ServerSideEncryptionByDefault"] == {
        "SSEAlgorithm": "AES256"
    }
    assert props["PublicAccessBlockConfiguration"] == {
        "BlockPublicAcls": True,
        "BlockPublicPolicy": True,
        "IgnorePublicAcls": True,
        "RestrictPublicBuckets": True,
    }
    assert props["OwnershipControls"]["Rules"] == [{"ObjectOwnership": "BucketOwnerEnforced"}]
    synth.template.has_resource_properties(
        "AWS::S3::BucketPolicy",
        {
            "Bucket": {"Ref": synth.logical_id(bucket)},
            "PolicyDocument": {
                "Statement": Match.array_with(
                    [
                        Match.object_like(
                            {
                                "Effect": "Deny",
                                "Action": "s3:*",
                                "Condition": {"Bool": {"aws:SecureTransport": "false"}},
                            }
                        )
                    ]
                )
            },
        },
    )


def test_data_bucket_unversioned_logged_with_lifecycle(synth):
    props = _bucket(synth)["Properties"]
    assert "VersioningConfiguration" not in props
    assert props["LoggingConfiguration"]["DestinationBucketName"] == {
        "Ref": synth.logical_id(synth.stack.storage.access_logs)
    }
    rules = {r["Id"]: r for r in props["LifecycleConfiguration"]["Rules"]}
    assert rules["abort-incomplete-multipart"]["AbortIncompleteMultipartUpload"] == {"DaysAfterInitiation": 1}
    assert "Prefix" not in rules["abort-incomplete-multipart"]  # whole bucket
    assert rules["expire-upload-parts"]["Prefix"] == UPLOADS_PREFIX == "uploads/"
    assert rules["expire-upload-parts"]["ExpirationInDays"] == 2
    assert schema.upload_part_key("t", "u", "p").startswith(UPLOADS_PREFIX)
    assert not schema.file_key("t", "f").startswith(UPLOADS_PREFIX)  # files never expire by lifecycle


def test_data_is_retained_by_default(synth):
    for bucket in (synth.stack.storage.bucket, synth.stack.storage.access_logs):
        assert synth.resources("AWS::S3::Bucket")[synth.logical_id(bucket)]["DeletionPolicy"] == "Retain"
    assert synth.one("AWS::DynamoDB::Table")[1]["DeletionPolicy"] == "Retain"
    assert not synth.resources("Custom::S3AutoDeleteObjects")


def test_table_matches_schema(synth):
    _, table = synth.one("AWS::DynamoDB::Table")
    props = table["Properties"]
    ts = schema.TABLE_SCHEMA
    assert props["KeySchema"] == ts["KeySchema"]

    def key(a):
        return a["AttributeName"]

    assert sorted(props["AttributeDefinitions"], key=key) == sorted(ts["AttributeDefinitions"], key=key)
    assert props["GlobalSecondaryIndexes"] == ts["GlobalSecondaryIndexes"]
    assert props["BillingMode"] == ts["BillingMode"] == "PAY_PER_REQUEST"
    assert props["StreamSpecification"] == {"StreamViewType": ts["StreamSpecification"]["StreamViewType"]}
    assert props["StreamSpecification"]["StreamViewType"] == "NEW_AND_OLD_IMAGES"
    assert props["TimeToLiveSpecification"] == {"AttributeName": schema.TTL, "Enabled": True}
    assert props["PointInTimeRecoverySpecification"] == {"PointInTimeRecoveryEnabled": True}
