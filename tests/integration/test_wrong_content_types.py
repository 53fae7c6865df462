"""A client's mistake in a request's framing is a 4xx in OpenAI's envelope, never a 5xx: a missing
or wrong Content-Type, a body of the wrong shape, malformed multipart, on every route with a body."""

import json

import pytest

JSON_BODIES = {
    "/batches": {"input_file_id": "file-x", "endpoint": "/v1/chat/completions", "completion_window": "24h"},
    "/uploads": {"filename": "a.jsonl", "purpose": "batch", "bytes": 3, "mime_type": "text/jsonl"},
    "/uploads/upload_01m8n7xjx1bekcr5r3de2q3dfv/complete": {"part_ids": ["part_x"]},
}
MULTIPART = b'--b\r\nContent-Disposition: form-data; name="purpose"\r\n\r\nbatch\r\n--b--\r\n'
FRAMINGS = [
    ("text/plain", None),
    ("application/x-www-form-urlencoded", None),
    ("multipart/form-data; boundary=b", None),
    ("multipart/form-data", MULTIPART),  # no boundary
    ("multipart/form-data; boundary=zz", MULTIPART),  # a boundary the body does not use
    ("application/json", b"{not json"),
    ("application/json", b"[1, 2]"),
    ("application/json", b'"text"'),
    ("application/json", b"\xff\xfe"),
    ("application/octet-stream", None),
]


def send(raw, path, content_type, body):
    headers = {"Content-Type": content_type} if content_type else {}
    return raw.post(path, content=body, headers=headers)


def assert_client_error(response):
    assert 400 <= response.status_code < 500, (response.status_code, response.text)
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["message"]


def test_a_json_body_without_a_content_type_is_read_as_json(raw):
    response = send(raw, "/uploads", None, json.dumps(JSON_BODIES["/uploads"]).encode())
    assert response.status_code == 200 and response.json()["object"] == "upload"


@pytest.mark.parametrize(("content_type", "body"), FRAMINGS)
@pytest.mark.parametrize("path", sorted(JSON_BODIES))
def test_a_json_route_answers_a_wrong_framing_with_a_4xx(raw, path, content_type, body):
    assert_client_error(send(raw, path, content_type, json.dumps(JSON_BODIES[path]).encode() if body is None else body))


@pytest.mark.parametrize(("content_type", "body"), [*FRAMINGS, (None, None)])
@pytest.mark.parametrize("path", ["/files", "/uploads/upload_01m8n7xjx1bekcr5r3de2q3dfv/parts"])
def test_a_multipart_route_answers_a_wrong_framing_with_a_4xx(raw, path, content_type, body):
    assert_client_error(send(raw, path, content_type, MULTIPART if body is None else body))
