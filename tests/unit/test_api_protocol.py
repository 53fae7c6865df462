"""The API's request models (functions/api/protocol.py) and how their errors are answered
(functions/api/errors.py): OpenAI's value rules, at their boundaries, in OpenAI's words."""

import pytest
from aws_lambda_powertools.event_handler.openapi.exceptions import RequestValidationError
from pydantic import ValidationError

from functions.api.errors import validation_to_api_error
from functions.api.protocol import (
    BatchListQuery,
    CompleteUploadBody,
    CreateBatchBody,
    CreateUploadBody,
    ExpiresAfter,
    FileListQuery,
)

BATCH = {"input_file_id": "file-x", "endpoint": "/v1/chat/completions", "completion_window": "24h"}
UPLOAD = {"filename": "a.jsonl", "purpose": "batch", "bytes": 3, "mime_type": "application/jsonl"}


def answer(model, data, source="body"):
    """The API error a request with ``data`` gets (as powertools locates body/query errors)."""
    with pytest.raises(ValidationError) as info:
        model.model_validate(data)
    prefix = ("query", "query") if source == "query" else (source,)
    error = validation_to_api_error([{**e, "loc": (*prefix, *e["loc"])} for e in info.value.errors()])
    return error.status, error.code, error.param, error.message


# --- metadata: at most 16 pairs, keys up to 64 characters, values up to 512 --------------------
def test_metadata_at_its_limits_is_accepted():
    body = CreateBatchBody.model_validate({**BATCH, "metadata": {f"{i:064d}": "v" * 512 for i in range(16)}})
    assert len(body.metadata) == 16


@pytest.mark.parametrize(
    ("metadata", "message"),
    [
        ({f"k{i}": "v" for i in range(17)}, "Invalid value for 'metadata': at most 16 key-value pairs are allowed."),
        ({"k" * 65: "v"}, "Invalid value for 'metadata': keys may be at most 64 characters."),
        ({"k": "v" * 513}, "Invalid value for 'metadata.k': values may be at most 512 characters."),
        ({"k": 1}, "Invalid value for 'metadata.k': values must be strings."),
        (["k"], "Invalid value for 'metadata': it must be an object of strings."),
    ],
)
def test_metadata_rules(metadata, message):
    assert answer(CreateBatchBody, {**BATCH, "metadata": metadata}) == (400, "invalid_value", "metadata", message)


# --- expires_after: anchor created_at, seconds 3600 .. 2592000 ---------------------------------
@pytest.mark.parametrize("seconds", [3_600, 30 * 86_400])
def test_expires_after_bounds_are_inclusive(seconds):
    assert ExpiresAfter(anchor="created_at", seconds=seconds).seconds == seconds
    body = CreateBatchBody.model_validate(
        {**BATCH, "output_expires_after": {"anchor": "created_at", "seconds": seconds}}
    )
    assert body.output_expires_after.seconds == seconds


@pytest.mark.parametrize("seconds", [3_599, 30 * 86_400 + 1, 0, -1])
def test_expires_after_out_of_bounds(seconds):
    data = {**UPLOAD, "expires_after": {"anchor": "created_at", "seconds": seconds}}
    assert answer(CreateUploadBody, data) == (
        400,
        "invalid_value",
        "expires_after.seconds",
        f"Invalid value for 'expires_after.seconds': {seconds}. It must be between 3600 and 2592000.",
    )
    batch = {**BATCH, "output_expires_after": {"anchor": "created_at", "seconds": seconds}}
    assert answer(CreateBatchBody, batch)[:3] == (400, "invalid_value", "output_expires_after.seconds")


def test_expires_after_anchor_and_missing_fields():
    assert answer(CreateBatchBody, {**BATCH, "output_expires_after": {"anchor": "now", "seconds": 7_200}}) == (
        400,
        "invalid_value",
        "output_expires_after.anchor",
        "Invalid value for 'output_expires_after.anchor': 'now'. Supported values are: 'created_at'.",
    )
    assert answer(CreateBatchBody, {**BATCH, "output_expires_after": {"anchor": "created_at"}}) == (
        400,
        "missing_required_parameter",
        "output_expires_after.seconds",
        "Missing required parameter: 'output_expires_after.seconds'.",
    )


def test_expires_after_from_multipart_fields():
    assert ExpiresAfter.from_form(None, None) is None
    assert ExpiresAfter.from_form("created_at", 7_200) == ExpiresAfter(anchor="created_at", seconds=7_200)
    for anchor, seconds, code, param in [
        ("created_at", None, "missing_required_parameter", "expires_after.seconds"),
        (None, 7_200, "missing_required_parameter", "expires_after.anchor"),
        ("last_access", 7_200, "invalid_value", "expires_after.anchor"),
        ("created_at", 60, "invalid_value", "expires_after.seconds"),
    ]:
        with pytest.raises(RequestValidationError) as info:
            ExpiresAfter.from_form(anchor, seconds)
        error = validation_to_api_error(list(info.value.errors()))
        assert (error.status, error.code, error.param) == (400, code, param)


