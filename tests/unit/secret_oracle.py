"""The reference the linear scan (``functions.core.secret_scan``) is held to: detect-secrets'
plugins on Python's backtracking ``re``, with the span rules written as plain regexes (a PEM block
lazily to its END line, a JWT to its signature, other matches over the token characters that
follow). Quadratic on some inputs, so only for the tests' short random texts.

A match is a finding when a value the plugin reports for it (``findall``'s groups, as
``analyze_string`` yields them) is one the plugin reports at all: for every plugin but JWT that is
every match; a JWT match that does not decode is none, even when a valid JWT found elsewhere in the
text happens to occur inside it."""

import importlib
import re
from functools import cache

from functions.core.secret_scan import SECRET_DETECTORS, Secret, merged

_PEM_BLOCK = re.compile(
    r"(?:-----)?BEGIN [A-Z0-9 ]*PRIVATE KEY(?: BLOCK)?-----.*?(?:-----END [A-Z0-9 ]*PRIVATE KEY(?: BLOCK)?-----|\Z)"
    r"|PuTTY-User-Key-File-2.*?(?:Private-MAC: \w+|\Z)",
    re.DOTALL,
)
_JWT = re.compile(r"eyJ[A-Za-z0-9_=-]+\.[A-Za-z0-9_=-]+(?:\.[A-Za-z0-9_.+/=-]*)?")
_TOKEN_TAIL = re.compile(r"[A-Za-z0-9_+/=-]*")


@cache
def detectors():
    return tuple(getattr(importlib.import_module(f"detect_secrets.plugins.{m}"), n)() for m, n in SECRET_DETECTORS)


def find_secrets(text: str) -> list[Secret]:
    found = []
    for detector in detectors():
        values = {v for v in detector.analyze_string(text) if v}
        if not values:
            continue
        for regex in detector.denylist:
            for match in regex.finditer(text):
                if any(v in values for v in _values(match)):
                    start = match.start() - 5 if text.startswith("-----", match.start() - 5) else match.start()
                    found.append(Secret(detector.secret_type, max(0, start), _end_of(text, match)))
    return merged(found)  # the merge is shared: what is compared is what is found, and where


def _values(match):
    groups = match.groups()
    return (match.group(0),) if not groups else tuple(g for g in groups if g)


def _end_of(text, match):
    for span in (_PEM_BLOCK, _JWT):
        whole = span.match(text, match.start())
        if whole is not None and whole.end() >= match.end():
            return whole.end()
    if not match.group(0) or not _TOKEN_TAIL.fullmatch(match.group(0)[-1]):
        return match.end()
    tail = _TOKEN_TAIL.match(text, match.end())
    return tail.end() if tail is not None else match.end()
