"""``batchctl run-batch`` between a presigned S3 GET and PUT pair, on moto's S3 served over HTTP
(``ThreadedMotoServer``): S3's shape of the pair (SigV4 query strings, a PUT that must carry its
Content-Length), boto3's own presigner, the input read and the output written in place."""

import io
import json

import boto3
import pytest
from botocore.config import Config
from moto.server import ThreadedMotoServer

import batchctl
from tests.fakes.engine import FakeEngine, chat_answer
from tests.helpers import free_port

BUCKET = "batch-io"


@pytest.fixture
def s3(monkeypatch):
    for name, value in {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                        "AWS_DEFAULT_REGION": "us-east-1"}.items():  # fmt: skip
        monkeypatch.setenv(name, value)
    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port)
    server.start()
    try:
        client = boto3.client(
            "s3",
            endpoint_url=f"http://127.0.0.1:{port}",
            region_name="us-east-1",
            config=Config(signature_version="s3v4"),
        )
        client.create_bucket(Bucket=BUCKET)
        yield client
    finally:
        server.stop()


def test_run_batch_reads_and_writes_through_presigned_urls(s3):
    rows = [
        {"custom_id": f"req-{i}", "method": "POST", "url": "/v1/chat/completions",
         "body": {"model": "m", "messages": [{"role": "user", "content": f"hi {i}"}]}}
        for i in range(25)
    ]  # fmt: skip
    s3.put_object(Bucket=BUCKET, Key="in.jsonl", Body="".join(json.dumps(r) + "\n" for r in rows).encode())
    get = s3.generate_presigned_url("get_object", Params={"Bucket": BUCKET, "Key": "in.jsonl"}, ExpiresIn=300)
    put = s3.generate_presigned_url("put_object", Params={"Bucket": BUCKET, "Key": "out.jsonl"}, ExpiresIn=300)
    assert "X-Amz-Signature=" in get and "X-Amz-Signature=" in put
    engine = FakeEngine().start()
    engine.respond = lambda path, body, seen: (200, chat_answer(body))
    try:
        err = io.StringIO()
        code = batchctl.main(
            ["run-batch", "-i", get, "-o", put, "--engine-url", engine.url], env={}, out=io.StringIO(), err=err
        )
    finally:
        engine.stop()
    assert code == 0, err.getvalue()
    out = s3.get_object(Bucket=BUCKET, Key="out.jsonl")["Body"].read().decode().splitlines()
    assert [json.loads(l)["custom_id"] for l in out] == [r["custom_id"] for r in rows]
    assert all(json.loads(l)["response"]["status_code"] == 200 for l in out)
