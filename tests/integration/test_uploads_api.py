"""Uploads API: parts small enough for a Lambda request assemble into one byte-identical File."""

import hashlib
import json
import os
from urllib.parse import unquote

import openai
import pytest
from openai.types import FileObject, Upload
from openai.types.uploads import UploadPart

from functions.core import clients, schema
from tests.helpers import assert_error, assert_openai_shape, sdk_client
from tests.wire_bytes import WireBytes

MIB = 1024 * 1024


def create(raw, *, size, filename="big.jsonl", purpose="batch", **extra):
    return raw.post(
        "/uploads",
        json={"filename": filename, "purpose": purpose, "bytes": size, "mime_type": "application/jsonl", **extra},
    )


def add_part(raw, upload_id, data):
    return raw.post(f"/uploads/{upload_id}/parts", files={"data": ("blob", data)})


def test_twenty_megabytes_from_parts_is_byte_identical(raw, client, stores):
    payload = os.urandom(20 * MIB + 12345)
    response = create(raw, size=len(payload))
    assert response.status_code == 200, response.text
    upload = assert_openai_shape(Upload, response.json())
    assert upload.status == "pending" and upload.file is None and upload.object == "upload"
    assert upload.expires_at == upload.created_at + 3_600  # an Upload takes parts for an hour

    part_ids = []
    for start in range(0, len(payload), 4 * MIB):
        part = add_part(raw, upload.id, payload[start : start + 4 * MIB])
        assert part.status_code == 200, part.text
        parsed = assert_openai_shape(UploadPart, part.json())
        assert parsed.upload_id == upload.id and parsed.object == "upload.part"
        part_ids.append(parsed.id)
    assert len(part_ids) == 6

    done = raw.post(
        f"/uploads/{upload.id}/complete", json={"part_ids": part_ids, "md5": hashlib.md5(payload).hexdigest()}
    )
    assert done.status_code == 200, done.text
    completed = assert_openai_shape(Upload, done.json())
    assert completed.status == "completed"
    file = assert_openai_shape(FileObject, done.json()["file"])
    assert file.bytes == len(payload) and file.purpose == "batch" and file.filename == "big.jsonl"
    assert file.expires_at == file.created_at + 30 * 86_400
    assert client.files.retrieve(file.id) == file
    assert stores.objects.get(schema.file_key("acme", upload.id)) == payload
    # the parts are gone once assembled
    assert stores.objects.list_keys("uploads/") == []


def test_sdk_chunked_upload_helper(client, stores):
    payload = os.urandom(9 * MIB)
    upload = client.uploads.upload_file_chunked(
        file=payload,
        filename="chunked.jsonl",
        bytes=len(payload),
        mime_type="application/jsonl",
        purpose="batch",
        part_size=4 * MIB,
    )
    assert upload.status == "completed" and upload.file is not None
    record = stores.files.get("acme", upload.file.id, now=0)
    assert stores.objects.get(record.s3_key) == payload


@pytest.mark.parametrize(
    ("sizes", "copied"),
    [
        # a source of 5 MiB or more on a part boundary is copied server-side; the rest is read
        # and coalesced into parts of at least 5 MiB (S3's minimum for all but the last part)
        ([6 * MIB, 1 * MIB, 2 * MIB, 6 * MIB, 3 * MIB, 1], {0}),
        ([6 * MIB, 5 * MIB, 1], {0, 1}),
        ([4 * MIB, 4 * MIB], set()),
    ],
)
def test_concatenate_copies_large_sources_and_coalesces_small_ones(stores, sizes, copied):
    blobs = [os.urandom(n) for n in sizes]
    for i, blob in enumerate(blobs):
        stores.objects.put(f"src/{i}", blob)
    calls: list[tuple[str, str]] = []

    def record(params, event_name, **_):
        operation = event_name.rsplit(".", 1)[-1]
        if operation in ("GetObject", "UploadPartCopy"):
            calls.append((operation, params["CopySource"]["Key"] if operation == "UploadPartCopy" else params["Key"]))

    events = clients.client("s3").meta.events
    events.register("before-parameter-build.s3.*", record)
    try:
        stores.objects.concatenate("dest", [(f"src/{i}", n) for i, n in enumerate(sizes)])
    finally:
        events.unregister("before-parameter-build.s3.*", record)
    assert sorted(k for op, k in calls if op == "UploadPartCopy") == [f"src/{i}" for i in sorted(copied)]
    assert sorted(k for op, k in calls if op == "GetObject") == [
        f"src/{i}" for i in range(len(sizes)) if i not in copied
    ]
    assert stores.objects.get("dest") == b"".join(blobs)


