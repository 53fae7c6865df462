"""Secret detection in time linear in the text: detect-secrets' plugins with their regexes run by
RE2, and the scan's own normalization (docs/governance.md, "Prompt and output policies").

**Detection** is the plugins' own (``analyze_string``: a JWT must decode, for one) with each
plugin's ``denylist`` compiled for RE2 (``google-re2``: no backtracking, so no pattern costs more
than a pass over the text). Python's backtracking ``re`` is quadratic on several of them: NPM's
``//.+/:_authToken=`` scans to the end of the line from every ``//``, OpenAI's ``sk-[...]*`` and
JWT's ``eyJ[...]+`` rescan a long token run from every prefix in it (a 32 KiB line of ``//`` took
4 s, so 1 MiB about an hour). Python's ``\\d`` and ``\\s`` mean Unicode digits and spaces, so they
are rewritten into the classes RE2 needs for the same meaning. A pattern RE2 cannot run
(GitLab's ``(?!\\w)`` lookahead; its ``{50,1024}``) stays on Python's ``re``: those are a literal
prefix and a bounded token, linear already (``LINEAR_ON_PYTHON_RE`` lists them; a test holds it).

**Spans**: a plugin's match is where the secret starts; the redacted span is extended over the rest
of the token, a PEM block to its END line, a JWT to its signature. Each extension is computed
so that a run of text is read once per regex (the runs' ends are remembered), never once per match.

**Normalization** (``normalize``): what a reader or a tokenizer would not see is removed and
compatibility forms folded, so ``AKIA<ZWSP>IOSF...`` or a full-width ``ＡＫＩＡ...`` is seen as the
key it spells. Invisible and format characters (category Cf: zero-width space and joiners, word
joiner, soft hyphen, BOM, bidi controls, tag characters), combining marks (M*, variation selectors
among them), control characters other than whitespace, and the Hangul fillers are removed, and
NFKD folds compatibility forms (full-width, mathematical, circled, ligatures) and splits accented
letters, whose marks are removed too. It is done character by character through a table built once
(``str.translate``), never by ``unicodedata.normalize`` on the text: CPython's canonical reordering
is quadratic in a run of combining marks (400,000 of them took 156 s).

**Many texts at once** (``scan``): the texts are joined with ``SEPARATOR`` and scanned in one pass
per regex, and the findings mapped back to each text; the separator holds a NUL between two line
feeds, which no detector can match across (only ``\\s`` matches a line feed, and nothing after it
matches a NUL), so every text's findings are what scanning it alone finds.
"""

from __future__ import annotations

import bisect
import importlib
import re
import unicodedata
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache
from typing import Any

#: The detect-secrets plugins used, by module and class (their ``secret_type`` names the type in
#: messages and redactions). Left out: Base64/Hex high-entropy strings (hashes, ids and base64 data
#: in ordinary prompts), Secret Keyword (any ``password = "..."`` in a code sample; and about 500 us
#: per line), Public IP (not a secret), and the keyword-context vendor detectors Cloudant, IBM Cloud
#: IAM, IBM COS HMAC and SoftLayer (they flag ``key = "..."`` assignments in code samples, and cost
#: about 185 us per line together), and Artifactory (its ``AP[0-9A-F]...`` token is any spaced word
#: of 11+ letters such as "APACHECOMMONS"; and it alone cost a quarter of the scan).
SECRET_DETECTORS: tuple[tuple[str, str], ...] = (
    ("aws", "AWSKeyDetector"),
    ("private_key", "PrivateKeyDetector"),
    ("github_token", "GitHubTokenDetector"),
    ("gitlab_token", "GitLabTokenDetector"),
    ("slack", "SlackDetector"),
    ("stripe", "StripeDetector"),
    ("jwt", "JwtTokenDetector"),
    ("openai", "OpenAIDetector"),
    ("azure_storage_key", "AzureStorageKeyDetector"),
    ("basic_auth", "BasicAuthDetector"),
    ("discord", "DiscordBotTokenDetector"),
    ("mailchimp", "MailchimpDetector"),
    ("npm", "NpmDetector"),
    ("pypi_token", "PypiTokenDetector"),
    ("sendgrid", "SendGridDetector"),
    ("square_oauth", "SquareOAuthDetector"),
    ("telegram_token", "TelegramBotTokenDetector"),
    ("twilio", "TwilioKeyDetector"),
)

#: The plugins whose regexes RE2 cannot run and which stay on Python's ``re``: each is a literal
#: prefix and a bounded token (so linear in the text); a test asserts no other plugin is here.
LINEAR_ON_PYTHON_RE = frozenset({"GitLabTokenDetector"})

#: Joins the texts of one ``scan``: no detector matches across it (see the module docstring).
SEPARATOR = "\n\x00\n"


