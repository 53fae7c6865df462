"""The line reader (functions/core/lines.py) on reads that split lines anywhere: a line split
exactly at the 1 MiB read boundary, a newline or CRLF or BOM split across reads, a multi-byte UTF-8
character split across reads, and a too-long line spanning reads. Offsets are the file's own."""

import itertools
import json

import pytest

from functions.core.lines import iter_lines, parse_request

MIB = 1024 * 1024


def reads(data: bytes, *cuts: int) -> list[bytes]:
    """``data`` as the reads an object store returns, split at ``cuts``."""
    bounds = [0, *cuts, len(data)]
    return [data[a:b] for a, b in itertools.pairwise(bounds)]


def request(custom_id: str, content: str = "hi", pad: int = 0) -> bytes:
    body = {"model": "m", "messages": [{"role": "user", "content": content}], "pad": "x" * pad}
    return json.dumps(
        {"custom_id": custom_id, "method": "POST", "url": "/v1/chat/completions", "body": body}, ensure_ascii=False
    ).encode()


def padded_to(custom_id: str, size: int) -> bytes:
    """A request line of exactly ``size`` bytes (without its newline)."""
    line = request(custom_id, pad=size - len(request(custom_id)))
    assert len(line) == size
    return line


def summary(lines):
    return [(l.number, l.start, l.end, l.too_long, l.text) for l in lines]


@pytest.mark.parametrize("where", ["newline_last_in_first_read", "newline_first_in_second_read", "mid_line"])
def test_a_line_split_at_the_1_mib_read_boundary(where):
    # Line 1 is long: its newline sits at byte MIB - 1 (last byte of the first read), at MIB (first
    # byte of the second read), or the boundary falls inside line 2.
    first_len = {"newline_last_in_first_read": MIB - 1, "newline_first_in_second_read": MIB, "mid_line": MIB - 40}[
        where
    ]
    first, second, third = padded_to("a", first_len), request("b"), request("c")
    data = first + b"\n" + second + b"\n" + third + b"\n"
    got = list(iter_lines(reads(data, MIB), max_line_bytes=2 * MIB))
    one, two = first_len + 1, first_len + 1 + len(second) + 1
    assert summary(got) == [
        (1, 0, one, False, first),
        (2, one, two, False, second),
        (3, two, len(data), False, third),
    ]
    assert [parse_request(l)["custom_id"] for l in got] == ["a", "b", "c"]


def test_the_same_lines_whatever_the_read_size():
    data = (
        b"\xef\xbb\xbf"
        + request("a", "caf\u00e9 \u65e5\u672c")
        + b"\r\n\r\n"
        + request("b", "\U0001f600")
        + b"\n"
        + request("c")
    )
    whole = summary(iter_lines([data], max_line_bytes=10_000))
    for size in (1, 2, 3, 5, 7, 64):
        split = [data[i : i + size] for i in range(0, len(data), size)]
        assert summary(iter_lines(split, max_line_bytes=10_000)) == whole, size
    assert [l.number for l in iter_lines([data], max_line_bytes=10_000) if not l.blank] == [1, 3, 4]


def test_a_multibyte_character_split_across_reads_decodes_whole():
    line = request("x", "\u00e9\u20ac\U0001f600")  # 2-, 3- and 4-byte UTF-8
    for char in ("\u00e9", "\u20ac", "\U0001f600"):
        encoded = char.encode()
        at = line.index(encoded) + 1  # inside the character
        (got,) = list(iter_lines(reads(line + b"\n", at), max_line_bytes=1000))
        assert got.text == line and (got.start, got.end) == (0, len(line) + 1)
        assert parse_request(got)["body"]["messages"][0]["content"] == "\u00e9\u20ac\U0001f600"


def test_crlf_and_bom_split_across_reads():
    data = b"\xef\xbb\xbf" + request("a") + b"\r\n" + request("b") + b"\r\n"
    cut_bom, cut_crlf = 1, 3 + len(request("a")) + 1  # inside the BOM; between CR and LF
    got = list(iter_lines(reads(data, cut_bom, cut_crlf), max_line_bytes=1000))
    assert [l.text for l in got] == [request("a"), request("b")]
    assert (got[0].start, got[0].end, got[1].start, got[1].end) == (0, cut_crlf + 1, cut_crlf + 1, len(data))


def test_a_too_long_line_spanning_reads_is_reported_and_the_next_line_is_intact():
    limit = 1000
    long_line, short = padded_to("big", 5000), request("next")
    data = long_line + b"\n" + short + b"\n"
    got = list(iter_lines(reads(data, 300, 2000, 5001), max_line_bytes=limit))
    assert summary(got) == [(1, 0, 5001, True, b""), (2, 5001, len(data), False, short)]
    # exactly at the limit is not too long, one byte more is
    at_limit = list(iter_lines(reads(padded_to("a", limit) + b"\r\n", 500), max_line_bytes=limit))
    over = list(iter_lines(reads(padded_to("a", limit + 1) + b"\n", 500), max_line_bytes=limit))
    assert (at_limit[0].too_long, over[0].too_long) == (False, True)


def test_a_chunk_read_from_its_offset_keeps_the_file_numbers():
    data = request("a") + b"\n\n" + request("b") + b"\n"
    start = len(request("a")) + 2
    got = list(iter_lines(reads(data[start:], 5), max_line_bytes=1000, start=start, first_number=3))
    assert summary(got) == [(3, start, len(data), False, request("b"))]