def test_upload_file_has_expires_after(raw, client):
    upload = create(
        raw, size=3, filename="n.txt", purpose="user_data", expires_after={"anchor": "created_at", "seconds": 4000}
    ).json()
    part = add_part(raw, upload["id"], b"abc").json()
    done = client.uploads.complete(upload["id"], part_ids=[part["id"]])
    assert done.file.expires_at == done.file.created_at + 4000 and done.file.purpose == "user_data"
    assert client.files.content(done.file.id).content == b"abc"


def test_wrong_md5_keeps_the_upload_pending_and_creates_no_file(raw, client):
    upload = create(raw, size=3).json()
    part = add_part(raw, upload["id"], b"abc").json()
    bad = raw.post(f"/uploads/{upload['id']}/complete", json={"part_ids": [part["id"]], "md5": "0" * 32})
    assert_error(bad, 400, "md5_mismatch", "md5")
    assert client.files.list().data == []
    ok = client.uploads.complete(upload["id"], part_ids=[part["id"]], md5=hashlib.md5(b"abc").hexdigest())
    assert ok.status == "completed"


def test_byte_count_must_match(raw):
    upload = create(raw, size=10).json()
    part = add_part(raw, upload["id"], b"abc").json()
    assert_error(
        raw.post(f"/uploads/{upload['id']}/complete", json={"part_ids": [part["id"]]}),
        400,
        "bytes_mismatch",
        "part_ids",
    )


def test_parts_must_belong_to_the_upload_and_be_listed_once(raw):
    one = create(raw, size=3).json()
    two = create(raw, size=3).json()
    p1 = add_part(raw, one["id"], b"abc").json()
    p2 = add_part(raw, two["id"], b"abc").json()
    complete = f"/uploads/{one['id']}/complete"
    assert_error(raw.post(complete, json={"part_ids": [p2["id"]]}), 400, "invalid_value", "part_ids", message=p2["id"])
    assert_error(raw.post(complete, json={"part_ids": [p1["id"], p1["id"]]}), 400, "invalid_value", "part_ids")
    assert_error(raw.post(complete, json={"part_ids": []}), 400, "invalid_value", "part_ids")
    assert_error(raw.post(complete, json={}), 400, "missing_required_parameter", "part_ids")


def test_complete_is_idempotent(raw, client):
    upload = create(raw, size=3).json()
    part = add_part(raw, upload["id"], b"abc").json()
    first = client.uploads.complete(upload["id"], part_ids=[part["id"]])
    again = client.uploads.complete(upload["id"], part_ids=[part["id"]])
    assert again.file == first.file and again.status == "completed"
    assert len(client.files.list().data) == 1
    assert_error(add_part(raw, upload["id"], b"more"), 400, "upload_not_pending", "upload_id", message="completed")