@dataclass(frozen=True)
class Secret:
    """One secret found in a string: its detect-secrets type and where it is (start, end)."""

    type: str
    start: int
    end: int


# --- normalization ---------------------------------------------------------------------------
#: Whitespace that Python's ``\s`` (and ``str.isspace``) means, which RE2's ``\s`` does not all mean.
_SPACES = [chr(c) for c in range(0x3001) if chr(c).isspace()]
#: Invisible characters that are not Cf, M* or Cc: the Hangul fillers and the unassigned
#: default-ignorable code points (Unicode's DerivedCoreProperties, Default_Ignorable_Code_Point).
_OTHER_INVISIBLE = (0x115F, 0x1160, 0x3164, 0xFFA0, 0x2065, *range(0xFFF0, 0xFFF9), *range(0xE0000, 0xE1000))
#: Where every character that decomposes, is a mark, a format or a control character lies.
_PLANES = (*range(0x20000), *range(0xE0000, 0xE1000))


@cache
def _folding() -> dict[int, str | None]:
    """What ``normalize`` does to each character it changes: None (removed) or its NFKD
    decomposition with the marks taken out (built once per process, about 50 ms)."""
    table: dict[int, str | None] = dict.fromkeys(_OTHER_INVISIBLE)
    for code in _PLANES:
        char = chr(code)
        category = unicodedata.category(char)
        if category == "Cf" or category[0] == "M" or (category == "Cc" and not char.isspace()):
            table[code] = None
            continue
        folded = unicodedata.normalize("NFKD", char)
        if folded != char:
            table[code] = "".join(c for c in folded if unicodedata.category(c)[0] != "M")
    return table


def normalize(text: str) -> str:
    """``text`` as the scan reads it (module docstring): character by character, which is the
    same as NFKD of the whole text with the marks removed, since NFKD's canonical reordering
    only moves marks (every character of a nonzero combining class is a mark); an ASCII text
    without control characters is returned as it is."""
    if text.isascii() and _ASCII_CONTROL.search(text) is None:
        return text
    return text.translate(_folding())


_ASCII_CONTROL = re.compile(r"[\x00-\x08\x0e-\x1b\x7f]")
_SURROGATE = re.compile("[\ud800-\udfff]")


# --- the detectors, compiled for linear time -------------------------------------------------
def _rewrite(pattern: str, *, ignorecase: bool) -> str | None:
    """A Python (``str``) pattern written for RE2 with the same meaning: ``\\d`` as Unicode decimal
    digits, ``\\s`` as Python's whitespace, and (ignoring case) ``i`` as Python's ignore-case
    ``i``, which also matches the Turkish dotted and dotless i (RE2's case folding does not); None
    if it uses an escape this does not translate (``\\w``, ``\\b``: left to Python's ``re``)."""
    spaces = "".join(f"\\x{{{ord(c):x}}}" for c in _SPACES)
    out: list[str] = []
    i, opened = 0, -1  # where the open character class started in ``pattern`` (-1: none)
    while i < len(pattern):
        char = pattern[i]
        if char == "\\" and i + 1 < len(pattern):
            escape = pattern[i + 1]
            if escape == "d":
                out.append(r"\p{Nd}")
            elif escape == "s":
                out.append(spaces if opened >= 0 else f"[{spaces}]")
            elif escape in "DSwWbBAZ":
                return None
            else:
                out.append(pattern[i : i + 2])
            i += 2
            continue
        if char == "[" and opened < 0:
            opened = i
            out.append(char)
            i += 1
            for prefix in ("^", "]"):
                if pattern.startswith(prefix, i):
                    out.append("^" if prefix == "^" else r"\]")
                    i += 1
            continue
        if char == "]" and opened >= 0:
            members = "[" + pattern[opened + 1 : i].removeprefix("^") + "]"
            if ignorecase and re.fullmatch(members, "i", re.IGNORECASE):
                out.append(_TURKISH_I)  # in a negated class too: Python's excludes them then
            opened = -1
        elif ignorecase and opened < 0 and char in "iI":
            char = f"[i{_TURKISH_I}]"
        out.append(char)
        i += 1
    return "".join(out)


#: What Python's ignore-case ``i`` matches beyond ``iI`` (RE2's folding leaves these out).
_TURKISH_I = "\u0130\u0131"


