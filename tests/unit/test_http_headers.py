"""functions.core.http.content_disposition: RFC 6266 / RFC 5987 for any file name. A client
reading ``filename*`` (RFC 5987: charset ``UTF-8``, empty language, percent-encoded octets) gets
the exact name back; the header itself is always printable ASCII."""

import re
from urllib.parse import unquote

import pytest

from functions.core.http import content_disposition

#: RFC 5987 ext-value with charset UTF-8 and no language: UTF-8''<pct-encoded attr-chars>
EXT_VALUE = re.compile(r"filename\*=UTF-8''([A-Za-z0-9!#$&+\-.^_`|~%]*)$", re.IGNORECASE)


def parsed_name(header: str) -> str:
    """What an RFC 6266 recipient uses: ``filename*`` when present."""
    match = EXT_VALUE.search(header)
    assert match, header
    return unquote(match.group(1), encoding="utf-8", errors="strict")


def test_a_plain_name_is_only_the_quoted_filename():
    assert content_disposition("input.jsonl") == 'attachment; filename="input.jsonl"'


def test_the_rfc_6266_example_euro_rates():
    # RFC 6266 section 5: filename="EURO rates"; filename*=utf-8''%e2%82%ac%20rates
    assert content_disposition("€ rates") == "attachment; filename=\"_ rates\"; filename*=UTF-8''%E2%82%AC%20rates"


def test_the_rfc_5987_attr_chars_are_not_encoded():
    # RFC 5987 attr-char: ALPHA / DIGIT / "!" / "#" / "$" / "&" / "+" / "-" / "." / "^" / "_" / "`" / "|" / "~"
    name = "a!#$&+-.^_`|~z"
    assert content_disposition(name) == f'attachment; filename="{name}"'
    assert content_disposition(name + " é").endswith("filename*=UTF-8''a!#$&+-.^_`|~z%20%C3%A9")


@pytest.mark.parametrize(
    ("name", "fallback"),
    [
        ('say "hi".jsonl', "say _hi_.jsonl"),
        ("back\\slash.jsonl", "back_slash.jsonl"),
        ("x\r\nSet-Cookie: a=b", "x__Set-Cookie: a=b"),
        ("nul\x00.jsonl", "nul_.jsonl"),
        ("100%.jsonl", "100_.jsonl"),  # RFC 6266 appendix D: no % in the fallback
        ("日本語.jsonl", "___.jsonl"),
        ("😀", "_"),
        ("café.jsonl", "caf_.jsonl"),  # Latin-1, but not ASCII
    ],
)
def test_any_name_gives_a_safe_fallback_and_the_exact_name_in_filename_star(name, fallback):
    header = content_disposition(name)
    assert header.isascii() and all(" " <= c <= "~" for c in header)
    assert header.startswith(f"attachment; filename=\"{fallback}\"; filename*=UTF-8''")
    assert parsed_name(header) == name


def test_an_empty_name_falls_back_to_file():
    assert content_disposition("") == 'attachment; filename="file"'
