"""The anchors' adapters on moto, against the fakes' contract: the Object Lock bucket as the
deployment creates it (``WormObjects``: a key written once, If-None-Match; a later version or a
delete marker never replaces the first version, and a locked version cannot be deleted) and the
KMS signer (ECC_NIST_P256), whose signatures the same verifier checks as the local key's."""

import io

import boto3
import pytest
from botocore.exceptions import ClientError

from functions.core import anchor, signing
from functions.core.aws.kms import KmsSigner
from functions.core.aws.s3 import WormObjects
from tests.fakes.aws import FakeWorm


@pytest.fixture(params=["moto", "fake"])
def worm(request: pytest.FixtureRequest):
    if request.param == "fake":
        return FakeWorm()
    return request.getfixturevalue("appender").worm


def tamper(worm, key: str, *, body: bytes | None = None, hide: bool = False) -> None:
    """What a principal with PutObject (without If-None-Match) or DeleteObject could do, which the
    bucket policy denies: a second version, a delete marker."""
    if isinstance(worm, FakeWorm):
        worm.hide(key) if hide else worm.overwrite(key, body)
        return
    s3 = boto3.client("s3")
    if hide:
        s3.delete_object(Bucket=worm.bucket, Key=key)
    else:
        s3.put_object(Bucket=worm.bucket, Key=key, Body=body, ChecksumAlgorithm="SHA256")


def test_worm_store_contract(worm):
    key = anchor.worm_key("acme", 1)
    assert worm.find(key) is None and worm.originals(anchor.worm_prefix("acme")) == {}
    assert worm.put_once(key, b"first")
    assert not worm.put_once(key, b"second")  # If-None-Match: the key is taken
    assert worm.find(key) == b"first"
    tamper(worm, key, body=b"third")
    assert worm.find(key) == b"third"
    assert worm.originals(anchor.worm_prefix("acme")) == {key: anchor.WormObject(b"first", versions=2)}
    tamper(worm, key, hide=True)
    assert worm.find(key) is None
    assert worm.originals(anchor.worm_prefix("acme")) == {key: anchor.WormObject(b"first", versions=2, hidden=True)}
    assert worm.originals(anchor.worm_prefix("globex")) == {}


def test_a_locked_version_cannot_be_deleted(appender):
    key = anchor.worm_key("acme", 1)
    appender.worm.put_once(key, b"first")
    s3 = boto3.client("s3")
    (version,) = s3.list_object_versions(Bucket=appender.worm.bucket, Prefix=key)["Versions"]
    with pytest.raises(ClientError) as refused:
        s3.delete_object(Bucket=appender.worm.bucket, Key=key, VersionId=version["VersionId"])
    assert refused.value.response["Error"]["Code"] == "AccessDenied"
    lock = s3.get_object_lock_configuration(Bucket=appender.worm.bucket)["ObjectLockConfiguration"]
    assert lock["ObjectLockEnabled"] == "Enabled" and lock["Rule"]["DefaultRetention"]["Days"] >= 1


def test_a_kms_signature_is_checked_by_the_same_verifier(aws):
    kms = boto3.client("kms")
    key = kms.create_key(KeySpec="ECC_NIST_P256", KeyUsage="SIGN_VERIFY")["KeyMetadata"]["Arn"]
    signer = KmsSigner(kms, key)
    message = anchor.Checkpoint(tenant="acme", seq=1, hash="a" * 64, at=1, key_id=key).message()
    check = signing.verifier(signer.public_key())
    assert check(message, signer.sign(message))
    assert not check(message + b" ", signer.sign(message))
    other = KmsSigner(kms, kms.create_key(KeySpec="ECC_NIST_P256", KeyUsage="SIGN_VERIFY")["KeyMetadata"]["Arn"])
    assert not check(message, other.sign(message))


def test_an_intent_delivered_twice_is_one_record_one_copy_one_checkpoint(appender, client):
    """The same intent twice (as SQS delivers it again after its five-minute deduplication
    window): one record, one version of its copy and of its checkpoint."""
    client.files.create(file=("a.jsonl", io.BytesIO(b'{"a": 1}\n')), purpose="batch")
    sqs = boto3.client("sqs")
    url = appender.settings.audit_queue_url
    (message,) = sqs.receive_message(QueueUrl=url, VisibilityTimeout=0)["Messages"]
    sqs.send_message(QueueUrl=url, MessageBody=message["Body"], MessageGroupId="acme", MessageDeduplicationId="later")
    assert appender.drain() == 2
    (record,) = appender.chain.records("acme")
    assert record.action == "files.create"
    versions = boto3.client("s3").list_object_versions(Bucket=appender.worm.bucket)["Versions"]
    assert sorted(v["Key"] for v in versions) == [anchor.worm_key("acme", 1), anchor.checkpoint_key("acme", 1)]