# --- uploads ------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("change", "expected"),
    [
        (
            {"purpose": "nope"},
            (
                "invalid_value",
                "purpose",
                "Invalid value for 'purpose': 'nope'. Supported values are: "
                "'assistants', 'batch', 'fine-tune', 'vision', 'user_data', 'evals'.",
            ),
        ),
        ({"purpose": "batch_output"}, ("invalid_value", "purpose", None)),  # an output purpose, not an upload's
        ({"filename": ""}, ("invalid_value", "filename", "Invalid value for 'filename': it must not be empty.")),
        ({"mime_type": ""}, ("invalid_value", "mime_type", "Invalid value for 'mime_type': it must not be empty.")),
        ({"bytes": "x"}, ("invalid_value", "bytes", None)),
    ],
)
def test_create_upload_rules(change, expected):
    status, code, param, message = answer(CreateUploadBody, {**UPLOAD, **change})
    assert (status, code, param) == (400, *expected[:2])
    if expected[2] is not None:
        assert message == expected[2]


CONTROL = "It must not contain control characters (such as NUL, CR or LF)."


@pytest.mark.parametrize(
    ("filename", "detail"),
    [
        ("a\r\nSet-Cookie: x=1.jsonl", CONTROL),
        ("nul\x00.jsonl", CONTROL),
        ("tab\t.jsonl", CONTROL),
        ("del\x7f.jsonl", CONTROL),
        ("c1\x85.jsonl", CONTROL),  # NEL, a C1 control
        ("x" * 250 + ".jsonl", "It may be at most 255 characters."),
    ],
)
def test_a_filename_that_cannot_be_stored_or_echoed_safely_is_400(filename, detail):
    assert answer(CreateUploadBody, {**UPLOAD, "filename": filename}) == (
        400,
        "invalid_value",
        "filename",
        f"Invalid value for 'filename': {detail}",
    )


def test_a_lone_surrogate_in_a_filename_is_400():
    assert answer(CreateUploadBody, {**UPLOAD, "filename": "\ud800.jsonl"})[:3] == (400, "invalid_value", "filename")


@pytest.mark.parametrize(
    "filename",
    ['say "hi".jsonl', "back\\slash.jsonl", "dir/name.jsonl", "日本語 €.jsonl", "😀.jsonl", "x" * 249 + ".jsonl"],
)
def test_quotes_slashes_and_any_script_are_valid_filenames(filename):
    assert CreateUploadBody.model_validate({**UPLOAD, "filename": filename}).filename == filename


def test_missing_fields_are_named():
    assert answer(CompleteUploadBody, {}) == (
        400,
        "missing_required_parameter",
        "part_ids",
        "Missing required parameter: 'part_ids'.",
    )
    missing = {k: v for k, v in UPLOAD.items() if k != "bytes"}
    assert answer(CreateUploadBody, missing)[1:3] == ("missing_required_parameter", "bytes")


# --- lists ----------------------------------------------------------------------------------------
def test_list_defaults():
    files = FileListQuery()
    assert (files.limit, files.order, files.after, files.purpose, files.ascending) == (
        10_000,
        "desc",
        None,
        None,
        False,
    )
    assert FileListQuery(order="asc").ascending
    assert (BatchListQuery().limit, BatchListQuery().after) == (20, None)


@pytest.mark.parametrize(("model", "high"), [(FileListQuery, 10_000), (BatchListQuery, 100)])
def test_list_limit_bounds(model, high):
    assert model.model_validate({"limit": "1"}).limit == 1
    assert model.model_validate({"limit": str(high)}).limit == high
    for bad in (0, high + 1):
        assert answer(model, {"limit": str(bad)}, "query") == (
            400,
            "invalid_value",
            "limit",
            f"Invalid value for 'limit': {bad}. It must be between 1 and {high}.",
        )


def test_list_cursor_order_and_purpose():
    assert answer(FileListQuery, {"order": "sideways"}, "query") == (
        400,
        "invalid_value",
        "order",
        "Invalid value for 'order': 'sideways'. Supported values are: 'asc', 'desc'.",
    )
    assert answer(BatchListQuery, {"after": "file-01m8n7xjx1bekcr5r3de2q3dfv"}, "query") == (
        400,
        "invalid_value",
        "after",
        "Invalid value for 'after': 'file-01m8n7xjx1bekcr5r3de2q3dfv'. It must be a batch id.",
    )
    assert answer(FileListQuery, {"after": "batch_01m8n7xjx1bekcr5r3de2q3dfv"}, "query")[2] == "after"
    assert FileListQuery(after="file-01m8n7xjx1bekcr5r3de2q3dfv").after == "file-01m8n7xjx1bekcr5r3de2q3dfv"
    assert FileListQuery(purpose="batch_output").purpose == "batch_output"  # outputs are listable
    assert answer(FileListQuery, {"purpose": "nope"}, "query")[1:3] == ("invalid_value", "purpose")


# --- the renderer's other cases -------------------------------------------------------------------
def test_unparseable_bodies():
    json_error = validation_to_api_error([{"type": "json_invalid", "loc": ("body", 1), "msg": "x"}])
    assert (json_error.status, json_error.code, json_error.param) == (400, None, None)
    assert "JSON" in json_error.message
    multipart = validation_to_api_error([{"type": "multipart_invalid", "loc": ("body",), "msg": "x"}])
    assert "multipart/form-data" in multipart.message and multipart.param is None


def test_form_field_names_are_kept_as_sent():
    error = validation_to_api_error(
        [
            {
                "type": "int_parsing",
                "loc": ("form", "expires_after[seconds]"),
                "msg": "Input should be a valid integer",
                "input": "soon",
            }
        ]
    )
    assert (error.code, error.param) == ("invalid_value", "expires_after[seconds]")