def linear_regex(regex: re.Pattern[str]) -> Any | None:
    """``regex`` compiled by RE2 with the same meaning, or None if RE2 cannot run it."""
    import re2  # a worker dependency (the Lambdas never scan)

    if regex.flags & re.VERBOSE and re.search(r"[\s#]", regex.pattern):
        return None  # VERBOSE would change its meaning; RE2 has no such mode
    pattern = _rewrite(regex.pattern, ignorecase=bool(regex.flags & re.IGNORECASE))
    if pattern is None:
        return None
    flags = "".join(
        flag for bit, flag in ((re.IGNORECASE, "i"), (re.DOTALL, "s"), (re.MULTILINE, "m")) if regex.flags & bit
    )
    options = re2.Options()
    options.log_errors = False
    try:
        return re2.compile(f"(?{flags}){pattern}" if flags else pattern, options)
    except re2.error:
        return None


@cache
def _detectors() -> tuple[Any, ...]:
    """Every plugin of SECRET_DETECTORS, its ``denylist`` run by RE2 where RE2 can."""
    plugins = []
    for module, name in SECRET_DETECTORS:
        plugin = getattr(importlib.import_module(f"detect_secrets.plugins.{module}"), name)()
        compiled = [linear_regex(regex) for regex in plugin.denylist]
        if all(c is not None for c in compiled):
            plugin.denylist = tuple(compiled)
        elif name not in LINEAR_ON_PYTHON_RE:
            raise RuntimeError(
                f"RE2 cannot run every regex of {name}: add it to LINEAR_ON_PYTHON_RE only if "
                "they are linear on Python's re"
            )
        plugins.append(plugin)
    return tuple(plugins)


def on_python_re() -> set[str]:
    """The plugins whose regexes run on Python's ``re`` (for the tests)."""
    return {type(p).__name__ for p in _detectors() if any(isinstance(r, re.Pattern) for r in p.denylist)}


# --- spans -----------------------------------------------------------------------------------
#: Token characters a match is extended over; the characters of a PEM header's words.
_TOKEN = re.compile(r"[A-Za-z0-9_+/=-]*")
_HEADER_WORDS = re.compile(r"[A-Z0-9 ]*")
#: A JWT from its start to its signature (possessive: none of its classes holds a dot, so this is
#: the greedy match without backtracking).
_JWT = re.compile(r"eyJ[A-Za-z0-9_=-]++\.[A-Za-z0-9_=-]++(?:\.[A-Za-z0-9_.+/=-]*+)?")
#: Where a PEM block or a PuTTY key ends (overlapping occurrences: each start is a candidate).
_PEM_END = re.compile(r"(?=(-----END [A-Z0-9 ]*PRIVATE KEY(?: BLOCK)?-----))")
_PUTTY_END = re.compile(r"(?=(Private-MAC: \w+))")
_PUTTY = "PuTTY-User-Key-File-2"


class _Ends:
    """Where the runs of one character class end, each run read once while queries do not go
    back (one regex's matches come in order)."""

    def __init__(self, text: str, run: re.Pattern[str]):
        self.text, self.run = text, run
        self.low, self.high = -1, -1

    def __call__(self, pos: int) -> int:
        if not self.low <= pos <= self.high:
            run = self.run.match(self.text, pos)
            assert run is not None  # a run's pattern matches the empty string too
            self.low, self.high = pos, run.end()
        return self.high


class _Markers:
    """The start and end of every occurrence of an end marker, found at first need."""

    def __init__(self, text: str, marker: re.Pattern[str]):
        self.text, self.marker = text, marker
        self.starts: list[int] | None = None
        self.ends: list[int] = []

    def first_end(self, pos: int, limit: int) -> int:
        """The end of the first marker starting at or after ``pos`` and ending by ``limit``, else ``limit``."""
        if self.starts is None:
            found = [(m.start(), m.start() + len(m.group(1))) for m in self.marker.finditer(self.text)]
            self.starts, self.ends = [s for s, _ in found], [e for _, e in found]
        index = bisect.bisect_left(self.starts, pos)
        if index < len(self.starts) and self.ends[index] <= limit:
            return self.ends[index]
        return limit


