"""The running deployment (locally ``python -m infra.local``; a deployed stack with
``BATCHAPI_E2E_TARGET=aws``, tests/e2e/target.py), driven only with the official openai SDK.

Every response body is validated with the SDK's own types, strictly: no field OpenAI's type lacks
(at any depth), every field it declares present (OpenAI sends ``null`` rather than leaving one out).
"""

import hashlib
import random
import re
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import unquote

import openai
import pytest
from openai import OpenAI
from openai.types import FileDeleted, FileObject, Upload
from openai.types.uploads import UploadPart
from pydantic import BaseModel

from functions.core import limits
from infra import names

from .conftest import LocalDeployment, port_open
from .target import Deployment, eventually

pytestmark = pytest.mark.e2e

M = TypeVar("M", bound=BaseModel)
LIST_FIELDS = {"object", "data", "first_id", "last_id", "has_more"}
ERROR_FIELDS = {"message", "type", "param", "code"}
BATCH_LINES = b"".join(
    b'{"custom_id": "r%d", "method": "POST", "url": "/v1/chat/completions", '
    b'"body": {"model": "m", "messages": [{"role": "user", "content": "hi"}]}}\n' % i
    for i in range(3)
)


def exact(model: type[M], raw: Any) -> M:
    """``raw`` as the SDK type ``model``, refusing extra fields and requiring all declared ones."""
    parsed = model.model_validate(raw, extra="forbid", strict=True)
    _all_fields_present(parsed, raw)
    return parsed


def _all_fields_present(parsed: BaseModel, raw: dict[str, Any]) -> None:
    assert set(raw) == set(type(parsed).model_fields), f"{type(parsed).__name__} fields: {sorted(raw)}"
    for name in type(parsed).model_fields:
        value = getattr(parsed, name)
        if isinstance(value, BaseModel):
            _all_fields_present(value, raw[name])


def exact_list(model: type[M], raw: Any) -> list[M]:
    """OpenAI's list envelope with items of ``model``."""
    assert set(raw) == LIST_FIELDS and raw["object"] == "list"
    assert isinstance(raw["has_more"], bool)
    items = [exact(model, item) for item in raw["data"]]
    ids = [item.id for item in items]  # type: ignore[attr-defined]
    assert (raw["first_id"], raw["last_id"]) == ((ids[0], ids[-1]) if ids else (None, None))
    return items


def exact_error(exc: openai.APIStatusError, status: int, code: str | None = None) -> dict[str, Any]:
    """The OpenAI error envelope, exactly."""
    assert exc.status_code == status
    body = exc.response.json()
    assert set(body) == {"error"} and set(body["error"]) == ERROR_FIELDS
    assert isinstance(body["error"]["message"], str) and body["error"]["message"]
    if code is not None:
        assert body["error"]["code"] == code == exc.code
    return body["error"]


def body(raw_response: Any) -> Any:
    return raw_response.http_response.json()


def payload(size: int, seed: int) -> bytes:
    return random.Random(seed).randbytes(size)


# --- The process ------------------------------------------------------------------------------
@pytest.mark.local_only("reads the local deployment's ready line, log and state file")
def test_ready_line_and_state_file(local: LocalDeployment) -> None:
    assert local.base_url == f"http://127.0.0.1:{local.api_port}/v1"
    log = local.log()
    assert local.base_url in log and names.LOCAL_KEY in log
    assert log.count("READY ") == 1
    state = local.state
    assert state.api_base_url == local.base_url
    assert state.moto_endpoint == f"http://127.0.0.1:{local.moto_port}"
    assert (state.table_name, state.bucket_name) == (names.LOCAL_TABLE, names.LOCAL_BUCKET)
    assert state.pid == local.process.pid