def test_cancel(raw, stores):
    upload = create(raw, size=6).json()
    part = add_part(raw, upload["id"], b"abc").json()
    response = raw.post(f"/uploads/{upload['id']}/cancel")
    assert response.status_code == 200
    cancelled = assert_openai_shape(Upload, response.json())
    assert cancelled.status == "cancelled" and cancelled.file is None and cancelled.id == upload["id"]
    assert stores.objects.list_keys("uploads/") == []
    assert_error(add_part(raw, upload["id"], b"abc"), 400, "upload_not_pending", "upload_id", message="cancelled")
    assert_error(
        raw.post(f"/uploads/{upload['id']}/complete", json={"part_ids": [part["id"]]}),
        400,
        "upload_not_pending",
        "upload_id",
    )
    assert_error(raw.post(f"/uploads/{upload['id']}/cancel"), 400, "upload_not_pending", "upload_id")


def test_expired_upload_takes_no_parts(raw, clock):
    upload = create(raw, size=3).json()
    clock.now += 3_600
    assert_error(add_part(raw, upload["id"], b"abc"), 400, "upload_not_pending", "upload_id", message="expired")


def test_expired_upload_cannot_be_completed(raw, client, clock):
    upload = create(raw, size=3).json()
    part = add_part(raw, upload["id"], b"abc").json()
    clock.now += 3_600
    done = raw.post(f"/uploads/{upload['id']}/complete", json={"part_ids": [part["id"]]})
    assert_error(done, 400, "upload_not_pending", "upload_id", message="expired")
    assert client.files.list().data == []
    assert_error(raw.post(f"/uploads/{upload['id']}/cancel"), 400, "upload_not_pending", "upload_id", message="expired")


@pytest.mark.settings(max_upload_part_bytes=8)
def test_part_too_large_is_413(raw):
    upload = create(raw, size=20).json()
    assert_error(add_part(raw, upload["id"], b"x" * 9), 413, "request_too_large", "data", message="part_size")
    assert_error(add_part(raw, upload["id"], b""), 400, "empty_file", "data")


def test_another_tenants_upload_is_404(raw, other_client):
    upload = create(raw, size=3).json()
    with pytest.raises(openai.NotFoundError):
        other_client.uploads.parts.create(upload["id"], data=b"abc")
    with pytest.raises(openai.NotFoundError):
        other_client.uploads.cancel(upload["id"])
    with pytest.raises(openai.NotFoundError):
        other_client.uploads.complete(upload["id"], part_ids=["part_x"])


@pytest.mark.parametrize(
    ("body", "code", "param"),
    [
        (
            {"filename": "a.jsonl", "purpose": "batch", "bytes": 0, "mime_type": "application/jsonl"},
            "empty_file",
            "bytes",
        ),
        (
            {"filename": "a.jsonl", "purpose": "batch", "bytes": 200 * MIB + 1, "mime_type": "application/jsonl"},
            "file_too_large",
            "bytes",
        ),
        (
            {"filename": "a.jsonl", "purpose": "nope", "bytes": 3, "mime_type": "application/jsonl"},
            "invalid_value",
            "purpose",
        ),
        (
            {"filename": "a.jsonl", "purpose": "batch", "mime_type": "application/jsonl"},
            "missing_required_parameter",
            "bytes",
        ),
        (
            {"filename": "a.jsonl", "purpose": "batch", "bytes": "x", "mime_type": "application/jsonl"},
            "invalid_value",
            "bytes",
        ),
        (
            {"filename": "", "purpose": "batch", "bytes": 3, "mime_type": "application/jsonl"},
            "invalid_value",
            "filename",
        ),
        (
            {
                "filename": "a.jsonl",
                "purpose": "batch",
                "bytes": 3,
                "mime_type": "application/jsonl",
                "expires_after": {"anchor": "created_at", "seconds": 1},
            },
            "invalid_value",
            "expires_after.seconds",
        ),
    ],
)
def test_bad_create_requests(raw, body, code, param):
    assert_error(raw.post("/uploads", json=body), 400, code, param)


