"""Requests generated from OpenAI's published OpenAPI description of the Files, Uploads and Batches
operations (tests/openapi/, a subset of github.com/openai/openai-openapi), sent through the local
front to the real handlers on moto: whatever a client sends, it never gets a 5xx, every error is in
OpenAI's envelope, and every success validates against OpenAI's response schema for it.

Three families of requests, each over every operation the description has:

- conforming ones: path ids, query parameters and bodies drawn from the operation's own schemas
  (ids sometimes of objects that exist), as a client that follows the description sends them;
- the same operations with bodies of any shape: JSON values of any type, bytes, under any
  Content-Type a client might send (or none);
- every path of the description under every method API Gateway's ANY method routes.

Hypothesis runs them derandomized (the same examples on every run), so a failure is reproducible
from the test's name alone."""

import json
from pathlib import Path
from typing import Any
from urllib.parse import quote

import jsonschema
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

SPEC = json.loads((Path(__file__).parents[1] / "openapi" / "openai-files-uploads-batches.json").read_text())
# The description's file object lists every purpose but ``evals``, which its createFile accepts
# (and OpenAI then answers with): a stored file's purpose is one its upload may have.
_purposes = SPEC["components"]["schemas"]["OpenAIFile"]["properties"]["purpose"]["enum"]
_purposes += [
    p for p in SPEC["components"]["schemas"]["CreateFileRequest"]["properties"]["purpose"]["enum"] if p not in _purposes
]
METHODS = ("get", "post", "delete")
#: Every method of API Gateway's ANY (docs/local.md, rule 19).
ANY_METHODS = ("GET", "POST", "PUT", "PATCH", "DELETE", "HEAD", "OPTIONS")
PROPERTIES = settings(
    max_examples=120,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


def resolve(node: Any) -> Any:
    """``node`` with every ``#/components/...`` reference replaced by what it names (the subset has
    no recursive schema) and the vendor extensions (``x-...``) dropped."""
    if isinstance(node, dict):
        if "$ref" in node:
            _, _, kind, name = node["$ref"].split("/", 3)
            return resolve(SPEC["components"][kind][name])
        return {k: resolve(v) for k, v in node.items() if not k.startswith("x-")}
    if isinstance(node, list):
        return [resolve(v) for v in node]
    return node


OPERATIONS = [
    (method.upper(), path, resolve(op))
    for path, ops in sorted(SPEC["paths"].items())
    for method, op in sorted(ops.items())
    if method in METHODS
]
BODY_OPERATIONS = [(m, p, op) for m, p, op in OPERATIONS if "requestBody" in op]


def from_schema(schema: dict[str, Any]) -> st.SearchStrategy[Any]:
    """Values that ``schema`` accepts, for the JSON Schema the description's request schemas use
    (objects, arrays, strings, integers, booleans, enums, ``anyOf``, ``null``)."""
    if "enum" in schema:
        return st.sampled_from(schema["enum"])
    if "anyOf" in schema:
        return st.one_of([from_schema(option) for option in schema["anyOf"]])
    kind = schema.get("type")
    if kind == "object":
        properties = {k: from_schema(v) for k, v in schema.get("properties", {}).items()}
        required = set(schema.get("required", ()))
        fixed = st.fixed_dictionaries(
            {k: v for k, v in properties.items() if k in required},
            optional={k: v for k, v in properties.items() if k not in required},
        )
        extra = schema.get("additionalProperties")
        if isinstance(extra, dict) and not properties:  # a map such as metadata
            return st.dictionaries(st.text(max_size=70), from_schema(extra), max_size=18)
        return fixed
    if kind == "array":
        return st.lists(from_schema(schema.get("items", {})), max_size=5)
    if kind == "integer":
        return st.integers(schema.get("minimum"), schema.get("maximum"))
    if kind == "boolean":
        return st.booleans()
    if kind == "null":
        return st.none()
    if kind == "string":
        return st.text(max_size=schema.get("maxLength", 600))
    return JSON_VALUES


def nullable_when_optional(schema: Any) -> Any:
    """``schema`` with every property that is not ``required`` (and a list's cursors) also allowed to be null: OpenAI
    answers null for them (a running batch's ``output_file_id``, an upload's ``file``) where the
    description types them as their value alone, and the SDKs type them ``Optional``."""
    if isinstance(schema, list):
        return [nullable_when_optional(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    schema = {k: nullable_when_optional(v) for k, v in schema.items()}
    if isinstance(schema.get("properties"), dict):
        # an empty page's cursors are null (OpenAI's answer to a list with nothing in it)
        required = set(schema.get("required", ())) - {"first_id", "last_id"}
        schema["properties"] = {
            k: v if k in required else {"anyOf": [v, {"type": "null"}]} for k, v in schema["properties"].items()
        }
    return schema


def assert_openai_error(response) -> None:
    assert 400 <= response.status_code < 500, (
        response.request.method,
        response.request.url,
        response.status_code,
        response.text,
    )
    if response.request.method == "HEAD":
        return
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["message"], error


def assert_answer(response, op: dict[str, Any]) -> None:
    """A 4xx in OpenAI's envelope, or a success that OpenAI's response schema for it accepts."""
    if response.status_code >= 300:
        if response.status_code == 307:  # a file's content without an Accept: the presigned URL
            assert response.headers["location"]
            return
        assert_openai_error(response)
        return
    declared = op["responses"].get(str(response.status_code), {}).get("content", {})
    answered_json = response.headers.get("content-type", "").startswith("application/json")
    if "application/json" in declared and answered_json and response.request.method != "HEAD":
        schema = nullable_when_optional(declared["application/json"]["schema"])
        jsonschema.validate(response.json(), schema, cls=jsonschema.Draft202012Validator)


def schema_strings(schema: dict[str, Any]) -> st.SearchStrategy[str]:
    """A query value of ``schema`` as a client writes it in the URL."""
    return from_schema(schema).map(lambda v: json.dumps(v) if isinstance(v, bool) else str(v))


def any_id(known: list[str]) -> st.SearchStrategy[str]:
    made_up = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), min_size=1, max_size=40)
    return st.one_of(st.sampled_from(known), made_up)


def multipart_strategy(schema: dict[str, Any]) -> st.SearchStrategy[dict[str, Any]]:
    """The form of a multipart operation: its binary fields as files, the others as text fields
    drawn from their schemas (an object field as OpenAI's ``name[key]`` form fields)."""
    fields: dict[str, st.SearchStrategy[Any]] = {}
    for name, prop in schema["properties"].items():
        if prop.get("format") == "binary":
            fields[name] = st.binary(max_size=300).map(lambda b: ("f", b))
        elif prop.get("type") == "object":
            fields[name] = from_schema(prop)
        else:
            fields[name] = from_schema(prop).map(str)
    required = set(schema.get("required", ()))
    return st.fixed_dictionaries(
        {k: v for k, v in fields.items() if k in required},
        optional={k: v for k, v in fields.items() if k not in required},
    )


def send_multipart(raw, method: str, url: str, form: dict[str, Any]):
    files, data = {}, {}
    for name, value in form.items():
        if isinstance(value, tuple):
            files[name] = value
        elif isinstance(value, dict):
            data.update({f"{name}[{k}]": str(v) for k, v in value.items()})
        else:
            data[name] = value
    return raw.request(method, url, files=files or None, data=data or None)


@pytest.fixture
def known_ids(client) -> dict[str, list[str]]:
    """Ids of objects that exist, for the generated paths and bodies to hit sometimes."""
    batch_file = client.files.create(
        file=(
            "in.jsonl",
            b'{"custom_id": "a", "method": "POST", "url": "/v1/chat/completions", '
            b'"body": {"model": "m", "messages": []}}\n',
        ),
        purpose="batch",
    )
    upload = client.uploads.create(bytes=3, filename="u.jsonl", mime_type="text/jsonl", purpose="batch")
    batch = client.batches.create(input_file_id=batch_file.id, endpoint="/v1/chat/completions", completion_window="24h")
    return {
        "file_id": [batch_file.id],
        "upload_id": [upload.id],
        "batch_id": [batch.id],
        "input_file_id": [batch_file.id],
    }


def url_of(data, path: str, op: dict[str, Any], known: dict[str, list[str]]) -> str:
    """``path`` with its parameters drawn (percent-encoded) and a query of the operation's own."""
    query = []
    for param in op.get("parameters", ()):
        if param["in"] == "path":
            value = data.draw(any_id(known.get(param["name"], ["x"])), label=param["name"])
            path = path.replace("{" + param["name"] + "}", quote(value, safe=""))
        elif param["in"] == "query" and data.draw(st.booleans(), label=f"with {param['name']}"):
            query.append(
                f"{param['name']}={quote(data.draw(schema_strings(param['schema']), label=param['name']), safe='')}"
            )
    return path + ("?" + "&".join(query) if query else "")


@PROPERTIES
@given(data=st.data())
def test_requests_that_follow_openais_description_never_get_a_5xx(raw, known_ids, data) -> None:
    method, path, op = data.draw(st.sampled_from(OPERATIONS), label="operation")
    url = url_of(data, path, op, known_ids)
    content = op.get("requestBody", {}).get("content", {})
    if "application/json" in content:
        schema = content["application/json"]["schema"]
        body = data.draw(from_schema(schema), label="body")
        if isinstance(body, dict) and data.draw(st.booleans(), label="optional fields null"):
            body.update(
                {k: None for k in schema["properties"] if k not in schema.get("required", ()) and k not in body}
            )
        if "input_file_id" in body and data.draw(st.booleans(), label="a real input file"):
            body["input_file_id"] = known_ids["input_file_id"][0]
        response = raw.request(method, url, json=body)
    elif "multipart/form-data" in content:
        response = send_multipart(
            raw, method, url, data.draw(multipart_strategy(content["multipart/form-data"]["schema"]), label="form")
        )
    else:
        response = raw.request(method, url)
    assert_answer(response, op)


JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner, max_size=4),
    max_leaves=12,
)
CONTENT_TYPES = st.one_of(
    st.none(),
    st.sampled_from(
        [
            "application/json",
            "application/json; charset=utf-8",
            "text/plain",
            "application/octet-stream",
            "application/x-www-form-urlencoded",
            "multipart/form-data",
            "multipart/form-data; boundary=x",
            "text/html; charset=iso-8859-1",
            "application/jsonl",
        ]
    ),
    # any printable value an HTTP client can send (no surrounding whitespace: not a legal header value)
    st.text(st.characters(min_codepoint=0x20, max_codepoint=0x7E), max_size=40).map(str.strip),
)