class _Spans:
    """The span of each match of one regex (in order) in ``text``, by the rules of the module
    docstring; ``limit``: the end of the text the match is in."""

    def __init__(self, text: str, pem: _Markers, putty: _Markers):
        self.text, self.pem, self.putty = text, pem, putty
        self.tails = _Ends(text, _TOKEN)
        self.words = _Ends(text, _HEADER_WORDS)
        self.jwt_end = -1

    def __call__(self, start: int, end: int, limit: int) -> tuple[int, int]:
        text = self.text
        first = start - 5 if text.startswith("-----", start - 5) and start >= 5 else start
        if text.startswith("BEGIN ", start):
            whole = self._pem(start, limit)
            if whole is not None:
                return first, whole
        elif text.startswith(_PUTTY, start):
            return first, self.putty.first_end(start + len(_PUTTY), limit)
        elif text.startswith("eyJ", start):
            if start < self.jwt_end:
                return first, max(end, self.jwt_end)  # inside the last JWT's span: it ends there too
            jwt = _JWT.match(text, start)
            if jwt is not None and jwt.end() >= end:
                self.jwt_end = jwt.end()
                return first, jwt.end()
        if start == end or not _TOKEN.fullmatch(text[end - 1]):
            return first, end  # the match closes the secret (a URL's ``user:password@``, a quote)
        return first, self.tails(end)

    def _pem(self, start: int, limit: int) -> int | None:
        """Where the PEM block whose header starts at ``start`` ends (its END line, else the end
        of the text), or None without a whole header (``BEGIN ... PRIVATE KEY[ BLOCK]-----``)."""
        words = self.words(start)
        if not self.text.startswith("-----", words):
            return None
        for suffix in ("PRIVATE KEY", "PRIVATE KEY BLOCK"):
            if self.text.endswith(suffix, start, words) and words - len(suffix) >= start + len("BEGIN "):
                return self.pem.first_end(words + 5, limit)
        return None


def _values(match: Any) -> tuple[str, ...]:
    """What ``findall`` reports for a match: its groups that matched something, else the match."""
    groups = match.groups()
    if not groups:
        return (match.group(0),)
    return tuple(g for g in groups if g)


# --- scanning --------------------------------------------------------------------------------
def _joined(texts: Sequence[str]) -> tuple[str, list[int]]:
    """The texts joined by SEPARATOR (lone surrogates as U+FFFD, one for one: RE2 reads UTF-8), and
    where each starts."""
    joined = texts[0] if len(texts) == 1 else SEPARATOR.join(texts)
    starts = [0]
    for text in texts[:-1]:
        starts.append(starts[-1] + len(text) + len(SEPARATOR))
    if _SURROGATE.search(joined):
        joined = _SURROGATE.sub("\ufffd", joined)
    return joined, starts


def types(texts: Sequence[str]) -> set[str]:
    """The types of the secrets in ``texts``: what ``scan`` finds, without locating them (each
    plugin stops at its first reported value)."""
    if not texts:
        return set()
    joined, _ = _joined(texts)
    return {d.secret_type for d in _detectors() if next((v for v in d.analyze_string(joined) if v), None) is not None}


def scan(texts: Sequence[str]) -> list[list[Secret]]:
    """The secrets in each of ``texts`` (as ``find_secrets`` finds them in each alone), all
    scanned together in one pass per regex."""
    if not texts:
        return []
    joined, starts = _joined(texts)
    found: list[Secret] = []
    pem, putty = _Markers(joined, _PEM_END), _Markers(joined, _PUTTY_END)
    for detector in _detectors():
        values = {v for v in detector.analyze_string(joined) if v}
        if not values:
            continue
        for regex in detector.denylist:
            spans = _Spans(joined, pem, putty)
            for match in regex.finditer(joined):
                if not any(v in values for v in _values(match)):
                    continue
                index = bisect.bisect_right(starts, match.start()) - 1
                limit = starts[index] + len(texts[index])
                start, end = spans(match.start(), match.end(), limit)
                found.append(Secret(detector.secret_type, max(start, starts[index]), min(end, limit)))
    return _by_text(merged(found), starts)


def merged(found: list[Secret]) -> list[Secret]:
    """By position, overlapping findings merged (the first type kept)."""
    found.sort(key=lambda s: (s.start, -s.end))
    merged: list[Secret] = []
    for secret in found:
        if merged and secret.start < merged[-1].end:
            last = merged[-1]
            merged[-1] = Secret(last.type, last.start, max(last.end, secret.end))
        else:
            merged.append(secret)
    return merged


def _by_text(merged: list[Secret], starts: list[int]) -> list[list[Secret]]:
    out: list[list[Secret]] = [[] for _ in starts]
    for secret in merged:
        index = bisect.bisect_right(starts, secret.start) - 1
        offset = starts[index]
        out[index].append(Secret(secret.type, secret.start - offset, secret.end - offset))
    return out


def find_secrets(text: str) -> list[Secret]:
    """The secrets in ``text``, by position, overlapping findings merged (the first type kept)."""
    return scan([text])[0]


def redacted(text: str, secrets: Sequence[Secret]) -> str:
    """``text`` with each of ``secrets`` (``find_secrets(text)``) replaced by ``[REDACTED:<type>]``."""
    if not secrets:
        return text
    pieces, at = [], 0
    for secret in secrets:
        pieces.append(text[at : secret.start])
        pieces.append(f"[REDACTED:{secret.type}]")
        at = secret.end
    pieces.append(text[at:])
    return "".join(pieces)


def redact(text: str) -> str:
    """``text`` with every secret replaced by ``[REDACTED:<type>]``."""
    return redacted(text, find_secrets(text))
