"""Imports go one way: ``infra`` (the CDK app, the local deployment) and ``batchctl`` may import
``functions`` and ``gpu_worker``; ``gpu_worker`` may import ``functions``; never the reverse. And
inside ``functions``, AWS SDK calls live in the adapters: ``boto3``/``botocore`` only in
``functions/core/aws/`` and ``functions/core/clients.py``; Powertools (Lambda glue) neither in
``functions/core`` outside the adapters nor in a Lambda's ``logic.py``.

Every ``import``/``from ... import`` anywhere in a module counts (also inside functions), relative
imports resolved to the absolute module they name.
"""

import ast
import importlib
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imported_modules(source: str, module: str, *, is_package: bool = False) -> Iterator[tuple[int, str]]:
    """(line, absolute module name) of every import in ``source`` (the module ``module``)."""
    package = module.split(".") if is_package else module.split(".")[:-1]
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            yield node.lineno, target
            for alias in node.names:  # `from functions import x` may name a module x
                yield node.lineno, f"{target}.{alias.name}"


def top(name: str) -> str:
    return name.split(".")[0]


def violations(root: str, forbidden: set[str], *, allowed: tuple[str, ...] = ()) -> list[str]:
    """``root``'s modules (a folder, or one module) importing a top-level package in ``forbidden``,
    outside ``allowed`` (paths relative to the repository, a trailing ``/`` for a whole folder)."""
    found = []
    start = REPO / root
    assert start.exists(), root
    for path in sorted(start.rglob("*.py")) if start.is_dir() else [start]:
        rel = path.relative_to(REPO).as_posix()
        if any(rel == a or (a.endswith("/") and rel.startswith(a)) for a in allowed):
            continue
        for line, name in imported_modules(path.read_text(), module_name(path), is_package=path.name == "__init__.py"):
            if top(name) in forbidden:
                found.append(f"{rel}:{line} imports {name}")
    return sorted(set(found))


def test_functions_import_neither_infra_nor_batchctl_nor_the_worker() -> None:
    assert violations("functions", {"infra", "batchctl", "gpu_worker"}) == []


def test_the_worker_imports_neither_infra_nor_batchctl() -> None:
    assert violations("gpu_worker", {"infra", "batchctl"}) == []


def test_aws_sdk_only_in_the_adapters_and_clients() -> None:
    assert violations(
        "functions", {"boto3", "botocore"}, allowed=("functions/core/aws/", "functions/core/clients.py")
    ) == []


def test_powertools_stays_out_of_the_core_and_the_logic_modules() -> None:
    """Powertools is Lambda glue: a Lambda's handler and HTTP layer (routers, error mapping,
    idempotency) may use it; the shared core (also the worker's) and each Lambda's logic may not."""
    assert violations("functions/core", {"aws_lambda_powertools"}, allowed=("functions/core/aws/",)) == []
    logic = sorted((REPO / "functions").glob("*/logic.py"))
    assert len(logic) >= 4  # chunk_dlq, ingest, reaper, workflow
    found = [v for path in logic for v in violations(path.relative_to(REPO).as_posix(), {"aws_lambda_powertools"})]
    assert found == []


#: Modules renamed to say what they are (docs/adr/0053-names.md): old name -> new name. Nothing
#: imports an old name, and no file is left at its path.
RENAMED = {
    "functions.core.accounting": "functions.core.chunk_lifecycle",
    "functions.dlq": "functions.chunk_dlq",
    "functions.ingest.dlq_handler": "functions.ingest_dlq.handler",
    "functions.ingest.dead_letters": "functions.ingest_dlq.logic",
    "functions.core.models": "functions.core.wire",
}
#: Where code that imports ours lives.
SOURCES = ("functions", "gpu_worker", "infra", "batchctl", "tests")


def test_renamed_modules_are_imported_by_their_new_names_only() -> None:
    found = []
    for root in SOURCES:
        for path in sorted((REPO / root).rglob("*.py")):
            if "node_modules" in path.parts:
                continue
            for line, name in imported_modules(path.read_text(), module_name(path), is_package=path.name == "__init__.py"):
                if any(name == old or name.startswith(old + ".") for old in RENAMED):
                    found.append(f"{path.relative_to(REPO).as_posix()}:{line} imports {name}")
    assert sorted(set(found)) == []
    for old, new in RENAMED.items():
        assert not (REPO / old.replace(".", "/")).with_suffix(".py").exists(), old
        assert not (REPO / old.replace(".", "/")).is_dir(), old
        assert importlib.import_module(new), new


def test_every_lambda_handler_the_stack_names_is_importable() -> None:
    """The CDK constructs name each function's handler as a string (``handler="pkg.mod.fn"``): a
    module moved without its string would only fail at invoke time on AWS."""
    handlers = sorted({
        name for path in sorted((REPO / "infra/constructs").glob("*.py"))
        for name in re.findall(r'handler="(functions\.[\w.]+)"', path.read_text())
    })
    assert len(handlers) >= 10, handlers
    for handler in handlers:
        module, _, attribute = handler.rpartition(".")
        assert callable(getattr(importlib.import_module(module), attribute, None)), handler


# --- the checker itself -----------------------------------------------------------------------
@pytest.mark.parametrize(
    ("source", "module", "expected"),
    [
        ("import infra.names", "functions.core.x", "infra.names"),
        ("from infra import names", "functions.core.x", "infra"),
        ("def f():\n    from batchctl import cli", "gpu_worker.loop", "batchctl"),
        ("from ...infra import names", "functions.core.x", "infra"),  # relative, three levels up
        ("import gpu_worker", "functions.api.handler", "gpu_worker"),
    ],
)
def test_checker_sees_every_form_of_import(source: str, module: str, expected: str) -> None:
    assert expected in {name for _, name in imported_modules(source, module)}


def test_relative_imports_resolve_inside_their_package() -> None:
    assert {n for _, n in imported_modules("from . import schema", "functions.core.names")} >= {"functions.core"}
    assert {n for _, n in imported_modules("from .aws import sqs", "functions.core", is_package=True)} >= {
        "functions.core.aws", "functions.core.aws.sqs",
    }