# --- Files ------------------------------------------------------------------------------------
def test_file_lifecycle(client: OpenAI) -> None:
    created = exact(
        FileObject, body(client.files.with_raw_response.create(file=("input.jsonl", BATCH_LINES), purpose="batch"))
    )
    assert created.id.startswith("file-")
    assert (created.object, created.purpose, created.filename, created.status) == (
        "file",
        "batch",
        "input.jsonl",
        "processed",
    )
    assert created.bytes == len(BATCH_LINES)
    assert created.expires_at == created.created_at + limits.BATCH_FILE_DEFAULT_EXPIRY_SECONDS

    assert exact(FileObject, body(client.files.with_raw_response.retrieve(created.id))) == created
    listed = exact_list(FileObject, body(client.files.with_raw_response.list()))
    assert created in listed

    content = client.files.with_raw_response.content(created.id)
    assert content.http_response.history == []  # small: inline, no redirect
    assert content.http_response.content == BATCH_LINES

    deleted = exact(FileDeleted, body(client.files.with_raw_response.delete(created.id)))
    assert (deleted.id, deleted.object, deleted.deleted) == (created.id, "file", True)

    for call in (client.files.retrieve, client.files.content, client.files.delete):
        with pytest.raises(openai.NotFoundError) as info:
            call(created.id)
        exact_error(info.value, 404)
    assert created.id not in [f.id for f in client.files.list()]


def test_file_with_expiry_and_other_purpose(client: OpenAI) -> None:
    created = exact(
        FileObject,
        body(
            client.files.with_raw_response.create(
                file=("notes.txt", b"hello"),
                purpose="user_data",
                expires_after={"anchor": "created_at", "seconds": 3600},
            )
        ),
    )
    assert created.purpose == "user_data"
    assert created.expires_at == created.created_at + 3600
    never = exact(FileObject, body(client.files.with_raw_response.create(file=("n.txt", b"x"), purpose="user_data")))
    assert never.expires_at is None


def test_list_pages_in_both_orders_and_filters_by_purpose(fresh_client: OpenAI) -> None:
    client = fresh_client
    created = [
        client.files.create(file=(f"f{i}.jsonl", BATCH_LINES), purpose="batch")
        if i % 2 == 0
        else client.files.create(file=(f"f{i}.txt", b"text %d" % i), purpose="user_data")
        for i in range(5)
    ]
    ids = [f.id for f in created]

    for order, expected in (("asc", ids), ("desc", ids[::-1])):
        seen, after, pages = [], None, 0
        while True:
            kwargs = {"after": after} if after else {}
            page = body(client.files.with_raw_response.list(limit=2, order=order, **kwargs))
            items = exact_list(FileObject, page)
            seen += [f.id for f in items]
            pages += 1
            if not page["has_more"]:
                break
            after = page["last_id"]
        assert seen == expected
        assert pages == 3
        assert [f.id for f in client.files.list(limit=2, order=order)] == expected  # the SDK's auto-paging

    assert [f.id for f in client.files.list()] == ids[::-1]  # default: newest first
    assert [f.id for f in client.files.list(purpose="batch", order="asc")] == ids[0::2]
    assert [f.id for f in client.files.list(purpose="user_data", order="asc")] == ids[1::2]


def test_bad_requests_are_openai_errors(client: OpenAI) -> None:
    cases = [
        lambda: client.files.create(file=("input.jsonl", b""), purpose="batch"),  # empty
        lambda: client.files.create(file=("a.txt", b"x"), purpose="nonsense"),  # type: ignore[arg-type]
        lambda: client.files.list(limit=0),
        lambda: client.files.list(order="sideways"),  # type: ignore[arg-type]
    ]
    for case in cases:
        with pytest.raises(openai.BadRequestError) as info:
            case()
        assert exact_error(info.value, 400)["type"] == "invalid_request_error"


def test_a_batch_file_is_judged_by_its_content_not_its_name(client: OpenAI) -> None:
    """What OpenAI stores: curator's raw bytes (multipart name `upload`), data.txt, no final newline."""
    for name, data in [("upload", BATCH_LINES), ("input.txt", BATCH_LINES.rstrip(b"\n"))]:
        stored = client.files.create(file=(name, data), purpose="batch")
        assert (stored.filename, stored.bytes, stored.purpose) == (name, len(data), "batch")
        assert client.files.content(stored.id).read() == data


