"""Files, Uploads, Batches and Models logic (functions/api) against the in-memory ports: what is
written in which order, what a lost race or a failing store leaves behind."""

import hashlib

import pytest

from functions.api import batches, files, models, uploads
from functions.api.protocol import CompleteUploadBody, CreateBatchBody, CreateUploadBody, ExpiresAfter, FileListQuery
from functions.core import schema
from functions.core.errors import Conflict, InvalidRequest, NotFound, Throttled
from functions.core.settings import ModelRoute, Settings
from tests.fakes.aws import fake_stores, throttle

NOW = 1_700_000_000
SETTINGS = Settings(
    table_name="t",
    bucket_name="b",
    inline_content_limit=10,
    allowed_endpoints=("/v1/chat/completions",),
    models={"m": ModelRoute(endpoints=("/v1/chat/completions",))},
)
CHAT = "/v1/chat/completions"


@pytest.fixture
def stores():
    return fake_stores()


def new_file(stores, content=b"{}\n", purpose="batch", name="in.jsonl", expires_after=None):
    return files.create_file(
        stores, SETTINGS, "acme", filename=name, content=content, purpose=purpose, expires_after=expires_after, now=NOW
    )


# --- files --------------------------------------------------------------------------------------
def test_file_expiry_defaults():
    stores = fake_stores()
    assert new_file(stores).expires_at == NOW + 30 * 86_400
    assert new_file(stores, purpose="user_data", name="x.bin").expires_at is None
    chosen = new_file(stores, expires_after=ExpiresAfter(anchor="created_at", seconds=7_200))
    assert chosen.expires_at == NOW + 7_200


@pytest.mark.parametrize("name", ["a\r\nb.jsonl", "nul\x00.jsonl", "x" * 256])
def test_a_file_with_an_unsafe_name_is_400_and_stores_nothing(stores, name):
    with pytest.raises(InvalidRequest) as info:
        new_file(stores, name=name)
    assert info.value.param == "filename" and info.value.status == 400
    assert stores.objects.list_keys("") == [] and files.list_files(stores, "acme", FileListQuery(), now=NOW).data == []


def test_a_file_name_with_quotes_and_any_script_is_kept_exactly(stores):
    name = 'say "hi" \\ 日本語.jsonl'
    assert new_file(stores, name=name).filename == name


def test_a_file_whose_record_fails_leaves_no_bytes(stores):
    stores.faults.fail("files.create", throttle())
    with pytest.raises(Throttled):
        new_file(stores)
    assert stores.objects.data == {}
    assert stores.files.items == {}


def test_a_file_whose_bytes_fail_has_no_record(stores):
    stores.faults.fail("objects.put", TimeoutError())
    with pytest.raises(TimeoutError):
        new_file(stores)
    assert stores.files.items == {}


def test_content_inline_up_to_the_limit_then_a_presigned_redirect(stores):
    small = new_file(stores, content=b"x" * 10, purpose="user_data", name="s")
    large = new_file(stores, content=b"x" * 11, purpose="user_data", name="l")
    inline = files.get_file_content(stores, SETTINGS, "acme", small.id, NOW)
    assert (inline.body, inline.redirect) == (b"x" * 10, None)
    redirect = files.get_file_content(stores, SETTINGS, "acme", large.id, NOW)
    assert redirect.body is None and schema.file_key("acme", large.id) in redirect.redirect
    assert "expires=300" in redirect.redirect  # presigned for 5 minutes by default


def test_a_file_deleted_concurrently_is_404_and_keeps_no_bytes_of_its_own(stores, monkeypatch):
    f = new_file(stores)
    delete = stores.files.delete

    def lost(tenant, file_id):
        delete(tenant, file_id)  # another request deletes it first
        return None

    monkeypatch.setattr(stores.files, "delete", lost)
    with pytest.raises(NotFound):
        files.delete_file(stores, "acme", f.id, NOW)


def test_expired_file_is_gone_from_every_call(stores):
    f = new_file(stores, expires_after=ExpiresAfter(anchor="created_at", seconds=3_600))
    later = NOW + 3_600
    for call in (files.get_file, files.delete_file):
        with pytest.raises(NotFound):
            call(stores, "acme", f.id, later)
    with pytest.raises(NotFound):
        files.get_file_content(stores, SETTINGS, "acme", f.id, later)
    assert files.get_file(stores, "acme", f.id, later - 1).id == f.id


# --- uploads -------------------------------------------------------------------------------------
def new_upload(stores, size, **over):
    body = CreateUploadBody(
        **{"filename": "big.jsonl", "purpose": "batch", "bytes": size, "mime_type": "text/plain", **over}
    )
    return uploads.create_upload(stores, SETTINGS, "acme", body, now=NOW)


def add_parts(stores, upload_id, blobs):
    return [uploads.add_part(stores, SETTINGS, "acme", upload_id, data=b, now=NOW).id for b in blobs]


