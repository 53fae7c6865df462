"""The stored-bytes quota against the in-memory ports: files and uploads reserve their bytes with
their record (refused past ``max_stored_bytes`` with OpenAI's full-storage answer, nothing kept);
a delete, a TTL expiry (the reaper on the stream) and a cancel release them exactly once, however
often the release is attempted; an upload hands its reservation to its File; a batch's output
files are counted and never refused; with no ledger (governance off) nothing is counted."""

import json

import pytest

from functions.api import files, uploads
from functions.api.protocol import CompleteUploadBody, CreateUploadBody
from functions.core import schema
from functions.core.chunk_lifecycle import Signal
from functions.core.errors import StorageQuotaExceeded, Throttled
from functions.core.records import FileRecord, UploadRecord
from functions.core.settings import ModelRoute, Settings
from functions.core.tenants import TenantPolicy
from functions.reaper.logic import release_removed
from functions.workflow import logic as workflow
from tests.fakes.aws import fake_stores, throttle

NOW = 1_700_000_000
SETTINGS = Settings(table_name="t", bucket_name="b", models={"m": ModelRoute(endpoints=("/v1/chat/completions",))})


@pytest.fixture
def stores():
    stores = fake_stores()
    stores.tenants.put(TenantPolicy(tenant="acme", max_stored_bytes=100))
    return stores


def put_file(stores, size: int, tenant: str = "acme", **over):
    return files.create_file(
        stores,
        SETTINGS,
        tenant,
        filename="f.txt",
        content=b"x" * size,
        purpose="user_data",
        expires_after=None,
        now=NOW,
        **over,
    )


def image(record: FileRecord | UploadRecord) -> dict:
    """The record's item as the stream's OLD_IMAGE carries it."""
    return json.loads(json.dumps(record.to_item()))


def test_files_count_until_the_quota_then_a_400_that_keeps_nothing(stores):
    put_file(stores, 60)
    put_file(stores, 40)
    assert stores.stored.used("acme") == 100
    objects = set(stores.objects.data)
    with pytest.raises(StorageQuotaExceeded) as caught:
        put_file(stores, 1)
    error = caught.value
    assert (error.status, error.type, error.code, error.param) == (
        400,
        "invalid_request_error",
        "storage_quota_exceeded",
        None,
    )
    assert error.message.startswith("You have exceeded your file storage quota.")
    assert "limited to 100 bytes" in error.message and "holds 100 bytes" in error.message
    assert set(stores.objects.data) == objects and len(stores.files.items) == 2
    assert stores.stored.used("acme") == 100
    put_file(stores, 500, tenant="globex")  # another tenant (no quota) is not refused


def test_a_reservation_lost_to_a_concurrent_create_is_refused_and_leaves_no_bytes(stores, monkeypatch):
    put_file(stores, 90)
    # The quick pre-check sees room; a concurrent create takes it before this one's transaction.
    real = stores.stored.used
    monkeypatch.setattr(stores.stored, "used", lambda tenant: 0)
    with pytest.raises(StorageQuotaExceeded):
        put_file(stores, 20)
    monkeypatch.setattr(stores.stored, "used", real)
    assert stores.stored.used("acme") == 90 and len(stores.files.items) == 1
    assert len(stores.objects.data) == 1  # the refused file's bytes were deleted


def test_a_failing_record_write_keeps_neither_bytes_nor_a_reservation(stores):
    stores.faults.fail("files.create", throttle())
    with pytest.raises(Throttled):
        put_file(stores, 10)
    assert stores.objects.data == {} and stores.stored.used("acme") == 0


def test_delete_then_the_reaper_release_once(stores):
    kept, gone = put_file(stores, 30), put_file(stores, 50)
    record = stores.files.items[("acme", gone.id)]
    assert record.holds_storage
    files.delete_file(stores, "acme", gone.id, NOW)
    assert stores.stored.used("acme") == 30
    # The stream delivers the REMOVE (twice: at least once): nothing more is released.
    assert release_removed(stores.stored, [image(record), image(record)]) == 0
    assert stores.stored.used("acme") == 30
    assert stores.files.items[("acme", kept.id)].holds_storage