# --- Uploads ----------------------------------------------------------------------------------
def test_upload_in_parts_becomes_a_file(client: OpenAI) -> None:
    parts = [payload(300_000, seed) for seed in range(3)]
    data = b"".join(parts)
    upload = exact(
        Upload,
        body(
            client.uploads.with_raw_response.create(
                bytes=len(data),
                filename="parts.bin",
                mime_type="application/octet-stream",
                purpose="user_data",
            )
        ),
    )
    assert (upload.status, upload.object, upload.bytes, upload.file) == ("pending", "upload", len(data), None)

    part_ids = []
    for part in parts:
        created = exact(UploadPart, body(client.uploads.parts.with_raw_response.create(upload.id, data=part)))
        assert (created.object, created.upload_id) == ("upload.part", upload.id)
        part_ids.append(created.id)

    completed = exact(
        Upload,
        body(
            client.uploads.with_raw_response.complete(
                upload.id,
                part_ids=part_ids,
                md5=hashlib.md5(data).hexdigest(),
            )
        ),
    )
    assert (completed.id, completed.status) == (upload.id, "completed")
    assert completed.file is not None
    assert (completed.file.bytes, completed.file.filename, completed.file.purpose) == (
        len(data),
        "parts.bin",
        "user_data",
    )
    assert exact(FileObject, body(client.files.with_raw_response.retrieve(completed.file.id))) == completed.file
    assert client.files.content(completed.file.id).content == data


def test_upload_with_wrong_md5_is_rejected(client: OpenAI) -> None:
    data = payload(1000, 7)
    upload = client.uploads.create(
        bytes=len(data), filename="x.bin", mime_type="application/octet-stream", purpose="user_data"
    )
    part = client.uploads.parts.create(upload.id, data=data)
    with pytest.raises(openai.BadRequestError) as info:
        client.uploads.complete(upload.id, part_ids=[part.id], md5="0" * 32)
    assert exact_error(info.value, 400)["param"] == "md5"


def test_cancelled_upload_takes_no_parts(client: OpenAI) -> None:
    upload = client.uploads.create(bytes=10, filename="c.jsonl", mime_type="application/jsonl", purpose="batch")
    cancelled = exact(Upload, body(client.uploads.with_raw_response.cancel(upload.id)))
    assert (cancelled.id, cancelled.status, cancelled.file) == (upload.id, "cancelled", None)
    with pytest.raises(openai.BadRequestError) as info:
        client.uploads.parts.create(upload.id, data=b"0123456789")
    exact_error(info.value, 400)


def test_large_file_uploads_in_chunks_and_downloads_streamed(client: OpenAI) -> None:
    size = 6_000_000
    assert size > limits.DEFAULT_INLINE_CONTENT_LIMIT
    data = payload(size, 42)
    upload = client.uploads.upload_file_chunked(
        file=data,
        filename="big.bin",
        bytes=size,
        mime_type="application/octet-stream",
        purpose="user_data",
        part_size=4 * 1024 * 1024,
        md5=hashlib.md5(data).hexdigest(),
    )
    assert upload.status == "completed" and upload.file is not None
    assert upload.file.bytes == size

    response = client.files.with_raw_response.content(upload.file.id).http_response
    assert response.history == [] and response.status_code == 200  # the streaming front's bytes, no redirect
    assert response.headers["content-length"] == str(size)
    assert response.content == data


# --- Hostile file names -------------------------------------------------------------------------
#: RFC 5987 ext-value with charset UTF-8 and no language.
EXT_VALUE = re.compile(r"filename\*=UTF-8''([A-Za-z0-9!#$&+\-.^_`|~%]*)$", re.IGNORECASE)


def download_name(disposition: str) -> str:
    """The name an RFC 6266 recipient takes: filename* (the header is printable ASCII)."""
    assert all(" " <= c <= "~" for c in disposition), disposition
    match = EXT_VALUE.search(disposition)
    assert match, disposition
    return unquote(match.group(1), encoding="utf-8", errors="strict")


@pytest.mark.parametrize(
    "name", ["日本語 €.jsonl", 'say "hi"\r\n.jsonl', "😀\\.jsonl"], ids=["non-latin-1", "quote-crlf", "emoji-backslash"]
)
def test_hostile_file_names_never_drop_the_connection(client: OpenAI, name: str) -> None:
    created = client.files.create(file=(name, BATCH_LINES), purpose="batch")
    assert client.files.retrieve(created.id).filename == created.filename
    content = client.files.with_raw_response.content(created.id)
    assert content.http_response.content == BATCH_LINES
    assert download_name(content.http_response.headers["content-disposition"]) == created.filename


