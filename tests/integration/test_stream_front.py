"""The large-body front (functions/stream_front) behind the local front, as the local deployment
runs it: ``files.create`` and ``uploads.parts.create`` over API Gateway's 10 MB through the
unchanged SDK, content of any size as bytes, the same keys, tenants, errors and rules as the API
Lambda's routes, and nothing left behind by a request that fails or a client that goes away."""

import hashlib
import socket
import threading
from collections.abc import Iterator
from urllib.parse import urlsplit

import openai
import pytest
from openai import OpenAI

from functions.api import handler as api_handler
from functions.authorizer import handler as authorizer_handler
from functions.core import audit, clients, deps, limits, schema
from functions.core.errors import Throttled
from functions.core.settings import Settings
from functions.stream_front.routes import StreamFront
from functions.stream_front.server import HEALTH_PATH
from functions.stream_front.server import make_server as service_server
from functions.stream_front.slots import Slots
from infra.local.front import LocalApi, make_server
from tests.helpers import raw_client, sdk_client

MIB = 1024 * 1024


def payload(size: int, seed: int = 0) -> bytes:
    block = hashlib.sha256(str(seed).encode()).digest() * 2048  # 64 KiB
    return (block * (size // len(block) + 1))[:size]


class RecordingFront(StreamFront):
    """The front, with what each request ended with (a Reply, or None for a client gone)."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.ended: list[object] = []
        self.changed = threading.Condition()

    def serve(self, *args, **kwargs):
        reply = super().serve(*args, **kwargs)
        with self.changed:
            self.ended.append(reply)
            self.changed.notify_all()
        return reply


@pytest.fixture
def front(aws: Settings) -> RecordingFront:
    return RecordingFront(deps.stores, deps.settings(), deps.now)


@pytest.fixture
def streamed_url(front: RecordingFront) -> Iterator[str]:
    stream = front
    server = make_server(LocalApi(api_handler.handler, authorizer_handler.handler, stream=stream), "127.0.0.1", 0)
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}/v1"
    server.shutdown()
    server.server_close()


@pytest.fixture
def sdk(streamed_url: str, keys: dict[str, str]) -> OpenAI:
    return sdk_client(streamed_url, keys["acme"], max_retries=0)


def stored_keys(aws: Settings, prefix: str) -> list[str]:
    s3 = clients.client("s3")
    return [o["Key"] for o in s3.list_objects_v2(Bucket=aws.bucket_name, Prefix=prefix).get("Contents", [])]


def open_multipart_uploads(aws: Settings) -> list[str]:
    return [u["Key"] for u in clients.client("s3").list_multipart_uploads(Bucket=aws.bucket_name).get("Uploads", [])]


def test_files_create_over_api_gateways_quota_through_the_unchanged_sdk(sdk: OpenAI, streamed_url: str, keys) -> None:
    data = payload(12 * MIB)  # API Gateway's quota is 10 MB: this never fits a Lambda request
    created = sdk.files.create(file=("big.jsonl", data), purpose="user_data")
    assert (created.bytes, created.filename, created.purpose, created.status) == (
        len(data),
        "big.jsonl",
        "user_data",
        "processed",
    )
    assert sdk.files.retrieve(created.id).bytes == len(data)
    assert sdk.files.content(created.id).read() == data  # streamed back, no redirect
    with raw_client(streamed_url, keys["acme"]) as raw:
        answer = raw.get(f"/files/{created.id}/content", headers={"Accept": "*/*"})  # curl's
        assert (answer.status_code, len(answer.content)) == (200, len(data)) and answer.content == data
        assert answer.headers["content-disposition"] == 'attachment; filename="big.jsonl"'
    assert [f.id for f in sdk.files.list()] == [created.id]  # the listing is still the API Lambda's


def test_the_file_may_come_before_its_purpose_as_the_node_sdk_sends_it(streamed_url: str, keys) -> None:
    body = (
        b'--b\r\nContent-Disposition: form-data; name="file"; filename="n.jsonl"\r\n'
        b"Content-Type: application/octet-stream\r\n\r\n" + b'{"a": 1}\n' + b"\r\n"
        b'--b\r\nContent-Disposition: form-data; name="purpose"\r\n\r\nbatch\r\n--b--\r\n'
    )
    with raw_client(streamed_url, keys["acme"]) as raw:
        answer = raw.post("/files", content=body, headers={"Content-Type": "multipart/form-data; boundary=b"})
    assert answer.status_code == 200, answer.text
    assert (answer.json()["purpose"], answer.json()["bytes"], answer.json()["filename"]) == ("batch", 9, "n.jsonl")


def test_a_64_mb_class_part_through_the_sdk_becomes_a_file(sdk: OpenAI) -> None:
    parts = [payload(20 * MIB, 1), payload(3 * MIB, 2)]
    data = b"".join(parts)
    upload = sdk.uploads.create(
        bytes=len(data), filename="parts.bin", mime_type="application/octet-stream", purpose="user_data"
    )
    ids = [sdk.uploads.parts.create(upload.id, data=part).id for part in parts]
    done = sdk.uploads.complete(upload.id, part_ids=ids, md5=hashlib.md5(data).hexdigest())
    assert done.status == "completed" and done.file is not None and done.file.bytes == len(data)


def test_keys_tenants_and_rules_are_the_api_lambdas(sdk: OpenAI, streamed_url: str, keys, aws: Settings) -> None:
    mine = sdk.files.create(file=("a.jsonl", b'{"a": 1}\n'), purpose="batch")
    with pytest.raises(openai.AuthenticationError) as bad_key:
        sdk_client(streamed_url, "sk-wrong", max_retries=0).files.create(file=("a", b"x"), purpose="batch")
    assert bad_key.value.code == "invalid_api_key" and bad_key.value.request_id
    other = sdk_client(streamed_url, keys["globex"], max_retries=0)
    with pytest.raises(openai.NotFoundError):
        other.files.content(mine.id)  # another tenant's file is not found, as everywhere
    with pytest.raises(openai.BadRequestError) as empty:
        sdk.files.create(file=("e.jsonl", b""), purpose="batch")
    assert empty.value.code == "empty_file"
    with pytest.raises(openai.BadRequestError) as purpose:
        sdk.files.create(file=("p.jsonl", b"x"), purpose="nonsense")  # type: ignore[arg-type]
    assert purpose.value.param == "purpose"
    assert stored_keys(aws, schema.file_key("acme", "")) == [schema.file_key("acme", mine.id)]  # nothing else stored
    assert open_multipart_uploads(aws) == []


def test_a_client_that_goes_away_mid_body_leaves_nothing(
    streamed_url: str, keys, sdk: OpenAI, aws: Settings, front: RecordingFront
) -> None:
    port = urlsplit(streamed_url).port
    head = (
        b'--b\r\nContent-Disposition: form-data; name="purpose"\r\n\r\nbatch\r\n'
        b'--b\r\nContent-Disposition: form-data; name="file"; filename="gone.jsonl"\r\n\r\n'
    )
    declared = len(head) + 30 * MIB
    sock = socket.create_connection(("127.0.0.1", port), timeout=10)
    sock.sendall(
        b"POST /v1/files HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer "
        + keys["acme"].encode()
        + b"\r\nContent-Type: multipart/form-data; boundary=b\r\nContent-Length: "
        + str(declared).encode()
        + b"\r\n\r\n"
        + head
        + payload(12 * MIB)
    )  # past the first S3 parts, then gone
    sock.close()
    with front.changed:  # the request has ended on the server: it saw its client go away
        assert front.changed.wait_for(lambda: front.ended, timeout=30)
    assert front.ended == [None]
    assert open_multipart_uploads(aws) == []  # aborted
    assert list(sdk.files.list()) == []
    assert stored_keys(aws, schema.file_key("acme", "")) == []


@pytest.mark.settings(max_batch_file_bytes=2 * MIB)
def test_a_file_over_its_purposes_limit_is_refused_and_its_bytes_are_gone(sdk: OpenAI, aws: Settings) -> None:
    with pytest.raises(openai.BadRequestError) as over:
        sdk.files.create(file=("big.jsonl", payload(3 * MIB)), purpose="batch")
    assert over.value.code == "file_too_large"
    assert stored_keys(aws, schema.file_key("acme", "")) == [] and open_multipart_uploads(aws) == []


@pytest.fixture
def service_url(front: RecordingFront, streamed_url: str) -> Iterator[str]:
    """The front as the stack's Fargate task runs it: its own server, the other requests on its
    paths relayed to the API (here the local front's)."""
    server = service_server(front, streamed_url.removesuffix("/v1"), "127.0.0.1", 0)
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}/v1"
    server.shutdown()
    server.server_close()


def test_the_service_streams_its_routes_and_relays_the_rest_to_the_api(service_url: str, keys) -> None:
    sdk = sdk_client(service_url, keys["acme"], max_retries=0)
    body = payload(11 * MIB, seed=7)
    created = sdk.files.create(file=("svc.jsonl", body), purpose="user_data")
    assert created.bytes == len(body)
    assert [f.id for f in sdk.files.list()] == [created.id]  # GET /v1/files: relayed to the API
    assert hashlib.sha256(sdk.files.content(created.id).read()).digest() == hashlib.sha256(body).digest()
    health = raw_client(service_url.removesuffix("/v1"), None).get(HEALTH_PATH)
    assert (health.status_code, health.text) == (200, "ok")
    with pytest.raises(openai.AuthenticationError):  # relayed with the request's own headers
        sdk_client(service_url, "sk-not-a-key", max_retries=0).files.list()


def test_the_service_refuses_to_relay_a_body_the_api_could_not_take(service_url: str, keys) -> None:
    answer = raw_client(service_url, keys["acme"]).put("/files", content=b"x" * (11 * MIB))
    assert answer.status_code == 413
    assert answer.json()["error"]["type"] == "invalid_request_error"


def test_the_service_answers_502_when_the_api_is_unreachable(front: RecordingFront, keys) -> None:
    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        dead = probe.getsockname()[1]
    server = service_server(front, f"http://127.0.0.1:{dead}", "127.0.0.1", 0)
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True).start()
    try:
        answer = raw_client(f"http://127.0.0.1:{server.server_address[1]}/v1", keys["acme"]).get("/files")
    finally:
        server.shutdown()
        server.server_close()
    assert answer.status_code == 502 and answer.json()["error"]["type"] == "server_error"


def test_streamed_requests_are_audited_as_the_api_lambdas_are(sdk: OpenAI, client: OpenAI, keys, appender) -> None:
    """The same actions through the Lambda route (``client``) and the streamed one (``sdk``): the
    same records in the tenant's chain, each with its request's id."""
    records = {}
    for name, api in (("lambda", client), ("streamed", sdk)):
        created = api.files.with_raw_response.create(file=("a.jsonl", b'{"x": 1}\n'), purpose="batch")
        upload = api.uploads.create(bytes=3, filename="u.jsonl", mime_type="application/jsonl", purpose="batch")
        part = api.uploads.parts.with_raw_response.create(upload.id, data=b"abc")
        with pytest.raises(openai.BadRequestError) as refused:
            api.files.create(file=("e.jsonl", b""), purpose="batch")
        mine = appender.records("acme")[len(records.get("lambda", [])) :]
        records[name] = mine
        assert [r.request_id for r in mine if r.action in ("files.create", "uploads.add_part")] == [
            created.headers["x-request-id"],
            part.headers["x-request-id"],
            refused.value.response.headers["x-request-id"],
        ]
    shape = {
        name: [(r.action, r.outcome, r.actor, r.details.get("error_code")) for r in rs] for name, rs in records.items()
    }
    assert shape["streamed"] == shape["lambda"]
    assert [a for a, *_ in shape["streamed"]] == ["files.create", "uploads.create", "uploads.add_part", "files.create"]
    assert shape["streamed"][-1][1:] == ("400", shape["lambda"][0][2], "empty_file")
    assert audit.verify(appender.records("acme")) is None


def test_a_tenants_slow_uploads_hold_only_its_own_share(
    streamed_url: str, keys, sdk: OpenAI, front: RecordingFront
) -> None:
    port = urlsplit(streamed_url).port
    head = (
        b'--b\r\nContent-Disposition: form-data; name="purpose"\r\n\r\nbatch\r\n'
        b'--b\r\nContent-Disposition: form-data; name="file"; filename="slow.jsonl"\r\n\r\n'
    )
    share = limits.STREAM_MAX_UPLOADS_PER_TENANT
    slow = []
    for _ in range(share):  # uploads that send a little, then nothing
        sock = socket.create_connection(("127.0.0.1", port), timeout=10)
        sock.sendall(
            b"POST /v1/files HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer "
            + keys["acme"].encode()
            + b"\r\nContent-Type: multipart/form-data; boundary=b\r\nContent-Length: "
            + str(len(head) + MIB).encode()
            + b"\r\n\r\n"
            + head
            + b"{}"
        )
        slow.append(sock)
    deadline = threading.Event()
    while front.slots.held("acme") < share and not deadline.wait(0.05):
        pass
    with pytest.raises(openai.RateLimitError) as refused:
        sdk.files.create(file=("next.jsonl", b'{"x": 1}\n'), purpose="batch")
    assert refused.value.response.headers["retry-after"] == "1"
    other = sdk_client(streamed_url, keys["globex"], max_retries=0)
    assert other.files.create(file=("theirs.jsonl", b'{"x": 1}\n'), purpose="batch").bytes == 9  # not slowed
    for sock in slow:
        sock.close()
    with front.changed:
        assert front.changed.wait_for(lambda: front.ended.count(None) == share, timeout=30)
    assert front.slots.held() == 0
    assert sdk.files.create(file=("next.jsonl", b'{"x": 1}\n'), purpose="batch").bytes == 9


def test_a_full_process_is_a_503_the_sdk_retries() -> None:
    slots = Slots(total=1, per_tenant=1)
    with slots.hold("a"), pytest.raises(Throttled), slots.hold("b"):
        pass
    with slots.hold("b"):
        assert slots.held() == 1 and slots.held("b") == 1
