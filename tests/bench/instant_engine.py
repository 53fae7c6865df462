"""An engine that answers at once, for ``bench_worker_ceiling``: a minimal HTTP/1.1 server on raw
asyncio (keep-alive, ``Content-Length`` bodies, no chunked requests) answering vLLM-shaped
replies, run as a process of its own so its CPU is counted apart from the worker's.

    .venv/bin/python -m tests.bench.instant_engine [--port 0]   # prints "PORT <n>", then serves

- ``POST /v1/embeddings``: vLLM's ``EmbeddingResponse`` for one input, a 384-dimension vector
  (all-MiniLM-L6-v2's size; float32 values as vLLM's ``tolist()`` renders them), usage
  ``prompt_tokens`` = words + 2 (the tokenizer's [CLS] and [SEP]);
- ``POST /v1/chat/completions`` (and any other POST): vLLM's ``ChatCompletionResponse`` with
  ``max_tokens`` (default 64) words of content and that many ``completion_tokens``;
- ``GET /health`` 200; ``GET /metrics`` 404 (the worker then keeps its configured cap);
- every answer has uvicorn's headers and echoes ``X-Request-Id``, as vLLM does.

The request body is parsed (``json.loads``) so usage follows it; the vectors and the chat text
are rendered once at start, so the server's own cost per request is small and fixed.
"""

from __future__ import annotations

import argparse
import asyncio
import email.utils
import json
import random
import struct
import time
import uuid
from typing import Any

DIMENSIONS = 384
#: The chat answer's words, repeated to its length.
WORDS = ("the", "quiet", "harbor", "holds", "a", "lantern", "and", "the", "tide", "turns", "slowly", "under")


def _float32(x: float) -> float:
    return struct.unpack("f", struct.pack("f", x))[0]


def _vector_json(seed: int) -> bytes:
    rng = random.Random(seed)
    values = [_float32(rng.gauss(0.0, 0.05)) for _ in range(DIMENSIONS)]
    return json.dumps(values).encode()


VECTOR = _vector_json(7)


def embeddings_answer(body: dict[str, Any], request_id: str) -> bytes:
    text = body.get("input")
    words = len(text.split()) if isinstance(text, str) else 8
    usage = {
        "prompt_tokens": words + 2,
        "total_tokens": words + 2,
        "completion_tokens": 0,
        "prompt_tokens_details": None,
    }
    head = {"id": f"embd-{uuid.uuid4().hex}", "object": "list", "created": int(time.time()), "model": body.get("model")}
    return b"".join(
        (
            json.dumps(head)[:-1].encode(),
            b', "data": [{"index": 0, "object": "embedding", "embedding": ',
            VECTOR,
            b'}], "usage": ',
            json.dumps(usage).encode(),
            b"}",
        )
    )


def chat_answer(body: dict[str, Any], request_id: str) -> bytes:
    tokens = body.get("max_tokens") or body.get("max_completion_tokens") or 64
    content = " ".join(WORDS[i % len(WORDS)] for i in range(tokens))
    prompt = 20 + sum(len(str(m.get("content", "")).split()) for m in body.get("messages", []) if isinstance(m, dict))
    answer = {
        "id": f"chatcmpl-{uuid.uuid4().hex}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": body.get("model"),
        "choices": [
            {
                "index": 0,
                "message": {
                    "role": "assistant",
                    "content": content,
                    "refusal": None,
                    "annotations": None,
                    "audio": None,
                    "function_call": None,
                    "tool_calls": [],
                    "reasoning_content": None,
                },
                "logprobs": None,
                "finish_reason": "length",
                "stop_reason": None,
                "token_ids": None,
            }
        ],
        "service_tier": None,
        "system_fingerprint": None,
        "usage": {
            "prompt_tokens": prompt,
            "total_tokens": prompt + tokens,
            "completion_tokens": tokens,
            "prompt_tokens_details": None,
        },
        "prompt_logprobs": None,
        "prompt_token_ids": None,
        "kv_transfer_params": None,
    }
    return json.dumps(answer).encode()


class _Http(asyncio.Protocol):
    def __init__(self) -> None:
        self.buffer = bytearray()
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        while (request := self._take()) is not None:
            self._answer(*request)

    def _take(self) -> tuple[str, str, dict[str, str], bytes] | None:
        end = self.buffer.find(b"\r\n\r\n")
        if end < 0:
            return None
        head = self.buffer[:end].decode("latin-1").split("\r\n")
        method, path, _ = head[0].split(" ", 2)
        headers = {}
        for line in head[1:]:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
        length = int(headers.get("content-length", "0"))
        if len(self.buffer) < end + 4 + length:
            return None
        body = bytes(self.buffer[end + 4 : end + 4 + length])
        del self.buffer[: end + 4 + length]
        return method, path, headers, body

    def _answer(self, method: str, path: str, headers: dict[str, str], body: bytes) -> None:
        request_id = headers.get("x-request-id", f"req_{uuid.uuid4().hex}")
        status = "200 OK"
        if method == "GET":
            payload, status = (b"", "200 OK") if path == "/health" else (b'{"detail":"Not Found"}', "404 Not Found")
        elif path == "/v1/embeddings":
            payload = embeddings_answer(json.loads(body), request_id)
        else:
            payload = chat_answer(json.loads(body), request_id)
        assert self.transport is not None
        self.transport.write(
            (
                f"HTTP/1.1 {status}\r\ndate: {email.utils.formatdate(usegmt=True)}\r\nserver: uvicorn\r\n"
                f"content-length: {len(payload)}\r\ncontent-type: application/json\r\n"
                f"x-request-id: {request_id}\r\n\r\n"
            ).encode()
            + payload
        )


async def serve(port: int) -> None:
    loop = asyncio.get_running_loop()
    server = await loop.create_server(_Http, "127.0.0.1", port, backlog=1024)
    print(f"PORT {server.sockets[0].getsockname()[1]}", flush=True)
    async with server:
        await server.serve_forever()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--port", type=int, default=0)
    args = p.parse_args()
    asyncio.run(serve(args.port))


if __name__ == "__main__":
    main()