@pytest.mark.parametrize("upload_id", ["upload_01m8n7xjx1bekcr5r3de2q3dfv", "nope"])
def test_unknown_upload_is_404(raw, upload_id):
    assert_error(
        add_part(raw, upload_id, b"abc"), 404, None, "upload_id", message=f"No such Upload object: {upload_id}"
    )
    assert_error(raw.post(f"/uploads/{upload_id}/complete", json={"part_ids": ["p"]}), 404, None, "upload_id")
    assert_error(raw.post(f"/uploads/{upload_id}/cancel"), 404, None, "upload_id")


def test_batch_file_of_exactly_200_mib_is_accepted(raw):
    response = create(raw, size=200 * MIB)
    assert response.status_code == 200, response.text
    assert response.json()["bytes"] == 200 * MIB


@pytest.mark.parametrize("purpose", ["user_data", "fine-tune", "assistants"])
def test_an_upload_of_another_purpose_may_total_8_gib(raw, purpose):
    ok = create(raw, size=8 * 1024 * MIB, filename="big.jsonl", purpose=purpose)
    assert ok.status_code == 200, ok.text
    assert ok.json()["bytes"] == 8 * 1024 * MIB
    assert_error(
        create(raw, size=8 * 1024 * MIB + 1, filename="big.jsonl", purpose=purpose), 400, "file_too_large", "bytes"
    )


def test_at_most_10_000_parts(raw):
    upload = create(raw, size=3).json()
    too_many = [f"part_{i:026d}" for i in range(10_001)]
    response = raw.post(f"/uploads/{upload['id']}/complete", json={"part_ids": too_many})
    assert_error(response, 400, "invalid_value", "part_ids", message="at most 10000 parts")


def _race(monkeypatch, repo, method, competitor):
    """``repo.method`` runs ``competitor`` first: another request wins between our read and write."""
    original = getattr(repo, method)

    def racing(record, *args, **kwargs):
        competitor(record)
        return original(record, *args, **kwargs)

    monkeypatch.setattr(repo, method, racing)


def test_complete_racing_a_cancel_is_409_and_creates_no_file(raw, client, stores, monkeypatch):
    upload = create(raw, size=3).json()
    part = add_part(raw, upload["id"], b"abc").json()
    _race(monkeypatch, stores.uploads, "complete", lambda record: stores.uploads.transition(record, "cancelled"))
    response = raw.post(f"/uploads/{upload['id']}/complete", json={"part_ids": [part["id"]]})
    assert_error(response, 409, None, "upload_id", message="concurrently")
    assert client.files.list().data == []
    assert stores.uploads.get("acme", upload["id"]).status == "cancelled"


def test_cancel_racing_a_complete_is_409_and_keeps_the_file(raw, client, stores, monkeypatch):
    upload = create(raw, size=3).json()
    part = add_part(raw, upload["id"], b"abc").json()
    first = {}  # the complete that wins, sent while our cancel is between its read and write
    _race(
        monkeypatch,
        stores.uploads,
        "transition",
        lambda _: first.setdefault("upload", client.uploads.complete(upload["id"], part_ids=[part["id"]])),
    )
    response = raw.post(f"/uploads/{upload['id']}/cancel")
    assert_error(response, 409, None, "upload_id", message="concurrently")
    file = first["upload"].file
    assert [f.id for f in client.files.list()] == [file.id]
    assert client.files.content(file.id).content == b"abc"
    assert client.uploads.complete(upload["id"], part_ids=[part["id"]]).status == "completed"


# --- hostile file names -----------------------------------------------------------------------------
@pytest.mark.parametrize("filename", ["a\r\nSet-Cookie: x=1.jsonl", "nul\u0000.jsonl", "x" * 256])
def test_an_upload_named_with_controls_or_too_long_is_400_through_the_sdk(client, stores, filename):
    with pytest.raises(openai.BadRequestError) as info:
        client.uploads.create(filename=filename, purpose="batch", bytes=3, mime_type="application/jsonl")
    assert info.value.status_code == 400 and info.value.body["param"] == "filename"
    assert info.value.body["code"] == "invalid_value"


