"""Uploads API: parts small enough for a Lambda request assemble into one byte-identical File."""

import hashlib
import os

import openai
import pytest
from openai.types import FileObject, Upload
from openai.types.uploads import UploadPart

from functions.core import limits, schema
from tests.helpers import assert_error, assert_openai_shape

MIB = 1024 * 1024


def create(raw, *, size, filename="big.jsonl", purpose="batch", **extra):
    return raw.post(
        "/uploads", json={"filename": filename, "purpose": purpose, "bytes": size, "mime_type": "application/jsonl", **extra}
    )


def add_part(raw, upload_id, data):
    return raw.post(f"/uploads/{upload_id}/parts", files={"data": ("blob", data)})


def test_twenty_megabytes_from_parts_is_byte_identical(raw, client, stores):
    payload = os.urandom(20 * MIB + 12345)
    response = create(raw, size=len(payload))
    assert response.status_code == 200, response.text
    upload = assert_openai_shape(Upload, response.json())
    assert upload.status == "pending" and upload.file is None and upload.object == "upload"
    assert upload.expires_at == upload.created_at + limits.UPLOAD_EXPIRY_SECONDS

    part_ids = []
    for start in range(0, len(payload), 4 * MIB):
        part = add_part(raw, upload.id, payload[start : start + 4 * MIB])
        assert part.status_code == 200, part.text
        parsed = assert_openai_shape(UploadPart, part.json())
        assert parsed.upload_id == upload.id and parsed.object == "upload.part"
        part_ids.append(parsed.id)
    assert len(part_ids) == 6

    done = raw.post(f"/uploads/{upload.id}/complete", json={"part_ids": part_ids, "md5": hashlib.md5(payload).hexdigest()})
    assert done.status_code == 200, done.text
    completed = assert_openai_shape(Upload, done.json())
    assert completed.status == "completed"
    file = assert_openai_shape(FileObject, done.json()["file"])
    assert file.bytes == len(payload) and file.purpose == "batch" and file.filename == "big.jsonl"
    assert file.expires_at == file.created_at + limits.BATCH_FILE_DEFAULT_EXPIRY_SECONDS
    assert client.files.retrieve(file.id) == file
    assert stores.objects.get(schema.file_key("acme", upload.id)) == payload
    # the parts are gone once assembled
    assert stores.objects.list_keys("uploads/") == []


def test_sdk_chunked_upload_helper(client, stores):
    payload = os.urandom(9 * MIB)
    upload = client.uploads.upload_file_chunked(
        file=payload, filename="chunked.jsonl", bytes=len(payload), mime_type="application/jsonl",
        purpose="batch", part_size=4 * MIB,
    )
    assert upload.status == "completed" and upload.file is not None
    record = stores.files.get("acme", upload.file.id, now=0)
    assert stores.objects.get(record.s3_key) == payload


def test_concatenate_copies_large_sources_and_coalesces_small_ones(stores):
    sizes = [6 * MIB, 1 * MIB, 2 * MIB, 6 * MIB, 3 * MIB, 1]
    blobs = [os.urandom(n) for n in sizes]
    for i, blob in enumerate(blobs):
        stores.objects.put(f"src/{i}", blob)
    stores.objects.concatenate("dest", [(f"src/{i}", n) for i, n in enumerate(sizes)])
    assert stores.objects.get("dest") == b"".join(blobs)


def test_upload_file_has_expires_after(raw, client):
    upload = create(raw, size=3, filename="n.txt", purpose="user_data", expires_after={"anchor": "created_at", "seconds": 4000}).json()
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
    assert_error(raw.post(f"/uploads/{upload['id']}/complete", json={"part_ids": [part["id"]]}), 400, "bytes_mismatch", "part_ids")


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
    assert_error(raw.post(f"/uploads/{upload['id']}/complete", json={"part_ids": [part["id"]]}), 400, "upload_not_pending", "upload_id")
    assert_error(raw.post(f"/uploads/{upload['id']}/cancel"), 400, "upload_not_pending", "upload_id")


def test_expired_upload_takes_no_parts(raw, clock):
    upload = create(raw, size=3).json()
    clock.now += limits.UPLOAD_EXPIRY_SECONDS
    assert_error(add_part(raw, upload["id"], b"abc"), 400, "upload_not_pending", "upload_id", message="expired")


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
        ({"filename": "a.csv", "purpose": "batch", "bytes": 3, "mime_type": "text/csv"}, "invalid_file_format", "bytes"),
        ({"filename": "a.jsonl", "purpose": "batch", "bytes": 0, "mime_type": "application/jsonl"}, "empty_file", "bytes"),
        ({"filename": "a.jsonl", "purpose": "batch", "bytes": limits.DEFAULT_MAX_BATCH_FILE_BYTES + 1, "mime_type": "application/jsonl"}, "file_too_large", "bytes"),
        ({"filename": "a.jsonl", "purpose": "nope", "bytes": 3, "mime_type": "application/jsonl"}, "invalid_value", "purpose"),
        ({"filename": "a.jsonl", "purpose": "batch", "mime_type": "application/jsonl"}, "missing_required_parameter", "bytes"),
        ({"filename": "a.jsonl", "purpose": "batch", "bytes": "x", "mime_type": "application/jsonl"}, "invalid_value", "bytes"),
        ({"filename": "", "purpose": "batch", "bytes": 3, "mime_type": "application/jsonl"}, "invalid_value", "filename"),
        ({"filename": "a.jsonl", "purpose": "batch", "bytes": 3, "mime_type": "application/jsonl", "expires_after": {"anchor": "created_at", "seconds": 1}}, "invalid_value", "expires_after.seconds"),
    ],
)
def test_bad_create_requests(raw, body, code, param):
    assert_error(raw.post("/uploads", json=body), 400, code, param)


@pytest.mark.parametrize("upload_id", ["upload_01m8n7xjx1bekcr5r3de2q3dfv", "nope"])
def test_unknown_upload_is_404(raw, upload_id):
    assert_error(add_part(raw, upload_id, b"abc"), 404, None, "upload_id", message=f"No such Upload object: {upload_id}")
    assert_error(raw.post(f"/uploads/{upload_id}/complete", json={"part_ids": ["p"]}), 404, None, "upload_id")
    assert_error(raw.post(f"/uploads/{upload_id}/cancel"), 404, None, "upload_id")
