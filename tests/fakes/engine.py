"""A fake OpenAI-compatible server for fault injection only (real behaviour is tested against real
vLLM): /health, /v1/models, and POST endpoints answered by a test-controlled ``respond``.

It runs in its own thread and event loop on an ephemeral loopback port. ``respond(path, body,
seen)`` returns ``(status, json_body)``, ``(status, json_body, headers)``, ``HANG`` (never
answer) or ``DROP`` (close the connection without an answer); ``seen`` counts earlier requests
with the same body (so "fail the first k attempts" is easy). Every request is recorded;
``max_concurrent`` is the most requests open at once. ``health_status`` and ``models_status`` are
what ``GET /health`` and ``GET /v1/models`` answer, ``metrics`` and ``metrics_filter`` what ``GET
/metrics`` does; ``probes`` records those GETs.

The audio endpoints get ``multipart/form-data`` (``EngineClient.post_form``): ``respond`` sees it
as a dict (``form_body``: fields by name, a repeated ``name[]`` as the list ``name``, the file as
``{"filename", "bytes"}``; its content in ``files``), and ``default_respond`` answers it with
``{"text": "heard N bytes", "usage": {"type": "duration", "seconds": 1}}``.

``InProcessEngine`` is the same ``respond`` behind ``functions.core.ports.Engine`` with no HTTP
at all: what chunk-level tests hand to ``gpu_worker.chunk.ChunkRunner``.
"""

from __future__ import annotations

import asyncio
import json
import threading
import uuid
from collections import Counter
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

AUDIO_PATHS = ("/v1/audio/transcriptions", "/v1/audio/translations")

HANG = "hang"
DROP = "drop"

Respond = Callable[[str, dict[str, Any], int], Awaitable[Any] | Any]


class Streamed:
    """A ``respond`` payload sent chunked, with no Content-Length: ``pieces`` pieces of
    ``piece_bytes`` bytes each (``sent`` counts the pieces written before the client stopped)."""

    def __init__(self, pieces: int, piece_bytes: int = 64 * 1024):
        self.pieces, self.piece_bytes, self.sent = pieces, piece_bytes, 0

    async def send(self, request: web.Request, status: int, headers: dict[str, str]) -> web.StreamResponse:
        response = web.StreamResponse(status=status, headers={"Content-Type": "application/json", **headers})
        response.enable_chunked_encoding()
        await response.prepare(request)
        try:
            for _ in range(self.pieces):
                await response.write(b" " * self.piece_bytes)
                self.sent += 1
            await response.write_eof()
        except (ConnectionError, RuntimeError):
            pass  # the client closed the connection: what a bounded reader does
        return response


def content(body: dict[str, Any]) -> str:
    """The user message (chat), prompt (completions) or input (embeddings) of a request."""
    if "messages" in body:
        return str(body["messages"][-1].get("content", ""))
    return str(body.get("prompt", body.get("input", "")))


def chat_answer(body: dict[str, Any], completion_tokens: int = 3, prompt_tokens: int = 10) -> dict[str, Any]:
    return {
        "id": "chatcmpl-fake",
        "object": "chat.completion",
        "model": body.get("model"),
        "choices": [
            {"index": 0, "message": {"role": "assistant", "content": f"echo {content(body)}"}, "finish_reason": "stop"}
        ],
        "usage": {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
        },
    }


def audio_answer(body: dict[str, Any]) -> dict[str, Any]:
    return {"text": f"heard {body['file']['bytes']} bytes", "usage": {"type": "duration", "seconds": 1}}


def form_body(fields: list[tuple[str, str]], files: list[tuple[str, str, bytes]]) -> dict[str, Any]:
    """A multipart request as ``respond`` sees it (the module docstring)."""
    body: dict[str, Any] = {}
    for name, value in fields:
        if name.endswith("[]"):
            body.setdefault(name[:-2], []).append(value)
        else:
            body[name] = value
    for name, filename, data in files:
        body[name] = {"filename": filename, "bytes": len(data)}
    return body


async def default_respond(path: str, body: dict[str, Any], seen: int) -> Any:
    return 200, audio_answer(body) if path in AUDIO_PATHS else chat_answer(body)


#: The body vLLM's OpenAI server answers a request it rejects (with status 400).
REJECTED = {"error": {"message": "rejected", "type": "BadRequestError", "param": None, "code": 400}}


def rejecting(*contents: str) -> Respond:
    """Answer 400 ``REJECTED`` to requests whose content is one of ``contents``; a chat answer
    (usage: 10 prompt + 3 completion tokens) to every other."""

    def respond(path: str, body: dict[str, Any], seen: int) -> Any:
        return (400, REJECTED) if content(body) in contents else (200, chat_answer(body))

    return respond