def test_a_delete_whose_release_is_throttled_succeeds_and_the_reaper_releases(stores):
    gone = put_file(stores, 50)
    record = stores.files.items[("acme", gone.id)]
    stores.faults.fail("stored.release", throttle())
    assert files.delete_file(stores, "acme", gone.id, NOW).deleted
    assert stores.stored.used("acme") == 50
    assert release_removed(stores.stored, [image(record)]) == 1
    assert stores.stored.used("acme") == 0


def test_an_expired_file_is_released_by_the_reaper_once(stores):
    put_file(stores, 70)
    (record,) = stores.files.items.values()
    del stores.files.items[(record.tenant, record.id)]  # DynamoDB's TTL removed it
    assert release_removed(stores.stored, [image(record)]) == 1
    assert release_removed(stores.stored, [image(record)]) == 0
    assert stores.stored.used("acme") == 0


def test_an_upload_reserves_its_declared_bytes_and_hands_them_to_its_file(stores):
    body = CreateUploadBody(bytes=80, filename="u.jsonl", mime_type="text/jsonl", purpose="batch")
    upload = uploads.create_upload(stores, SETTINGS, "acme", body, now=NOW)
    assert stores.stored.used("acme") == 80
    with pytest.raises(StorageQuotaExceeded):
        put_file(stores, 21)  # the pending upload's bytes count
    part = uploads.add_part(stores, SETTINGS, "acme", upload.id, data=b"{}\n" + b"x" * 77, now=NOW)
    done = uploads.complete_upload(stores, SETTINGS, "acme", upload.id, CompleteUploadBody(part_ids=[part.id]), now=NOW)
    assert stores.stored.used("acme") == 80  # the same bytes, the File's
    file = stores.files.items[("acme", done.file.id)]
    upload_record = stores.uploads.items[("acme", upload.id)]
    assert file.holds_storage and not upload_record.holds_storage
    # The upload's record goes with its TTL: it holds nothing any more.
    assert release_removed(stores.stored, [image(upload_record)]) == 0
    files.delete_file(stores, "acme", file.id, NOW)
    assert stores.stored.used("acme") == 0


def test_a_cancelled_or_expired_upload_releases_its_reservation_once(stores):
    body = CreateUploadBody(bytes=40, filename="u.jsonl", mime_type="text/jsonl", purpose="batch")
    cancelled = uploads.create_upload(stores, SETTINGS, "acme", body, now=NOW)
    expired = uploads.create_upload(stores, SETTINGS, "acme", body, now=NOW)
    uploads.cancel_upload(stores, "acme", cancelled.id, now=NOW)
    assert stores.stored.used("acme") == 40
    records = [stores.uploads.items[("acme", u.id)] for u in (cancelled, expired)]
    assert release_removed(stores.stored, [image(r) for r in records]) == 1  # only the expired one's
    assert stores.stored.used("acme") == 0


def test_a_batch_s_output_files_are_counted_even_past_the_quota(stores):
    from tests.unit.test_workflow_logic import run_chunk, setup

    batch_stores = setup(lines=4)
    batch_stores.tenants.put(TenantPolicy(tenant="acme", max_stored_bytes=1))
    run_chunk(batch_stores, 0)
    run_chunk(batch_stores, 1)
    assert workflow.finalize(batch_stores, "acme", "batch_1", Signal.COMPLETE, NOW) == {"status": "completed"}
    batch = batch_stores.batches.get("acme", "batch_1")
    output = batch_stores.files.items[("acme", batch.output_file_id)]
    assert output.holds_storage and batch_stores.stored.used("acme") == output.bytes > 1
    workflow.finalize(batch_stores, "acme", "batch_1", Signal.COMPLETE, NOW + 1)  # retried: counted once
    assert batch_stores.stored.used("acme") == output.bytes


def test_without_a_ledger_nothing_is_counted_or_held():
    stores = fake_stores(track_storage=False)  # governance off: no ledger and no policy either
    stored = put_file(stores, 50)
    assert not stores.files.items[("acme", stored.id)].holds_storage
    assert stores.stored.counters == {} and stores.stored.markers == {}
    files.delete_file(stores, "acme", stored.id, NOW)
    assert stores.faults.calls["stored.release"] == 0


def test_the_ledger_lives_in_the_tenant_s_storage_partition():
    assert schema.stored_pk("acme") == "T#acme#STORAGE"
    assert schema.stored_marker_sk(FileRecord.sort_key("file-1")) == "HOLD#FILE#file-1"
