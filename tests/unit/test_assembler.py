"""The upload assembler's logic on the fakes (docs/uploads.md): a store failure mid-assembly leaves
no object and the File ``uploaded`` for the redelivery; a lost message is sent again by a retried
complete; a duplicate changes nothing; parts are joined in ``part_ids`` order, not arrival order."""

import hashlib
import json
import os

import pytest

from functions.api import uploads
from functions.api.protocol import CompleteUploadBody, CreateUploadBody
from functions.core import schema
from functions.core.errors import Throttled
from functions.core.settings import Settings
from tests.fakes.aws import fake_stores, throttle

MIB = 1024 * 1024
NOW = 1_700_000_000
QUEUE = "fake://assembly"
SETTINGS = Settings(table_name="t", bucket_name="b", assembly_queue_url=QUEUE)


def large_upload(stores, blobs: list[bytes], *, order=None, md5: str | None = None):
    """An upload of ``blobs`` (over 32 MiB in all) completed with the parts in ``order``."""
    body = CreateUploadBody(filename="in.jsonl", purpose="batch", bytes=sum(map(len, blobs)), mime_type="text/plain")
    upload = uploads.create_upload(stores, SETTINGS, "acme", body, now=NOW)
    ids = [uploads.add_part(stores, SETTINGS, "acme", upload.id, data=b, now=NOW).id for b in blobs]
    listed = [ids[i] for i in (order or range(len(ids)))]
    done = uploads.complete_upload(
        stores, SETTINGS, "acme", upload.id, CompleteUploadBody(part_ids=listed, md5=md5), now=NOW
    )
    return upload.id, done, listed


def messages(stores) -> list[dict]:
    return [json.loads(m.body) for m in stores.queues.queue(QUEUE).messages]


def test_parts_are_joined_in_the_listed_order_and_the_file_settles():
    stores = fake_stores()
    blobs = [os.urandom(4 * MIB) for _ in range(8)] + [os.urandom(3 * MIB)]
    order = [8, *range(8)]  # the last part sent is listed first
    joined = b"".join(blobs[i] for i in order)
    upload_id, done, _ = large_upload(stores, blobs, order=order, md5=hashlib.md5(joined).hexdigest())
    assert done.status == "completed" and done.file.status == "uploaded"
    assert schema.file_key("acme", upload_id) not in stores.objects.data  # nothing assembled in the request
    assert messages(stores) == [{"tenant": "acme", "upload_id": upload_id}]
    result = uploads.assemble(stores, "acme", upload_id, now=NOW)
    assert (result.outcome, result.bytes) == ("processed", len(joined))
    assert stores.objects.data[schema.file_key("acme", upload_id)] == joined
    assert stores.files.get("acme", done.file.id, NOW).status == "processed"
    assert [k for k in stores.objects.data if k.startswith("uploads/")] == []


@pytest.mark.parametrize("op", ["a part's read", "objects.writer.write", "objects.writer.complete"])
def test_a_store_failure_mid_assembly_leaves_no_object_and_the_redelivery_finishes(op, monkeypatch):
    stores = fake_stores()
    blobs = [os.urandom(4 * MIB) for _ in range(9)]
    upload_id, done, _ = large_upload(stores, blobs)
    if op == "a part's read":  # the manifest and the first parts read fine, the 5th part fails
        real, calls = stores.objects.get, []

        def flaky(key):
            calls.append(key)
            if len(calls) == 6:
                raise throttle()
            return real(key)

        monkeypatch.setattr(stores.objects, "get", flaky)
    else:
        stores.faults.fail(op, throttle())
    with pytest.raises(Throttled):
        uploads.assemble(stores, "acme", upload_id, now=NOW)
    assert schema.file_key("acme", upload_id) not in stores.objects.data
    assert stores.files.get("acme", done.file.id, NOW).status == "uploaded"
    monkeypatch.undo()
    assert uploads.assemble(stores, "acme", upload_id, now=NOW).outcome == "processed"
    assert stores.objects.data[schema.file_key("acme", upload_id)] == b"".join(blobs)


def test_a_lost_message_is_sent_again_by_a_retried_complete_and_a_duplicate_is_a_no_op():
    stores = fake_stores()
    stores.queues.queue(QUEUE).drop_next()
    blobs = [os.urandom(4 * MIB) for _ in range(9)]
    upload_id, done, listed = large_upload(stores, blobs)
    assert messages(stores) == []  # lost
    again = uploads.complete_upload(
        stores, SETTINGS, "acme", upload_id, CompleteUploadBody(part_ids=listed), now=NOW + 5
    )
    assert again.file.id == done.file.id and len(messages(stores)) == 1
    assert uploads.assemble(stores, "acme", upload_id, now=NOW).outcome == "processed"
    assert uploads.assemble(stores, "acme", upload_id, now=NOW).outcome == "skipped"  # a duplicate delivery
    assert stores.objects.data[schema.file_key("acme", upload_id)] == b"".join(blobs)
    # once processed, a retried complete sends nothing more
    uploads.complete_upload(stores, SETTINGS, "acme", upload_id, CompleteUploadBody(part_ids=listed), now=NOW + 9)
    assert len(messages(stores)) == 1


def test_a_small_upload_is_assembled_in_the_request_and_a_wrong_md5_is_a_400():
    from functions.core.errors import InvalidRequest

    stores = fake_stores()
    blobs = [os.urandom(4 * MIB), os.urandom(MIB)]
    with pytest.raises(InvalidRequest) as info:
        large_upload(stores, blobs, md5="0" * 32)
    assert info.value.code == "md5_mismatch"
    assert messages(stores) == [] and not any(k.startswith("files/") for k in stores.objects.data)
