"""The local moto server keeps its clients' connections (infra/local/moto_keepalive.py): requests
follow each other on one connection, whatever their bodies (none, Content-Length, chunked, a
100-continue), and every answer is framed so that the next one can be read after it."""

import http.client
import json
import threading

import boto3
import pytest
from werkzeug.serving import make_server

from infra.local.moto_keepalive import KeepAliveHandler, KeepAliveMotoServer


@pytest.fixture
def server(monkeypatch):
    connections: list[object] = []
    setup = KeepAliveHandler.setup

    def counting(self):
        connections.append(self)
        setup(self)

    monkeypatch.setattr(KeepAliveHandler, "setup", counting)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    srv = KeepAliveMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    srv.start()
    yield f"http://127.0.0.1:{srv.get_host_and_port()[1]}", connections
    srv.stop()


def test_an_sdk_client_makes_its_calls_on_one_connection(server):
    url, connections = server
    s3 = boto3.client("s3", endpoint_url=url)
    sqs = boto3.client("sqs", endpoint_url=url)
    dynamodb = boto3.client("dynamodb", endpoint_url=url)
    s3.create_bucket(Bucket="keepalive-bucket")
    big = bytes(range(256)) * 8192  # 2 MiB: botocore sends it after a 100-continue
    s3.put_object(Bucket="keepalive-bucket", Key="big", Body=big)
    s3.put_object(Bucket="keepalive-bucket", Key="empty", Body=b"")
    queue = sqs.create_queue(QueueName="keepalive")["QueueUrl"]
    dynamodb.create_table(
        TableName="keepalive",
        KeySchema=[{"AttributeName": "pk", "KeyType": "HASH"}],
        AttributeDefinitions=[{"AttributeName": "pk", "AttributeType": "S"}],
        BillingMode="PAY_PER_REQUEST",
    )
    opened = len(connections)
    for i in range(5):
        assert s3.get_object(Bucket="keepalive-bucket", Key="big")["Body"].read() == big
        assert s3.get_object(Bucket="keepalive-bucket", Key="big", Range="bytes=10-19")["Body"].read() == big[10:20]
        assert s3.head_object(Bucket="keepalive-bucket", Key="big")["ContentLength"] == len(big)
        assert s3.get_object(Bucket="keepalive-bucket", Key="empty")["Body"].read() == b""
        with pytest.raises(s3.exceptions.NoSuchKey):  # an error answer, then the next call
            s3.get_object(Bucket="keepalive-bucket", Key="absent")
        sqs.send_message(QueueUrl=queue, MessageBody=f"m{i}")
        dynamodb.put_item(TableName="keepalive", Item={"pk": {"S": f"k{i}"}})
    assert dynamodb.scan(TableName="keepalive")["Count"] == 5
    assert (
        sqs.get_queue_attributes(QueueUrl=queue, AttributeNames=["ApproximateNumberOfMessages"])["Attributes"][
            "ApproximateNumberOfMessages"
        ]
        == "5"
    )
    assert len(connections) == opened  # 37 calls more, no connection more


def test_a_chunked_body_is_read_to_its_end_and_the_next_request_follows(server):
    url, connections = server
    s3 = boto3.client("s3", endpoint_url=url)
    s3.create_bucket(Bucket="chunked-bucket")
    conn = http.client.HTTPConnection(url.removeprefix("http://"))
    conn.putrequest("PUT", "/chunked-bucket/sent-in-chunks")
    conn.putheader("Transfer-Encoding", "chunked")
    conn.endheaders()
    for part in (b"hello ", b"chunked ", b"world"):
        conn.send(b"%x\r\n%s\r\n" % (len(part), part))
    conn.send(b"0\r\n\r\n")
    answer = conn.getresponse()
    answer.read()
    assert answer.status == 200 and answer.getheader("Connection") is None
    conn.request("GET", "/moto-api/data.json")  # the same connection, in step
    answer = conn.getresponse()
    assert answer.status == 200 and "s3" in json.loads(answer.read())
    assert s3.get_object(Bucket="chunked-bucket", Key="sent-in-chunks")["Body"].read() == b"hello chunked world"
    assert len([c for c in connections if c.client_address[1] == conn.sock.getsockname()[1]]) == 1
    conn.close()


def test_a_request_the_application_fails_on_gets_a_500_and_its_connection_closed():
    def failing(environ, start_response):
        raise RuntimeError("moto failed on this request")

    srv = make_server("127.0.0.1", 0, failing, True, request_handler=KeepAliveHandler)
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    try:
        conn = http.client.HTTPConnection(f"127.0.0.1:{srv.server_port}")
        conn.request("POST", "/", body=b"{}")
        answer = conn.getresponse()
        assert answer.status == 500 and answer.getheader("Connection") == "close"
        assert answer.read() == b"moto failed"
        assert answer.will_close
        conn.close()
    finally:
        srv.shutdown()
        srv.server_close()
