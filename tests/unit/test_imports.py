"""Imports go one way: ``infra`` (the CDK app, the local deployment) and ``batchctl`` may import
``functions`` and ``gpu_worker``; ``gpu_worker`` may import ``functions``; never the reverse. And
inside ``functions``, AWS SDK calls live in the adapters: ``boto3``/``botocore`` only in
``functions/core/aws/`` and ``functions/core/clients.py``; Powertools (Lambda glue) neither in
``functions/core`` outside the adapters nor in a Lambda's ``logic.py``.

Every ``import``/``from ... import`` anywhere in a module counts (also inside functions), relative
imports resolved to the absolute module they name.

And no import cycles: no product module needs, while it loads, a module that needs it back. Only
what runs at load time counts here (a function's imports are deliberate lazy ones).
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
    assert (
        violations("functions", {"boto3", "botocore"}, allowed=("functions/core/aws/", "functions/core/clients.py"))
        == []
    )


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
            for line, name in imported_modules(
                path.read_text(), module_name(path), is_package=path.name == "__init__.py"
            ):
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
    handlers = sorted(
        {
            name
            for path in sorted((REPO / "infra/constructs").glob("*.py"))
            for name in re.findall(r'handler="(functions\.[\w.]+)"', path.read_text())
        }
    )
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
        "functions.core.aws",
        "functions.core.aws.sqs",
    }


# --- no import cycles -------------------------------------------------------------------------
PACKAGES = ("functions", "gpu_worker", "infra", "batchctl")


def module_level_imports(
    source: str, module: str, *, is_package: bool = False
) -> Iterator[tuple[str, tuple[str, ...]]]:
    """What a module imports when it is loaded, as (absolute module, names taken from it; none for
    ``import m``): its top-level statements (also inside a top-level ``try``/``if``), never a
    function's lazy imports nor ``if TYPE_CHECKING:``."""
    package = module.split(".") if is_package else module.split(".")[:-1]

    def walk(body: list[ast.stmt]) -> Iterator[str]:
        for node in body:
            if isinstance(node, ast.Import):
                yield from ((alias.name, ()) for alias in node.names)
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = package[: len(package) - (node.level - 1)]
                    target = ".".join(base + ([node.module] if node.module else []))
                else:
                    target = node.module or ""
                yield target, tuple(alias.name for alias in node.names)
            elif isinstance(node, ast.If):
                test = node.test
                if not (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") and not (
                    isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
                ):
                    yield from walk(node.body)
                yield from walk(node.orelse)
            elif isinstance(node, ast.Try):
                for block in (node.body, *(h.body for h in node.handlers), node.orelse, node.finalbody):
                    yield from walk(block)

    yield from walk(ast.parse(source).body)


def import_graph() -> dict[str, set[str]]:
    """Each product module -> the product modules it needs loaded at load time: ``from p import m``
    of a submodule ``m`` needs ``p.m`` (its package is loaded first anyway, by the import system);
    ``from p import name`` of anything else needs ``p`` itself, run to its end."""
    paths = {module_name(p): p for pkg in PACKAGES for p in sorted((REPO / pkg).rglob("*.py"))}
    graph: dict[str, set[str]] = {}
    for name, path in paths.items():
        needed = set()
        for target, names in module_level_imports(path.read_text(), name, is_package=path.name == "__init__.py"):
            modules = {f"{target}.{n}" for n in names if f"{target}.{n}" in paths}
            needed |= modules if len(modules) == len(names) and names else {target} | modules
        graph[name] = {t for t in needed if t in paths and t != name}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for succ in sorted(graph.get(node, ())):
            if succ not in index:
                visit(succ)
                low[node] = min(low[node], low[succ])
            elif succ in on_stack:
                low[node] = min(low[node], index[succ])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return sorted(found)


def test_no_import_cycles_between_product_modules() -> None:
    """Loading a module never needs a module that needs it back (imports inside functions are
    deliberate lazy imports and do not count)."""
    assert cycles(import_graph()) == []


def test_cycle_finder_names_a_cycle() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert cycles(graph) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_module_level_imports_skip_lazy_and_type_checking_ones() -> None:
    source = (
        "import os\nfrom typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from infra import names\n"
        "def f():\n    from batchctl import cli\ntry:\n    from . import schema\nexcept ImportError:\n    pass\n"
    )
    found = dict(module_level_imports(source, "functions.core.x"))
    assert found == {"os": (), "typing": ("TYPE_CHECKING",), "functions.core": ("schema",)}