@PROPERTIES
@given(data=st.data())
def test_bodies_of_any_shape_under_any_content_type_never_get_a_5xx(raw, known_ids, data) -> None:
    method, path, op = data.draw(st.sampled_from(BODY_OPERATIONS), label="operation")
    url = url_of(data, path, op, known_ids)
    body = data.draw(
        st.one_of(JSON_VALUES.map(lambda v: json.dumps(v).encode()), st.binary(max_size=200)), label="body"
    )
    content_type = data.draw(CONTENT_TYPES, label="content type")
    headers = {"Content-Type": content_type} if content_type is not None else {}
    response = raw.request(method, url, content=body, headers=headers)
    assert response.status_code < 500, (method, url, content_type, body, response.status_code, response.text)
    assert_answer(response, op)


@PROPERTIES
@given(data=st.data())
def test_every_path_under_every_method_never_gets_a_5xx(raw, known_ids, data) -> None:
    path = data.draw(st.sampled_from(sorted(SPEC["paths"])), label="path")
    method = data.draw(st.sampled_from(ANY_METHODS), label="method")
    ops = {m.upper(): resolve(op) for m, op in SPEC["paths"][path].items() if m in METHODS}
    op = ops.get(
        method, {"parameters": resolve(next(iter(SPEC["paths"][path].values())).get("parameters", [])), "responses": {}}
    )
    response = raw.request(method, url_of(data, path, op, known_ids))
    assert response.status_code < 500, (method, path, response.status_code, response.text)
    if method in ops:
        assert_answer(response, op)
    elif method not in ("HEAD", "OPTIONS"):
        assert_openai_error(response)