def complete(stores, upload_id, part_ids, md5=None, now=NOW):
    return uploads.complete_upload(
        stores, SETTINGS, "acme", upload_id, CompleteUploadBody(part_ids=part_ids, md5=md5), now=now
    )


def test_upload_lives_one_hour_and_its_file_takes_the_batch_default(stores):
    upload = new_upload(stores, 6)
    assert upload.expires_at == NOW + 3_600
    parts = add_parts(stores, upload.id, [b"abc", b"def"])
    done = complete(stores, upload.id, parts[::-1], md5=hashlib.md5(b"defabc").hexdigest())
    assert done.status == "completed" and done.file.expires_at == NOW + 30 * 86_400
    assert stores.objects.data[schema.file_key("acme", upload.id)] == b"defabc"  # in the listed order
    assert stores.objects.list_keys("uploads/") == []  # parts gone once assembled


def test_ten_thousand_parts_is_the_limit(stores):
    upload = new_upload(stores, 10_000)
    parts = add_parts(stores, upload.id, [b"x"] * 10_000)
    with pytest.raises(InvalidRequest) as info:
        complete(stores, upload.id, [*parts, "part_01m8n7xjx1bekcr5r3de2q3dfv"])
    assert (info.value.param, info.value.code) == ("part_ids", "invalid_value")
    assert "at most 10000 parts" in info.value.message
    assert complete(stores, upload.id, parts).file.bytes == 10_000


def test_wrong_md5_removes_the_assembled_object_and_keeps_the_upload_pending(stores):
    upload = new_upload(stores, 3)
    parts = add_parts(stores, upload.id, [b"abc"])
    with pytest.raises(InvalidRequest) as info:
        complete(stores, upload.id, parts, md5="0" * 32)
    assert info.value.code == "md5_mismatch"
    assert schema.file_key("acme", upload.id) not in stores.objects.data
    assert stores.uploads.get("acme", upload.id).status == "pending"
    assert stores.files.items == {}


def test_retried_complete_answers_as_the_first(stores):
    upload = new_upload(stores, 3)
    parts = add_parts(stores, upload.id, [b"abc"])
    first = complete(stores, upload.id, parts)
    assert complete(stores, upload.id, parts) == first
    assert len(stores.files.items) == 1


def test_complete_losing_to_a_cancel_is_a_conflict(stores, monkeypatch):
    upload = new_upload(stores, 3)
    parts = add_parts(stores, upload.id, [b"abc"])
    finish = stores.uploads.complete

    def cancelled_meanwhile(record, file):
        stores.uploads.transition(record, "cancelled")
        return finish(record, file)

    monkeypatch.setattr(stores.uploads, "complete", cancelled_meanwhile)
    with pytest.raises(Conflict) as info:
        complete(stores, upload.id, parts)
    assert info.value.status == 409 and info.value.param == "upload_id"
    assert stores.files.items == {}
    assert stores.uploads.get("acme", upload.id).status == "cancelled"


def test_cancel_losing_to_a_complete_is_a_conflict_and_keeps_the_file(stores, monkeypatch):
    upload = new_upload(stores, 3)
    parts = add_parts(stores, upload.id, [b"abc"])
    transition = stores.uploads.transition

    def completed_meanwhile(record, status, **values):
        monkeypatch.setattr(stores.uploads, "transition", transition)
        complete(stores, upload.id, parts)
        return transition(record, status, **values)

    monkeypatch.setattr(stores.uploads, "transition", completed_meanwhile)
    with pytest.raises(Conflict):
        uploads.cancel_upload(stores, "acme", upload.id, now=NOW)
    (file,) = stores.files.items.values()
    assert stores.objects.data[file.s3_key] == b"abc"
    assert stores.uploads.get("acme", upload.id).status == "completed"


def test_an_expired_upload_takes_nothing(stores):
    upload = new_upload(stores, 3)
    parts = add_parts(stores, upload.id, [b"abc"])
    expired = NOW + 3_600
    for attempt in (
        lambda: uploads.add_part(stores, SETTINGS, "acme", upload.id, data=b"x", now=expired),
        lambda: complete(stores, upload.id, parts, now=expired),
        lambda: uploads.cancel_upload(stores, "acme", upload.id, now=expired),
    ):
        with pytest.raises(InvalidRequest) as info:
            attempt()
        assert info.value.code == "upload_not_pending" and "expired" in info.value.message
    assert stores.files.items == {}


def test_batch_upload_size_limit_is_200_mib(stores):
    assert new_upload(stores, 200 * 1024 * 1024).bytes == 200 * 1024 * 1024
    with pytest.raises(InvalidRequest) as info:
        new_upload(stores, 200 * 1024 * 1024 + 1)
    assert (info.value.code, info.value.param) == ("file_too_large", "bytes")


