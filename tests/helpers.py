"""Shared by the tests: OpenAI shapes, the OpenAI error envelope, a free loopback port, a small
chat input file."""

import json
import socket
import ssl
from typing import Any

import httpx2
import openai
from openai import BaseModel as OpenAIModel
from openai.types.shared import ErrorObject

from gpu_worker.local_engine import free_port


def assert_openai_shape(model: type[OpenAIModel], data: dict[str, Any]) -> OpenAIModel:
    """``data`` has exactly the SDK type's fields (none missing, none extra) and validates."""
    fields = set(model.model_fields)
    required = {name for name, f in model.model_fields.items() if f.is_required()}
    assert set(data) <= fields, f"fields OpenAI does not have: {set(data) - fields}"
    assert required <= set(data), f"missing required fields: {required - set(data)}"
    return model.model_validate(data)


def assert_error(
    response: httpx2.Response, status: int, code: str | None, param: str | None = None, *, message: str | None = None
) -> dict[str, Any]:
    """The response is OpenAI's error envelope with this status, code and param."""
    assert response.status_code == status, response.text
    body = response.json()
    assert set(body) == {"error"}, body
    error = body["error"]
    assert set(error) == {"message", "type", "param", "code"}, error
    ErrorObject.model_validate(error)
    assert error["code"] == code, error
    assert error["param"] == param, error
    assert error["message"], error
    assert error["type"] == ("server_error" if status >= 500 else "invalid_request_error"), error
    if message is not None:
        assert message in error["message"], error
    return error


#: One TLS context for the HTTP clients the tests make by the hundred: a client builds its own
#: otherwise (the CA bundle read again, about 15 ms), and these clients speak plain HTTP to loopback.
TLS = ssl.create_default_context()


def sdk_client(base_url: str, api_key: str, **options: Any) -> openai.OpenAI:
    """The official SDK as a customer makes it (its own HTTP client's defaults, on the shared TLS
    context, unless ``options`` gives an ``http_client``)."""
    if "http_client" not in options:
        options["http_client"] = openai.DefaultHttpxClient(verify=TLS)
    return openai.OpenAI(base_url=base_url, api_key=api_key, **options)


def raw_client(api_url: str, key: str | None) -> httpx2.Client:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    return httpx2.Client(base_url=api_url, headers=headers, follow_redirects=False, timeout=30, verify=TLS)


def with_changes(obj: dict[str, Any], changes: dict[str, Any]) -> dict[str, Any]:
    """A request line object with ``changes``: ``body_<field>`` sets a body field, None drops a
    top-level field, anything else sets it."""
    for key, value in changes.items():
        if key.startswith("body_"):
            obj["body"][key[5:]] = value
        elif value is None:
            obj.pop(key)
        else:
            obj[key] = value
    return obj


def chat_jsonl(n: int, model: str = "test-chat") -> bytes:
    """``n`` chat request lines (custom_id ``req-<i>``), the bytes of a batch input file."""
    return "".join(
        json.dumps(
            {
                "custom_id": f"req-{i}",
                "method": "POST",
                "url": "/v1/chat/completions",
                "body": {"model": model, "messages": [{"role": "user", "content": f"hi {i}"}]},
            }
        )
        + "\n"
        for i in range(n)
    ).encode()