def test_optional_fields_sent_as_null_are_taken_as_absent(raw, known_ids) -> None:
    """What a client that writes every field sends (litellm passes ``metadata=None``): each JSON
    operation of the description with all its optional fields null is answered as without them."""
    created = raw.post(
        "/batches",
        json={
            "input_file_id": known_ids["input_file_id"][0],
            "endpoint": "/v1/chat/completions",
            "completion_window": "24h",
            "metadata": None,
            "output_expires_after": None,
        },
    )
    assert created.status_code == 200 and created.json()["metadata"] is None
    upload = raw.post(
        "/uploads",
        json={"filename": "n.jsonl", "purpose": "batch", "bytes": 3, "mime_type": "text/jsonl", "expires_after": None},
    )
    assert upload.status_code == 200
    part = raw.post(f"/uploads/{upload.json()['id']}/parts", files={"data": ("d", b"abc")}).json()["id"]
    done = raw.post(f"/uploads/{upload.json()['id']}/complete", json={"part_ids": [part], "md5": None})
    assert done.status_code == 200 and done.json()["status"] == "completed"
    for schema_name in (
        "CreateBatchRequest",
        "CreateUploadRequest",
        "CompleteUploadRequest",
    ):  # every optional field covered
        schema = SPEC["components"]["schemas"][schema_name]
        optional = set(schema["properties"]) - set(schema["required"])
        assert optional <= {"metadata", "output_expires_after", "expires_after", "md5"}, (schema_name, optional)