def test_an_upload_named_with_quotes_and_any_script_keeps_its_name_and_downloads_safely(raw, client):
    name = 'say "hi" \\ 日本語 😀.jsonl'
    payload = b'{"a": 1}\n'
    upload = client.uploads.create(filename=name, purpose="batch", bytes=len(payload), mime_type="application/jsonl")
    part = client.uploads.parts.create(upload_id=upload.id, data=payload)
    done = client.uploads.complete(upload_id=upload.id, part_ids=[part.id])
    assert done.file.filename == name and client.files.retrieve(done.file.id).filename == name
    assert client.files.content(done.file.id).content == payload
    disposition = raw.get(f"/files/{done.file.id}/content", headers={"Accept": "application/binary"}).headers[
        "content-disposition"
    ]
    assert all(" " <= c <= "~" for c in disposition)
    assert disposition.startswith("attachment; filename=\"say _hi_ _ ___ _.jsonl\"; filename*=UTF-8''")
    assert unquote(disposition.split("filename*=UTF-8''", 1)[1], errors="strict") == name


# --- uploads of any size: bounded bytes per request, assembly by the assembler (docs/uploads.md) ---


@pytest.fixture
def assembler_queue(aws, monkeypatch):
    """The assembly queue (as the stack and the local deployment configure it) and a drain that
    runs the assembler Lambda's handler on it, as the event source mapping would."""
    from functions.assembler import handler as assembler_handler
    from infra.local.pollers import drain_queue

    sqs = clients.client("sqs")
    url = sqs.create_queue(QueueName="test-assembly", Attributes={"VisibilityTimeout": "900"})["QueueUrl"]
    monkeypatch.setenv("BATCHAPI_ASSEMBLY_QUEUE_URL", url)
    from functions.core import deps

    deps.reset()

    class Queue:
        def __init__(self) -> None:
            self.url = url

        def drain(self) -> int:
            return drain_queue(sqs, url, assembler_handler.handler, name="assembler")

        def depth(self) -> int:
            attributes = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["ApproximateNumberOfMessages"])
            return int(attributes["Attributes"]["ApproximateNumberOfMessages"])

    return Queue()


@pytest.fixture
def wire(assembler_queue, keys):
    """An SDK client whose every API request is measured by a WireBytes (its own local front)."""
    import threading

    from openai import OpenAI

    from functions.api import handler as api_handler
    from functions.authorizer import handler as authorizer_handler
    from infra.local.front import LocalApi, make_server

    counter = WireBytes()
    events = clients.client("s3").meta.events
    events.register("request-created.s3.*", counter.sent)
    events.register("after-call.s3.*", counter.received)
    server = make_server(LocalApi(counter.wrap(api_handler.handler), authorizer_handler.handler), "127.0.0.1", 0)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True)
    thread.start()
    sdk = sdk_client(f"http://127.0.0.1:{server.server_address[1]}/v1", keys["acme"], max_retries=0)
    yield counter, sdk
    server.shutdown()
    server.server_close()
    events.unregister("request-created.s3.*", counter.sent)
    events.unregister("after-call.s3.*", counter.received)


