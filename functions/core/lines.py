"""Reading and validating batch input lines, shared by ingest (whole file) and the worker (a chunk).

Both read the same bytes with the same rules: a UTF-8 BOM at the very start is skipped, a CR before
LF is dropped, blank lines are skipped (but counted, so line numbers are the file's own, 1-based),
and a line longer than the limit is reported without being held in memory.

Hostile content never reaches an exception past this module: a line nested deeper than
MAX_JSON_DEPTH, or holding a lone UTF-16 surrogate (``"\\ud800"`` is valid JSON but not Unicode:
no result line carrying it could be written), is a LineError; client values echoed in messages are
cut to a short prefix, and every message to MAX_ERROR_MESSAGE_CHARS.
"""

import json
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any, TypeGuard

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


def check_request(obj: dict[str, Any], *, endpoint: str) -> tuple[str, str]:
    """Check one request line's own fields; returns (custom_id, model).

    The body's shape is the endpoint's, and the engine's to judge, as OpenAI's validation leaves
    it to the request: only ``body.model`` (which routes the batch) is required here, so every
    endpoint's body passes: ``messages`` (chat), ``prompt`` (completions), ``input`` (embeddings,
    and responses, with ``instructions``), ``text_1``/``text_2`` (score), ``query``/``documents``
    (rerank). A body the engine refuses becomes that line's 400 in the error file."""
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
    return custom_id, model
