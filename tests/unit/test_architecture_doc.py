"""docs/architecture.md is checked against the tree it describes: every path it names exists, every
package of ``functions/`` and ``gpu_worker/`` is mentioned, and its "Modules over 300 lines" table
lists exactly the modules over 300 lines, each with a count within 15 % of the module's length.

A failure names the path or module that is wrong; fix the doc (or the tree) rather than the test."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "architecture.md"
#: The top-level folders whose paths the doc names and this test checks.
TOP = ("functions", "gpu_worker", "infra", "batchctl", "tests")
#: The folders whose Python modules the "Modules over 300 lines" table covers.
SOURCE = ("functions", "gpu_worker", "infra", "batchctl")
BIG_LINES = 300
TOLERANCE = 0.15
BIG_HEADING = "## Modules over 300 lines"
#: Never part of the tree the doc describes.
SKIP_PARTS = {"__pycache__", "node_modules", "cdk.out", ".venv"}
PATH = re.compile(rf"(?<![\w./-])((?:{'|'.join(TOP)})/[\w./-]*)")


def _text() -> str:
    return DOC.read_text(encoding="utf-8")


def _prose(text: str) -> str:
    """The doc without its fenced code blocks (diagrams name modules by their import names)."""
    return re.sub(r"(?s)```.*?```", "", text)


def _backticked(text: str) -> list[str]:
    return re.findall(r"`([^`\n]+)`", text)


def _named_paths(text: str) -> set[str]:
    """Every path under one of TOP inside a backticked span: ``functions/core/lifecycle.py``,
    ``functions/dlq/``, ``tests/unit/test_imports.py``; a ``::test`` suffix and a trailing
    punctuation mark are dropped, placeholders (``<tenant>``) and globs are not paths."""
    found = set()
    for span in _backticked(_prose(text)):
        for match in PATH.finditer(span):
            path = match.group(1).split("::")[0].rstrip(".,;:")
            if path and not any(c in span[match.start() : match.end() + 1] for c in "<*"):
                found.add(path)
    return found


def _source_modules() -> dict[str, int]:
    """Every Python module under SOURCE with its line count (as ``wc -l`` counts)."""
    modules = {}
    for top in SOURCE:
        for path in (ROOT / top).rglob("*.py"):
            if SKIP_PARTS.isdisjoint(path.relative_to(ROOT).parts):
                modules[path.relative_to(ROOT).as_posix()] = path.read_bytes().count(b"\n")
    return modules


def _big_table(text: str) -> dict[str, int]:
    """The "Modules over 300 lines" table: module -> the count it states (``~555`` -> 555)."""
    assert BIG_HEADING in text, f'docs/architecture.md lacks its "{BIG_HEADING}" section'
    section = text.split(BIG_HEADING, 1)[1].split("\n## ", 1)[0]
    rows = {}
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) < 2 or not cells[0].startswith("`"):
            continue
        module, count = cells[0].strip("`"), re.sub(r"[~,\s]", "", cells[1])
        assert count.isdigit(), f"{module}: the count {cells[1]!r} is not a number"
        assert module not in rows, f"{module} is listed twice in the table"
        rows[module] = int(count)
    return rows


def test_every_path_the_doc_names_exists():
    named = _named_paths(_text())
    assert len(named) > 20, "the doc names hardly any path: did the parser break?"
    missing = sorted(p for p in named if not (ROOT / p).exists())
    assert not missing, f"docs/architecture.md names paths that do not exist: {missing}"


def test_the_core_table_names_modules_that_exist():
    """The ``functions/core`` table names its modules relative to ``functions/core`` (and the
    ``aws/`` row its adapters relative to ``functions/core/aws``)."""
    text = _text()
    section = text.split("### `functions/core`", 1)[1].split("\n#", 1)[0]
    core = ROOT / "functions" / "core"
    missing = []
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) < 2 or not cells[0].startswith("`"):
            continue
        for name in _backticked(cells[0]):
            if not (core / name).exists():
                missing.append(f"functions/core/{name}")
        if cells[0] == "`aws/`":
            for name in _backticked(cells[1]):
                if name.endswith(".py") and not (core / "aws" / name).exists():
                    missing.append(f"functions/core/aws/{name}")
    assert not missing, f"docs/architecture.md's functions/core table names modules that do not exist: {missing}"


def test_every_package_is_mentioned():
    """Every folder under functions/ and gpu_worker/ holding Python (a package) or the engine's
    scripts appears as ``<path>/`` somewhere in the doc."""
    text = _text()
    folders = set()
    for top in ("functions", "gpu_worker"):
        for path in (ROOT / top).rglob("*"):
            rel = path.relative_to(ROOT)
            if path.is_dir() and SKIP_PARTS.isdisjoint(rel.parts) and any(path.iterdir()):
                folders.add(rel.as_posix() + "/")
    unmentioned = sorted(f for f in folders if f"`{f}" not in text and f"{f}`" not in text)
    assert not unmentioned, f"docs/architecture.md never mentions these folders: {unmentioned}"


def test_the_big_modules_table_lists_exactly_the_modules_over_300_lines():
    table = _big_table(_text())
    big = {m: n for m, n in _source_modules().items() if n > BIG_LINES}
    missing = sorted(f"{m} ({n} lines)" for m, n in big.items() if m not in table)
    extra = sorted(f"{m} ({_source_modules().get(m, 'no such module')})" for m in table if m not in big)
    assert not missing, f'modules over {BIG_LINES} lines missing from "Modules over 300 lines": {missing}'
    assert not extra, f'"Modules over 300 lines" lists modules that are not over {BIG_LINES} lines: {extra}'


def test_the_big_modules_counts_are_within_15_percent():
    table = _big_table(_text())
    modules = _source_modules()
    wrong = sorted(
        f"{m}: the doc says ~{stated}, wc -l says {modules[m]}"
        for m, stated in table.items()
        if m in modules and abs(stated - modules[m]) > TOLERANCE * modules[m]
    )
    assert not wrong, f"stale line counts in docs/architecture.md: {wrong}"