class FakeEngine:
    def __init__(self, respond: Respond = default_respond):
        self.respond = respond
        self.health_status = 200
        self.models_status = 200
        #: What ``GET /metrics`` answers (Prometheus text; None: 404), and whether ``GET /metrics/``
        #: filters it by ``name[]`` as prometheus_client's exposition app (vLLM mounts one there)
        #: does: only the samples named (their HELP and TYPE lines left out); False: 404.
        self.metrics: str | None = None
        self.metrics_filter = True
        self.probes: list[str] = []
        self.requests: list[tuple[str, dict[str, Any]]] = []
        #: The files of multipart requests: (path, file name, content).
        self.files: list[tuple[str, str, bytes]] = []
        self.open = 0
        self.max_concurrent = 0
        self._seen: Counter[str] = Counter()
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._runner: web.AppRunner | None = None
        self._thread: threading.Thread | None = None
        self._hung: list[asyncio.Future[None]] = []
        self.port = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def contents(self) -> list[str]:
        with self._lock:
            return [content(b) for _, b in self.requests]

    # --- handlers ----------------------------------------------------------------------------
    async def _health(self, request: web.Request) -> web.Response:
        self.probes.append(request.path)
        return web.Response(status=self.health_status)

    async def _metrics(self, request: web.Request) -> web.Response:
        self.probes.append(request.path_qs)
        if self.metrics is None or (request.path == "/metrics/" and not self.metrics_filter):
            return web.Response(status=404)
        text = self.metrics
        if names := request.query.getall("name[]", []):
            samples = [l for l in text.splitlines() if l and not l.startswith("#")]
            text = "".join(f"{l}\n" for l in samples if l.split("{")[0].split()[0] in names)
        return web.Response(text=text, content_type="text/plain")

    async def _models(self, request: web.Request) -> web.Response:
        self.probes.append(request.path)
        if self.models_status != 200:
            return web.json_response({"error": {"message": "no models"}}, status=self.models_status)
        return web.json_response(
            {"object": "list", "data": [{"id": "test-chat", "object": "model", "max_model_len": 2048}]}
        )

    async def _form(self, request: web.Request) -> dict[str, Any]:
        fields: list[tuple[str, str]] = []
        files: list[tuple[str, str, bytes]] = []
        for name, value in (await request.post()).items():
            if isinstance(value, web.FileField):
                files.append((name, value.filename, value.file.read()))
            else:
                fields.append((name, str(value)))
        with self._lock:
            self.files.extend((request.path, filename, data) for _, filename, data in files)
        return form_body(fields, files)

    async def _post(self, request: web.Request) -> web.StreamResponse:
        body = await (self._form(request) if request.content_type == "multipart/form-data" else request.json())
        key = json.dumps(body, sort_keys=True)
        with self._lock:
            self.requests.append((request.path, body))
            seen = self._seen[key]
            self._seen[key] += 1
            self.open += 1
            self.max_concurrent = max(self.max_concurrent, self.open)
        try:
            result = self.respond(request.path, body, seen)
            if asyncio.iscoroutine(result):
                result = await result
            if result == HANG:
                hang = asyncio.get_running_loop().create_future()
                self._hung.append(hang)
                await hang
                return web.Response(status=599)
            if result == DROP:
                assert request.transport is not None
                request.transport.close()  # the client sees the connection end with no answer
                return web.Response(status=599)
            status, payload, *rest = result
            headers = rest[0] if rest else {}
            headers = {"x-request-id": request.headers.get("X-Request-Id", "fake"), **headers}
            if isinstance(payload, str):
                return web.Response(status=status, text=payload, headers=headers)
            if isinstance(payload, Streamed):
                return await payload.send(request, status, headers)
            return web.json_response(payload, status=status, headers=headers)
        finally:
            with self._lock:
                self.open -= 1

    # --- lifecycle ---------------------------------------------------------------------------
    def start(self) -> FakeEngine:
        ready = threading.Event()

        def run() -> None:
            loop = asyncio.new_event_loop()
            self._loop = loop
            app = web.Application(client_max_size=64 * 1024 * 1024)
            app.router.add_get("/health", self._health)
            app.router.add_get("/v1/models", self._models)
            app.router.add_get("/metrics", self._metrics)
            app.router.add_get("/metrics/", self._metrics)
            app.router.add_post("/{tail:.*}", self._post)
            self._runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.1)
            loop.run_until_complete(self._runner.setup())
            site = web.TCPSite(self._runner, "127.0.0.1", self.port)
            loop.run_until_complete(site.start())
            self.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
            ready.set()
            loop.run_forever()
            loop.run_until_complete(self._runner.cleanup())
            loop.close()

        self._thread = threading.Thread(target=run, name="fake-engine", daemon=True)
        self._thread.start()
        ready.wait(10)
        return self

    def stop(self) -> None:
        if self._loop is None or self._thread is None:
            return

        def release() -> None:
            for hang in self._hung:
                if not hang.done():
                    hang.cancel()
            self._loop.stop()  # type: ignore[union-attr]

        self._loop.call_soon_threadsafe(release)
        self._thread.join(10)
        self._thread = None


