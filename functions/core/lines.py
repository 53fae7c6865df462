"""Reading and validating batch input lines, shared by ingest (whole file) and the worker (a chunk).

Both read the same bytes with the same rules: a UTF-8 BOM at the very start is skipped, a CR before
LF is dropped, blank lines are skipped (but counted, so line numbers are the file's own, 1-based),
and a line longer than the limit is reported without being held in memory.

Hostile content never reaches an exception past this module: a line nested deeper than
MAX_JSON_DEPTH, or holding a lone UTF-16 surrogate (``"\\ud800"`` is valid JSON but not Unicode:
no result line carrying it could be written), is a LineError; client values echoed in messages are
cut to a short prefix, and every message to MAX_ERROR_MESSAGE_CHARS.
"""

import ipaddress
import json
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any, TypeGuard
from urllib.parse import urlsplit

from . import limits

BOM = b"\xef\xbb\xbf"


@dataclass(frozen=True)
class RawLine:
    number: int  # 1-based line number in the file
    start: int  # byte offset of the line's first byte
    end: int  # byte offset just past its newline (or end of data)
    text: bytes  # without BOM, CR and LF; empty if too_long
    too_long: bool = False

    @property
    def blank(self) -> bool:
        return not self.too_long and not self.text.strip()


def iter_lines(
    chunks: Iterable[bytes], *, max_line_bytes: int, start: int = 0, first_number: int = 1
) -> Iterator[RawLine]:
    """Split a byte stream into lines, tracking byte offsets; memory is bounded by max_line_bytes."""
    offset = start  # offset of the current line's first byte
    number = first_number
    pending = bytearray()
    pending_len = 0  # true length of the current line so far (pending may be truncated)
    for chunk in chunks:
        pos = 0
        while pos < len(chunk):
            newline = chunk.find(b"\n", pos)
            piece = chunk[pos:] if newline < 0 else chunk[pos : newline + 1]
            if pending_len <= max_line_bytes + len(BOM) + 1:
                pending += piece
            pending_len += len(piece)
            pos += len(piece)
            if newline >= 0:
                yield _finish(pending, pending_len, offset, number, max_line_bytes)
                offset += pending_len
                number += 1
                pending.clear()
                pending_len = 0
    if pending_len:
        yield _finish(pending, pending_len, offset, number, max_line_bytes)


def _finish(pending: bytearray, length: int, offset: int, number: int, max_line_bytes: int) -> RawLine:
    text = bytes(pending)
    if offset == 0 and text.startswith(BOM):
        text = text[len(BOM) :]
    if text.endswith(b"\n"):
        text = text[:-1]
    if text.endswith(b"\r"):
        text = text[:-1]
    if len(text) > max_line_bytes:
        return RawLine(number, offset, offset + length, b"", too_long=True)
    return RawLine(number, offset, offset + length, text)


class LineError(Exception):
    """A request line that breaks OpenAI's batch input rules."""

    def __init__(self, code: str, message: str, param: str | None = None):
        message = cut(message, limits.MAX_ERROR_MESSAGE_CHARS)
        super().__init__(message)
        self.code, self.message, self.param = code, message, param


def cut(text: str, limit: int) -> str:
    """``text`` if it has at most ``limit`` characters, else its first ``limit - 1`` and "…"."""
    return text if len(text) <= limit else text[: limit - 1] + "\u2026"


def shown(value: Any) -> str:
    """A client's value as an error message shows it: its repr (which escapes control characters
    and lone surrogates), cut to MAX_ECHOED_VALUE_CHARS characters."""
    if isinstance(value, str) and len(value) > limits.MAX_ECHOED_VALUE_CHARS:
        value = value[: limits.MAX_ECHOED_VALUE_CHARS + 1]  # never repr a huge string whole
    return cut(repr(value), limits.MAX_ECHOED_VALUE_CHARS)