def test_a_non_latin_1_name_downloads_streamed_with_its_name(client: OpenAI) -> None:
    size = limits.DEFAULT_INLINE_CONTENT_LIMIT + 1
    data = payload(size, 7)
    name = 'rapport "final" 日本語.bin'
    upload = client.uploads.upload_file_chunked(
        file=data,
        filename=name,
        bytes=size,
        mime_type="application/octet-stream",
        purpose="user_data",
        part_size=4 * 1024 * 1024,
    )
    assert upload.file is not None and upload.file.filename == name
    response = client.files.with_raw_response.content(upload.file.id).http_response
    assert response.history == [] and response.status_code == 200
    assert response.content == data
    assert download_name(response.headers["content-disposition"]) == name


def test_an_unsafe_name_is_a_400_on_filename(client: OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as info:
        client.uploads.create(filename="a\r\nb.jsonl", purpose="batch", bytes=3, mime_type="application/jsonl")
    assert exact_error(info.value, 400, code="invalid_value")["param"] == "filename"


# --- Keys -------------------------------------------------------------------------------------
def test_invalid_key_is_rejected(deployment: Deployment) -> None:
    with pytest.raises(openai.AuthenticationError) as info:
        deployment.client("sk-not-a-real-key").files.list()
    exact_error(info.value, 401, code="invalid_api_key")


def batchctl(deployment: Deployment, *args: str) -> subprocess.CompletedProcess[str]:
    """The `batchctl` console script of this venv, finding the deployment through its environment
    only (locally its state dir; on AWS the stack's name and the operator's credentials)."""
    script = Path(sys.executable).with_name("batchctl")
    assert script.exists(), "the batchctl console script is not installed (make install)"
    return subprocess.run([str(script), *args], env=deployment.env, capture_output=True, text=True, timeout=60)


def test_batchctl_key_sees_only_its_own_tenant(deployment: Deployment, client: OpenAI) -> None:
    mine = client.files.create(file=("mine.txt", b"local's"), purpose="user_data")

    result = batchctl(deployment, "keys", "create", "--tenant", deployment.tenant("other"))
    assert result.returncode == 0, result.stderr
    key = result.stdout.strip()
    assert key.startswith("sk-") and key != names.LOCAL_KEY
    other = deployment.client(key)

    assert mine.id not in [f.id for f in other.files.list()]
    for call in (other.files.retrieve, other.files.content, other.files.delete):
        with pytest.raises(openai.NotFoundError) as info:
            call(mine.id)
        exact_error(info.value, 404)
    theirs = other.files.create(file=("theirs.txt", b"other's"), purpose="user_data")
    assert [f.id for f in other.files.list()] == [theirs.id]
    assert theirs.id not in [f.id for f in client.files.list()]
    assert client.files.retrieve(mine.id).id == mine.id  # untouched

    result = batchctl(deployment, "keys", "revoke", key)
    assert result.returncode == 0, result.stderr
    # At once locally; on AWS once the authorizer's cached answer for the key has lapsed.
    assert eventually(lambda: _rejected(other), within=deployment.key_cache_seconds)
    with pytest.raises(openai.AuthenticationError) as info:
        other.files.list()
    exact_error(info.value, 401, code="invalid_api_key")


def _rejected(client: OpenAI) -> bool:
    try:
        client.files.list()
    except openai.AuthenticationError:
        return True
    return False


def test_batchctl_rejects_a_bad_tenant_name(deployment: Deployment) -> None:
    result = batchctl(deployment, "keys", "create", "--tenant", "no spaces")
    assert result.returncode == 2
    assert "invalid tenant name" in result.stderr and result.stdout == ""


# --- Stopping ---------------------------------------------------------------------------------
@pytest.mark.local_only("stops a local deployment of its own with a signal")
@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "sigterm"])
def test_signal_stops_everything(signum: int, tmp_path: Path, start_local) -> None:
    deployment = start_local(tmp_path)
    try:
        client = deployment.client()
        client.files.create(file=("a.txt", b"a"), purpose="user_data")  # leaves a keep-alive connection open
        assert port_open(deployment.api_port) and port_open(deployment.moto_port)
        assert deployment.state_file.exists()
    finally:
        code = deployment.stop(signum)

    assert code == 0, deployment.log()
    assert not deployment.group_alive()  # no process of its session is left
    assert not port_open(deployment.api_port) and not port_open(deployment.moto_port)
    assert not deployment.state_file.exists()
    assert deployment.log().rstrip().endswith("stopped.")
    client.close()