class InProcessEngine:
    """``functions.core.ports.Engine`` answered in-process by ``respond`` (same contract as
    ``FakeEngine``'s, minus ``DROP``): no socket, no thread. Records every request."""

    base_url = "in-process"

    def __init__(self, respond: Respond = default_respond, *, max_in_flight: int = 64):
        from gpu_worker.engine_client import EngineStats

        self.respond = respond
        self.max_in_flight = max_in_flight
        self.requests: list[tuple[str, dict[str, Any]]] = []
        self._seen: Counter[str] = Counter()
        # What the worker loop reads of the real client (its gauges and counters).
        self.in_flight = 0
        self.waiting = 0
        self.stats = EngineStats()

    def contents(self) -> list[str]:
        return [content(b) for _, b in self.requests]

    async def healthy(self) -> bool:
        return True

    async def wait_healthy(self, timeout: float, interval: float = 1.0) -> float:
        return 0.0

    async def post_form(self, path: str, fields: list[tuple[str, str]], files: list[tuple[str, str, bytes]]) -> Any:
        return await self.post(path, form_body(fields, files))

    async def post(self, path: str, body: dict[str, Any]) -> Any:
        from gpu_worker.engine_client import Reply

        key = json.dumps(body, sort_keys=True)
        self.requests.append((path, body))
        seen = self._seen[key]
        self._seen[key] += 1
        self.stats.requests += 1
        self.in_flight += 1
        try:
            result = self.respond(path, body, seen)
            if asyncio.iscoroutine(result):
                result = await result
            if result == HANG:
                await asyncio.get_running_loop().create_future()
        finally:
            self.in_flight -= 1
        status, payload, *_ = result
        self.stats.answered[status] = self.stats.answered.get(status, 0) + 1
        return Reply(status, payload, f"req_{uuid.uuid4().hex}")


class CrashingEngine(InProcessEngine):
    """An in-process engine that dies when a poison request reaches it (``poison``: request
    contents): that request and every request in flight with it fail with ``EngineDown`` (what
    the real client raises once the engine stops answering, even on /health), and so does any
    request sent while it is down. ``restart()`` brings it back (the local supervisor, or a new
    ECS task). ``alone_at_crash`` records how many requests were in flight at each crash. A
    poison request crashes the engine only once ``crash_after`` requests were answered; every
    request takes ``turns`` turns of the event loop (a poison one crashes the engine at its last)."""

    def __init__(self, *poison: str, max_in_flight: int = 64, crash_after: int = 0, turns: int = 1):
        super().__init__(self._respond, max_in_flight=max_in_flight)
        self.poison = set(poison)
        self.crash_after = crash_after
        self.turns = turns
        self.down = False
        self.crashes = 0
        self.alone_at_crash: list[int] = []
        #: The requests (contents) in the engine at each crash, the poison one included.
        self.with_crash: list[list[str]] = []
        self._open: list[str] = []

    def restart(self) -> None:
        self.down = False

    async def _respond(self, path: str, body: dict[str, Any], seen: int) -> Any:
        self._open.append(content(body))
        try:
            return await self._answer(body)
        finally:
            self._open.remove(content(body))

    async def _answer(self, body: dict[str, Any]) -> Any:
        from gpu_worker.engine_client import EngineDown

        if self.down:
            raise EngineDown("the engine is down")
        if content(body) in self.poison:
            while sum(self.stats.answered.values()) < self.crash_after:
                await asyncio.sleep(0)
            for _ in range(self.turns - 1):  # it runs a while before it brings the engine down
                await asyncio.sleep(0)
                if self.down:
                    raise EngineDown("the engine crashed")
            self.down = True
            self.crashes += 1
            self.alone_at_crash.append(self.in_flight)
            self.with_crash.append(sorted(self._open))
            raise EngineDown("the engine crashed")
        for _ in range(self.turns):  # requests sent together are in flight together
            await asyncio.sleep(0)
            if self.down:
                raise EngineDown("the engine crashed")
        return 200, chat_answer(body)