def has_lone_surrogate(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


def usable_custom_id(value: Any) -> TypeGuard[str]:
    """A custom_id a result line can carry: a non-empty string of at most MAX_CUSTOM_ID_CHARS
    characters, valid Unicode."""
    return isinstance(value, str) and 0 < len(value) <= limits.MAX_CUSTOM_ID_CHARS and not has_lone_surrogate(value)


#: A JSON escape of a UTF-16 surrogate: the only way a lone one can get into a parsed line.
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")


def _deeper_than(obj: Any, limit: int) -> bool:
    """Whether ``obj`` nests containers more than ``limit`` levels (iteratively: no recursion)."""
    stack = [(obj, 1)]
    while stack:
        value, depth = stack.pop()
        if depth > limit:
            return True
        children = value.values() if isinstance(value, dict) else value
        stack.extend((child, depth + 1) for child in children if isinstance(child, (dict, list)))
    return False


def parse_request(line: RawLine) -> dict[str, Any]:
    """The JSON object on a line, or LineError: invalid_json_line (not UTF-8, not JSON, not an
    object, nested deeper than MAX_JSON_DEPTH, a lone surrogate anywhere but the custom_id), or
    invalid_value for a custom_id holding a lone surrogate."""
    if line.too_long:
        raise LineError("line_too_large", f"Line {line.number} is larger than the maximum line size.")
    try:
        obj = json.loads(line.text.decode("utf-8"))
    except UnicodeDecodeError:
        raise LineError("invalid_json_line", f"Line {line.number} is not valid UTF-8.") from None
    except RecursionError:
        raise LineError("invalid_json_line", _too_deep(line)) from None
    except ValueError:
        raise LineError("invalid_json_line", f"Line {line.number} is not valid JSON.") from None
    if not isinstance(obj, dict):
        raise LineError("invalid_json_line", f"Line {line.number} is not a JSON object.")
    # Cheap screens first: a line with few brackets cannot nest deeply, a line without a
    # surrogate escape cannot hold a lone surrogate (raw UTF-8 cannot encode one).
    if line.text.count(b"{") + line.text.count(b"[") > limits.MAX_JSON_DEPTH and _deeper_than(
        obj, limits.MAX_JSON_DEPTH
    ):
        raise LineError("invalid_json_line", _too_deep(line))
    if _SURROGATE_ESCAPE.search(line.text):
        custom_id = obj.get("custom_id")
        if isinstance(custom_id, str) and has_lone_surrogate(custom_id):
            raise LineError(
                "invalid_value",
                "Invalid value for 'custom_id': it contains a lone UTF-16 surrogate escape (\\ud800-\\udfff), "
                "which is not valid Unicode.",
                "custom_id",
            )
        if has_lone_surrogate(json.dumps(obj, ensure_ascii=False)):
            raise LineError(
                "invalid_json_line",
                f"Line {line.number} contains a lone UTF-16 surrogate escape (\\ud800-\\udfff), "
                "which is not valid Unicode.",
            )
    return obj


def _too_deep(line: RawLine) -> str:
    return f"Line {line.number} nests JSON deeper than {limits.MAX_JSON_DEPTH} levels."


def check_request(obj: dict[str, Any], *, endpoint: str, allowed_media_domains: Iterable[str] = ()) -> tuple[str, str]:
    """Check one request line's own fields; returns (custom_id, model).

    The body's shape is the endpoint's, and the engine's to judge, as OpenAI's validation leaves
    it to the request: only ``body.model`` (which routes the batch) is required here, so every
    endpoint's body passes: ``messages`` (chat), ``prompt`` (completions), ``input`` (embeddings,
    and responses, with ``instructions``), ``text_1``/``text_2`` (score), ``query``/``documents``
    (rerank). A body the engine refuses becomes that line's 400 in the error file. The audio
    endpoints are the exception: their body's ``file_url`` and options are checked here
    (``check_audio_body``; ``allowed_media_domains``: the hosts an ``http(s)`` URL may name)."""
    if "custom_id" not in obj:
        raise LineError("missing_required_parameter", "Missing required parameter: 'custom_id'.", "custom_id")
    custom_id = obj["custom_id"]
    if not isinstance(custom_id, str) or not custom_id:
        raise LineError("invalid_value", "Invalid value for 'custom_id': it must be a non-empty string.", "custom_id")
    if len(custom_id) > limits.MAX_CUSTOM_ID_CHARS:
        raise LineError(
            "invalid_value",
            f"Invalid value for 'custom_id': it has {len(custom_id)} characters; at most "
            f"{limits.MAX_CUSTOM_ID_CHARS} are allowed.",
            "custom_id",
        )
    method = obj.get("method")
    if method != "POST":
        raise LineError(
            "invalid_method", f"Invalid value for 'method': {shown(method)}. Only 'POST' is supported.", "method"
        )
    url = obj.get("url")
    if url != endpoint:
        raise LineError(
            "invalid_url",
            f"The url {shown(url)} does not match the batch's endpoint {endpoint!r}: every line of a batch "
            f"uses the batch's endpoint.",
            "url",
        )
    body = obj.get("body")
    if not isinstance(body, dict):
        raise LineError("missing_required_parameter", "Missing required parameter: 'body' (a JSON object).", "body")
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise LineError("missing_required_parameter", "Missing required parameter: 'body.model'.", "body.model")
    stream = body.get("stream")
    if stream is True:
        raise LineError(
            "invalid_value", "Streaming is not supported in batches: 'body.stream' must not be true.", "body.stream"
        )
    if stream is not None and not isinstance(stream, bool):
        # OpenAI's schema types it boolean; an engine would read "True" or 1 as streaming on.
        raise LineError(
            "invalid_type",
            f"Invalid type for 'body.stream': expected a boolean, but got {shown(stream)}.",
            "body.stream",
        )
    if endpoint in limits.AUDIO_ENDPOINTS:
        check_audio_body(body, endpoint=endpoint, allowed_media_domains=allowed_media_domains)
    return custom_id, model


# --- audio lines (/v1/audio/transcriptions, /v1/audio/translations) -----------------------------
#: OpenAI's ``response_format`` values of TranscriptionCreateParams and TranslationCreateParams.
AUDIO_RESPONSE_FORMATS = ("json", "text", "srt", "verbose_json", "vtt")
#: OpenAI's ``timestamp_granularities`` items (transcriptions only).
TIMESTAMP_GRANULARITIES = ("word", "segment")
_BASE64 = re.compile(r"[A-Za-z0-9+/]*={0,2}")
_FILE_URL = "body.file_url"


def check_audio_body(body: dict[str, Any], *, endpoint: str, allowed_media_domains: Iterable[str] = ()) -> None:
    """An audio line's body, as vLLM's run-batch takes it: the audio as ``file_url`` (an
    ``http(s)`` URL on an allowed host, or a base64 ``data:`` URL of at most
    ``limits.MAX_AUDIO_BYTES``), never ``file``; OpenAI's optional fields typed. Raises LineError."""
    if "file" in body:
        raise LineError(
            "invalid_value",
            "The 'body.file' field is not supported in batches: give the audio as 'body.file_url' "
            "(an http(s) URL or a base64 data: URL).",
            "body.file",
        )
    if "file_url" not in body:
        raise LineError("missing_required_parameter", "Missing required parameter: 'body.file_url'.", _FILE_URL)
    url = body["file_url"]
    if not isinstance(url, str):
        raise LineError(
            "invalid_type", f"Invalid type for 'body.file_url': expected a string, but got {shown(url)}.", _FILE_URL
        )
    check_file_url(url, allowed_media_domains=allowed_media_domains)
    _check_audio_options(body, endpoint)


def check_file_url(url: str, *, allowed_media_domains: Iterable[str], max_bytes: int = limits.MAX_AUDIO_BYTES) -> str:
    """A ``file_url`` fit to fetch: its host (lowercase) for an ``http(s)`` URL, "" for a ``data:``
    URL (its decoded size checked by arithmetic, its alphabet by a pattern: nothing is decoded).
    Raises LineError (``invalid_value``, param ``body.file_url``); messages never echo the URL's
    path or query (they may carry a signature)."""
    scheme, sep, _ = url.partition(":")
    scheme = scheme.lower()
    if not sep or scheme not in ("http", "https", "data"):
        raise _bad_url(f"its scheme must be http, https or data, but it is {shown(scheme if sep else url[:10])}.")
    if scheme == "data":
        data_url_size(url, max_bytes=max_bytes)
        return ""
    return url_host(url, allowed_media_domains)


def data_url_size(url: str, *, max_bytes: int) -> int:
    """The decoded size of a base64 ``data:`` URL (``data:[<mediatype>];base64,<data>``), checked
    to be 1..``max_bytes`` bytes of valid base64 without decoding it. Raises LineError."""
    header, comma, data = url.partition(",")
    if not comma or not header.lower().endswith(";base64"):
        raise _bad_url("a data: URL must be base64 ('data:<media type>;base64,<data>').")
    padding = len(data) - len(data.rstrip("="))
    size = len(data) * 3 // 4 - padding
    if size > max_bytes:
        raise _bad_url(f"its audio is {size} bytes; at most {max_bytes} are allowed.")
    if not data or len(data) % 4 or padding > 2 or not _BASE64.fullmatch(data):
        raise _bad_url("its data is not valid base64 audio.")
    return size


def url_host(url: str, allowed_media_domains: Iterable[str]) -> str:
    """The host of an ``http(s)`` URL, lowercase, if it is one of ``allowed_media_domains``
    (exact match: no subdomains; an IP literal only if listed). Raises LineError."""
    if any(c in url for c in "\\ \t\r\n") or not url.isprintable():
        raise _bad_url("it contains whitespace, control characters or backslashes.")
    try:
        parts = urlsplit(url)
        host = (parts.hostname or "").lower()
        parts.port  # noqa: B018 (a malformed port raises)
    except ValueError:
        raise _bad_url("it is not a valid URL.") from None
    if "@" in parts.netloc:
        raise _bad_url("it must not carry credentials ('user@').")
    if not host:
        raise _bad_url("it has no host.")
    allowed = {domain.lower() for domain in allowed_media_domains}
    if host not in allowed:
        what = "the IP address" if _is_ip(host) else "the host"
        listed = ", ".join(sorted(allowed)) if allowed else "none (only data: URLs are accepted)"
        raise _bad_url(f"{what} {shown(host)} is not an allowed media domain; allowed: {listed}.")
    return host


def _is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


def _bad_url(why: str) -> LineError:
    return LineError("invalid_value", f"Invalid value for 'body.file_url': {why}", _FILE_URL)


def _check_audio_options(body: dict[str, Any], endpoint: str) -> None:
    """OpenAI's optional fields, typed as its TranscriptionCreateParams/TranslationCreateParams
    (anything else is the engine's to judge)."""
    for name in ("language", "prompt"):
        if name in body and not isinstance(body[name], str):
            raise _bad_type(name, "a string", body[name])
    if "response_format" in body and body["response_format"] not in AUDIO_RESPONSE_FORMATS:
        raise LineError(
            "invalid_value",
            f"Invalid value for 'body.response_format': {shown(body['response_format'])}. Supported values are: "
            + ", ".join(repr(f) for f in AUDIO_RESPONSE_FORMATS)
            + ".",
            "body.response_format",
        )
    if "temperature" in body:
        _check_temperature(body["temperature"])
    if "timestamp_granularities" in body:
        _check_granularities(body["timestamp_granularities"], endpoint)


def _check_temperature(value: Any) -> None:
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        raise _bad_type("temperature", "a number", value)
    if not 0 <= value <= 1:
        raise LineError(
            "invalid_value",
            f"Invalid value for 'body.temperature': {shown(value)}; it must be between 0 and 1.",
            "body.temperature",
        )


def _check_granularities(value: Any, endpoint: str) -> None:
    param = "body.timestamp_granularities"
    if endpoint != limits.TRANSCRIPTIONS:
        raise LineError("invalid_value", f"'{param}' is supported by {limits.TRANSCRIPTIONS} only.", param)
    if not isinstance(value, list):
        raise _bad_type("timestamp_granularities", "an array", value)
    for item in value:
        if item not in TIMESTAMP_GRANULARITIES:
            raise LineError(
                "invalid_value",
                f"Invalid value for '{param}': {shown(item)}. Supported values are: 'word', 'segment'.",
                param,
            )


def _bad_type(name: str, expected: str, value: Any) -> LineError:
    return LineError(
        "invalid_type", f"Invalid type for 'body.{name}': expected {expected}, but got {shown(value)}.", f"body.{name}"
    )