def test_no_api_request_moves_more_than_a_part_and_complete_moves_no_file_bytes(wire, assembler_queue, stores):
    counter, sdk = wire
    payload = os.urandom(40 * MIB + 777)  # above the 32 MiB complete assembles itself
    upload = sdk.uploads.upload_file_chunked(
        file=payload,
        filename="forty.jsonl",
        bytes=len(payload),
        mime_type="application/jsonl",
        purpose="batch",
        part_size=4 * MIB,
        md5=hashlib.md5(payload).hexdigest(),
    )
    # OpenAI's shape at once: completed, with its File; the File's bytes are still being assembled
    assert upload.status == "completed" and upload.file is not None and upload.file.bytes == len(payload)
    names = [r.name for r in counter.requests]
    assert names[0] == "POST /v1/uploads" and names[-1] == f"POST /v1/uploads/{upload.id}/complete"
    assert names.count(f"POST /v1/uploads/{upload.id}/parts") == 11
    # every request: at most one part in (base64 + envelope) and out to S3, whatever the file's size
    bound = 2 * (4 * MIB * 4 // 3) + 64 * 1024
    assert max(r.total for r in counter.requests) <= bound
    complete = counter.requests[-1]
    assert complete.moved["s3_in"] + complete.moved["s3_out"] < 64 * 1024, complete  # the manifest, no file bytes
    assert complete.total < 64 * 1024
    assert upload.file.status == "uploaded"

    # the assembler (not an API request) moves the file once in and once out
    before = dict(counter.outside)
    assert assembler_queue.drain() == 1
    moved_in = counter.outside["s3_in"] - before["s3_in"]
    moved_out = counter.outside["s3_out"] - before["s3_out"]
    assert len(payload) <= moved_in < len(payload) + 64 * 1024
    assert len(payload) <= moved_out < len(payload) + 64 * 1024
    file = sdk.files.retrieve(upload.file.id)
    assert file.status == "processed" and file.bytes == len(payload)
    record = stores.files.get("acme", file.id, now=0)
    assert b"".join(stores.objects.iter_bytes(record.s3_key)) == payload
    assert stores.objects.list_keys("uploads/") == []  # parts and manifest gone


def test_an_assembled_upload_is_not_a_batch_input_until_processed(assembler_queue, client, raw, stores):
    payload = b'{"custom_id": "a", "method": "POST", "url": "/v1/chat/completions", "body": {"model": "m"}}\n'
    payload = payload * (33 * MIB // len(payload) + 1)
    upload = client.uploads.upload_file_chunked(
        file=payload,
        filename="in.jsonl",
        bytes=len(payload),
        mime_type="application/jsonl",
        purpose="batch",
        part_size=4 * MIB,
    )
    file_id = upload.file.id
    body = {"input_file_id": file_id, "endpoint": "/v1/chat/completions", "completion_window": "24h"}
    assert_error(
        raw.post("/batches", json=body), 400, "file_not_ready", "input_file_id", message="client.files.retrieve"
    )
    assert_error(raw.get(f"/files/{file_id}/content"), 400, "file_not_ready", "file_id")
    # a complete retried while assembling answers as the first did and hands the upload over again
    again = client.uploads.complete(upload.id, part_ids=["ignored"])
    assert again.file.id == file_id and assembler_queue.depth() == 2
    assert assembler_queue.drain() == 2  # the second delivery finds the File settled: a no-op
    assert client.files.retrieve(file_id).status == "processed"
    assert stores.objects.list_keys("uploads/") == []


def test_a_large_upload_with_a_wrong_md5_ends_as_a_file_in_error(assembler_queue, client, raw, stores):
    payload = os.urandom(33 * MIB)
    upload = client.uploads.upload_file_chunked(
        file=payload,
        filename="bad.jsonl",
        bytes=len(payload),
        mime_type="application/jsonl",
        purpose="batch",
        part_size=4 * MIB,
        md5="0" * 32,
    )
    assert upload.status == "completed" and upload.file.status == "uploaded"
    assembler_queue.drain()
    file = client.files.retrieve(upload.file.id)
    assert file.status == "error" and hashlib.md5(payload).hexdigest() in file.status_details
    assert "0" * 32 in file.status_details
    assert_error(raw.get(f"/files/{file.id}/content"), 400, "file_error", "file_id", message="md5")
    body = {"input_file_id": file.id, "endpoint": "/v1/chat/completions", "completion_window": "24h"}
    assert_error(raw.post("/batches", json=body), 400, "file_error", "input_file_id")
    assert stores.objects.list_keys(f"files/acme/{upload.id}") == []  # no wrong bytes kept
    assert stores.objects.list_keys("uploads/") == []


def test_the_assemblers_last_failed_delivery_marks_the_file_error(assembler_queue, client, stores, monkeypatch):
    from functions.assembler import handler as assembler_handler

    payload = os.urandom(33 * MIB)
    upload = client.uploads.upload_file_chunked(
        file=payload,
        filename="lost.jsonl",
        bytes=len(payload),
        mime_type="application/jsonl",
        purpose="batch",
        part_size=4 * MIB,
    )
    stores.objects.delete(stores.objects.list_keys(f"uploads/acme/{upload.id}/")[0])  # a part vanished
    message = json.dumps({"tenant": "acme", "upload_id": upload.id})
    with pytest.raises(Exception):  # noqa: B017 - whichever error the missing part raises, the queue retries it
        assembler_handler.handle(message, receives=1)
    assert client.files.retrieve(upload.file.id).status == "uploaded"
    assembler_handler.handle(message, receives=3)  # the last delivery: it gives up, clearly
    file = client.files.retrieve(upload.file.id)
    assert file.status == "error" and "could not be assembled" in file.status_details


def test_without_an_assembler_a_large_complete_fails_before_creating_a_file(raw, client):
    upload = create(raw, size=33 * MIB).json()
    part_ids = [add_part(raw, upload["id"], os.urandom(n)).json()["id"] for n in (4 * MIB,) * 8 + (MIB,)]
    response = raw.post(f"/uploads/{upload['id']}/complete", json={"part_ids": part_ids})
    assert response.status_code == 500
    assert client.files.list().data == [] and client.uploads.cancel(upload["id"]).status == "cancelled"


@pytest.mark.slow
def test_a_200_mib_batch_input_and_a_512_mib_file_through_the_sdk(wire, assembler_queue, stores):
    """OpenAI's limits, end to end through the SDK's helper: a batch input of exactly 200 MiB (then
    accepted by batches.create once assembled) and a 512 MiB file; no request moves more than a part."""
    counter, sdk = wire
    line = b'{"custom_id": "r", "method": "POST", "url": "/v1/chat/completions", "body": {"model": "test-chat"}}\n'
    batch_input = (line * (200 * MIB // len(line) + 1))[: 200 * MIB - 1] + b"\n"
    assert len(batch_input) == 200 * MIB
    first = sdk.uploads.upload_file_chunked(
        file=batch_input,
        filename="input.jsonl",
        bytes=len(batch_input),
        mime_type="application/jsonl",
        purpose="batch",
        part_size=4 * MIB,
        md5=hashlib.md5(batch_input).hexdigest(),
    )
    del batch_input
    big = os.urandom(512 * MIB)
    second = sdk.uploads.upload_file_chunked(
        file=big,
        filename="weights.bin",
        bytes=len(big),
        mime_type="application/octet-stream",
        purpose="user_data",
        part_size=4 * MIB,
        md5=hashlib.md5(big).hexdigest(),
    )
    bound = 2 * (4 * MIB * 4 // 3) + 64 * 1024
    assert max(r.total for r in counter.requests) <= bound
    completes = [r for r in counter.requests if r.name.endswith("/complete")]
    assert len(completes) == 2 and all(r.total < 64 * 1024 for r in completes)
    assert assembler_queue.drain() == 2
    assert sdk.files.retrieve(second.file.id).status == "processed"
    record = stores.files.get("acme", second.file.id, now=0)
    digest = hashlib.md5()
    for chunk in stores.objects.iter_bytes(record.s3_key):
        digest.update(chunk)
    assert digest.hexdigest() == hashlib.md5(big).hexdigest()
    del big
    assert sdk.files.retrieve(first.file.id).status == "processed"
    batch = sdk.batches.create(input_file_id=first.file.id, endpoint="/v1/chat/completions", completion_window="24h")
    assert batch.status == "validating" and batch.input_file_id == first.file.id
