"""The port contracts of key management, the request counter and the stored-bytes ledger, on both
sides (the adapters on moto, the fakes): a key's listing and id go with it, a disabled tenant gets
no key, the request counter stops at its limit, a reservation is refused past the quota and a
release happens once, an upload's reservation moves to its File, output files are charged without
a condition (``tests/integration/test_port_contracts.py`` for the others)."""

import pytest

from functions.core import auth, lifecycle
from functions.core.errors import ConditionFailed
from functions.core.ports import Stores
from functions.core.records import ApiKeyRecord, FileRecord, UploadRecord
from functions.core.tenants import TenantPolicy
from tests.fakes.aws import fake_stores
from tests.integration.test_port_contracts import new_batch


@pytest.fixture(params=["moto", "fake"])
def ports(request: pytest.FixtureRequest) -> Stores:
    if request.param == "fake":
        return fake_stores()
    return request.getfixturevalue("stores")


def key(name: str, tenant: str = "acme") -> ApiKeyRecord:
    return ApiKeyRecord(key_hash=auth.hash_key(name), tenant=tenant, created_at=3, hint=name[-4:])


def test_a_key_is_created_listed_found_by_id_and_deleted_with_its_listing(ports: Stores):
    first, second = key("sk-one"), key("sk-two")
    ports.keys.create(first)
    ports.keys.create(second)
    with pytest.raises(ConditionFailed):
        ports.keys.create(first)
    assert {r.id for r in ports.keys.list("acme")} == {first.id, second.id}
    assert ports.keys.list("globex") == []
    assert ports.keys.get_by_id(first.id) == first
    assert ports.keys.delete(first.key_hash) == first
    assert ports.keys.delete(first.key_hash) is None
    assert ports.keys.get_by_id(first.id) is None
    assert [r.id for r in ports.keys.list("acme")] == [second.id]


def test_a_disabled_tenant_gets_no_key_and_its_keys_are_marked(ports: Stores):
    ports.keys.create(key("sk-one"))
    ports.tenants.put(TenantPolicy(tenant="acme", disabled=True))
    with pytest.raises(ConditionFailed):
        ports.keys.create(key("sk-two"))
    assert ports.keys.get(auth.hash_key("sk-two")) is None and len(ports.keys.list("acme")) == 1
    ports.keys.create(key("sk-three", "globex"))  # another tenant: unaffected
    (listed,) = ports.keys.list("acme")
    assert ports.keys.set_disabled(listed, True)
    assert ports.keys.get(listed.key_hash).disabled and ports.keys.list("acme")[0].status == "disabled"
    assert ports.keys.set_disabled(listed, False)
    assert not ports.keys.get(listed.key_hash).disabled
    ports.keys.delete(listed.key_hash)
    assert not ports.keys.set_disabled(listed, True)  # gone: nothing is created


def test_the_request_counter_stops_at_its_limit_per_window_and_tenant(ports: Stores):
    assert [ports.tenants.count_request("acme", 60, limit=2, expires_at=999) for _ in range(3)] == [True, True, False]
    assert ports.tenants.count_request("acme", 120, limit=2, expires_at=999)
    assert ports.tenants.count_request("globex", 60, limit=2, expires_at=999)
    assert not ports.tenants.count_request("acme", 60, limit=0, expires_at=999)


def file(file_id: str, size: int) -> FileRecord:
    return FileRecord(
        tenant="acme",
        id=file_id,
        filename="f",
        purpose="user_data",
        bytes=size,
        created_at=1,
        s3_key=f"files/acme/{file_id}",
    )


def test_stored_bytes_are_reserved_within_the_quota_and_released_once(ports: Stores):
    ports.files.create(file("file-a", 60), max_stored_bytes=100)
    with pytest.raises(ConditionFailed):
        ports.files.create(file("file-b", 41), max_stored_bytes=100)
    assert ports.files.get("acme", "file-b", 0) is None  # refused: no record either
    ports.files.create(file("file-c", 40), max_stored_bytes=100)
    assert ports.stored.used("acme") == 100 and ports.stored.used("globex") == 0
    assert ports.files.get("acme", "file-a", 0).holds_storage
    assert ports.stored.release("acme", FileRecord.sort_key("file-a"), 60)
    assert not ports.stored.release("acme", FileRecord.sort_key("file-a"), 60)
    assert not ports.stored.release("acme", FileRecord.sort_key("never"), 5)
    assert ports.stored.used("acme") == 40


def upload(upload_id: str, size: int) -> UploadRecord:
    return UploadRecord(
        tenant="acme",
        id=upload_id,
        filename="u.jsonl",
        purpose="batch",
        bytes=size,
        mime_type="text/jsonl",
        created_at=1,
        expires_at=3601,
    )


def test_an_upload_hands_its_reservation_to_its_file(ports: Stores):
    ports.uploads.create(upload("upload_a", 30), max_stored_bytes=50)
    with pytest.raises(ConditionFailed):
        ports.uploads.create(upload("upload_b", 21), max_stored_bytes=50)
    pending = ports.uploads.get("acme", "upload_a")
    assert pending.holds_storage
    ports.uploads.complete(pending, file("file-u", 30))
    assert ports.stored.used("acme") == 30
    assert ports.files.get("acme", "file-u", 0).holds_storage
    assert not ports.uploads.get("acme", "upload_a").holds_storage
    assert not ports.stored.release("acme", UploadRecord.sort_key("upload_a"), 30)  # moved, not the upload's
    assert ports.stored.release("acme", FileRecord.sort_key("file-u"), 30)
    assert ports.stored.used("acme") == 0


def test_output_files_are_charged_with_the_batch_s_finish_without_a_condition(ports: Stores):
    ports.files.create(file("file-a", 10), max_stored_bytes=10)  # the tenant is at its quota
    ports.batches.create(new_batch(status="finalizing", accepting=False))
    outputs = [file("file-o", 25), file("file-e", 5)]
    finish = lifecycle.finish(1, status="completed", closed_from="finalizing", values={})
    ports.batches.transition("acme", "batch_c1", finish, files=outputs)
    assert ports.stored.used("acme") == 40
    assert all(ports.files.get("acme", f.id, 0).holds_storage for f in outputs)
    with pytest.raises(ConditionFailed):  # a second finish writes nothing, charges nothing
        ports.batches.transition("acme", "batch_c1", finish, files=outputs)
    assert ports.stored.used("acme") == 40