# --- batches --------------------------------------------------------------------------------------
def new_batch(stores, **over):
    f = new_file(stores)
    body = CreateBatchBody(**{"input_file_id": f.id, "endpoint": CHAT, "completion_window": "24h", **over})
    return batches.create_batch(stores, SETTINGS, "acme", body, now=NOW)


def test_batch_snapshots_its_input_and_expires_after_its_window(stores):
    batch = new_batch(stores, metadata={"k": "v"}, output_expires_after={"anchor": "created_at", "seconds": 7_200})
    assert batch.status == "validating" and batch.expires_at == NOW + 86_400 and batch.metadata == {"k": "v"}
    record = stores.batches.get("acme", batch.id)
    assert record.output_expires_after == 7_200
    assert stores.objects.data[schema.batch_input_key("acme", batch.id)] == b"{}\n"


def test_a_batch_whose_snapshot_fails_is_never_visible(stores):
    stores.faults.fail("objects.copy", throttle())
    with pytest.raises(Throttled):
        new_batch(stores)
    assert stores.batches.list("acme", after=None, limit=10) == ([], False)


@pytest.mark.parametrize(
    ("change", "param"),
    [({"endpoint": "/v1/embeddings"}, "endpoint"), ({"completion_window": "48h"}, "completion_window")],
)
def test_endpoint_and_window_come_from_the_settings(stores, change, param):
    with pytest.raises(InvalidRequest) as info:
        new_batch(stores, **change)
    assert info.value.param == param
    assert stores.objects.list_keys("batches/") == []


def set_status(stores, batch_id, status, token="token-1"):
    stores.batches.set("acme", batch_id, status=status, task_token=token)


@pytest.mark.parametrize("status", ["validating", "in_progress"])
def test_cancel_moves_to_cancelling_and_signals(stores, status):
    batch = new_batch(stores)
    set_status(stores, batch.id, status)
    cancelled = batches.cancel_batch(stores, "acme", batch.id, now=NOW + 5)
    assert cancelled.status == "cancelling" and cancelled.cancelling_at == NOW + 5
    assert stores.workflows.signals == [("token-1", {"outcome": "cancel"})]


def test_cancel_when_the_workflow_no_longer_waits_still_cancels(stores):
    batch = new_batch(stores)
    set_status(stores, batch.id, "in_progress")
    stores.workflows.closed.add("token-1")
    assert batches.cancel_batch(stores, "acme", batch.id, now=NOW).status == "cancelling"


@pytest.mark.parametrize("status", ["cancelling", "finalizing", "completed", "failed", "expired", "cancelled"])
def test_cancel_returns_a_finalizing_or_terminal_batch_unchanged(stores, status):
    batch = new_batch(stores)
    set_status(stores, batch.id, status)
    before = batches.get_batch(stores, "acme", batch.id)
    assert batches.cancel_batch(stores, "acme", batch.id, now=NOW) == before
    assert batches.get_batch(stores, "acme", batch.id) == before
    assert stores.workflows.signals == []
    assert stores.faults.calls["batches.transition"] == 0  # nothing written (set_status is setup)


def test_cancel_losing_its_conditional_write_returns_the_batch_as_it_is(stores, monkeypatch):
    batch = new_batch(stores)
    set_status(stores, batch.id, "in_progress")
    transition = stores.batches.transition

    def expired_meanwhile(tenant, batch_id, change, **kwargs):
        stores.batches.set(tenant, batch_id, status="finalizing", finalizing_at=NOW + 1)
        return transition(tenant, batch_id, change, **kwargs)

    monkeypatch.setattr(stores.batches, "transition", expired_meanwhile)
    answer = batches.cancel_batch(stores, "acme", batch.id, now=NOW + 2)
    assert (answer.status, answer.finalizing_at, answer.cancelling_at) == ("finalizing", NOW + 1, None)
    assert stores.workflows.signals == []


def test_another_tenants_batch_is_not_found(stores):
    batch = new_batch(stores)
    for call in (batches.get_batch, lambda s, t, b: batches.cancel_batch(s, t, b, now=NOW)):
        with pytest.raises(NotFound) as info:
            call(stores, "globex", batch.id)
        assert info.value.param == "batch_id"
    assert stores.batches.get("acme", batch.id).status == "validating"


# --- models ---------------------------------------------------------------------------------------
def test_models_are_the_served_ones():
    settings = SETTINGS.model_copy(
        update={"models": {"b": ModelRoute(endpoints=(CHAT,)), "a": ModelRoute(endpoints=(CHAT,))}}
    )
    listed = models.list_models(settings, created=7)
    assert listed == {
        "object": "list",
        "data": [
            {"id": "a", "object": "model", "created": 7, "owned_by": "batch-api"},
            {"id": "b", "object": "model", "created": 7, "owned_by": "batch-api"},
        ],
    }
    assert models.get_model(settings, "a", created=7).id == "a"
    with pytest.raises(NotFound) as info:
        models.get_model(settings, "gpt-x", created=7)
    assert info.value.param == "model"
