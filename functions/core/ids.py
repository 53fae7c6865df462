"""Object ids that sort by creation time.

An id is ``<prefix><10 chars of milliseconds><16 random chars>`` in Crockford base32 (lowercase), so
the lexicographic order of ids is their creation order (to the millisecond) and "newest first after
a cursor" is a key-range query on the id itself.
"""

import re
import secrets
import time

_ALPHABET = "0123456789abcdefghjkmnpqrstvwxyz"
_TIME_CHARS = 10
_RANDOM_CHARS = 16

FILE = "file-"
UPLOAD = "upload_"
PART = "part_"
BATCH = "batch_"
BATCH_REQUEST = "batch_req_"


def _encode(value: int, width: int) -> str:
    chars = []
    for _ in range(width):
        value, rem = divmod(value, 32)
        chars.append(_ALPHABET[rem])
    return "".join(reversed(chars))


def new_id(prefix: str, now_ms: int | None = None) -> str:
    ms = time.time_ns() // 1_000_000 if now_ms is None else now_ms
    # 16 base32 characters are 80 random bits: one draw, not one per character (the worker makes
    # an id for every result line; docs/benchmarks.md, "Worker ceiling").
    rand = _encode(secrets.randbits(5 * _RANDOM_CHARS), _RANDOM_CHARS)
    return f"{prefix}{_encode(ms, _TIME_CHARS)}{rand}"


_BODY = re.compile(rf"[{_ALPHABET}]{{{_TIME_CHARS + _RANDOM_CHARS}}}")


def is_valid(value: str, prefix: str) -> bool:
    """True when ``value`` has the shape of an id this system issues with ``prefix``."""
    return value.startswith(prefix) and _BODY.fullmatch(value[len(prefix) :]) is not None
