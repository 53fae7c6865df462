"""moto's Step Functions interpreter parses a state's JSONPaths (``InputPath``, ``ResultPath``,
each ``"x.$"`` parameter) every time it evaluates them, and jsonpath_ng builds a new PLY parser for
each parse (0.4-0.55 ms here): most of the interpreter's CPU in the local deployment, where each
reconcile tick of an open batch evaluates a few dozen paths. The local server keeps each path's
parsed expression (``install``): the expression moto would parse, parsed once. An expression holds
no state of a search (``find`` and ``update_or_create`` return or change the data, not it), so
threads share it.
"""

from __future__ import annotations

import functools
import importlib
import sys
from collections.abc import Callable
from typing import Any

import jsonpath_ng
import jsonpath_ng.ext

_installed = False
_PARSER = "moto.stepfunctions.parser"
#: Distinct paths are the state machines' own, a few hundred at most; the bound keeps a state
#: machine that builds paths from data (none of ours) from growing the cache without end.
_KEPT = 4096


def _kept(parse: Callable[[str], Any]) -> Callable[[str], Any]:
    @functools.lru_cache(maxsize=_KEPT)
    def kept(path: str) -> Any:
        return parse(path)

    return functools.wraps(parse)(kept)


def install() -> None:
    """Keep the parsed paths in every module of moto's parser that imported a jsonpath_ng
    ``parse`` by name (idempotent)."""
    global _installed
    if _installed:
        return
    # The modules that import ``parse`` by name, loaded so the loop below finds them.
    for module_name in ("asl.component.common.path.result_path", "asl.utils.json_path"):
        importlib.import_module(f"{_PARSER}.{module_name}")

    kept = [(parse, _kept(parse)) for parse in (jsonpath_ng.parse, jsonpath_ng.ext.parse)]
    for name, module in list(sys.modules.items()):
        for parse, keep in kept:
            if name.startswith(_PARSER) and getattr(module, "parse", None) is parse:
                module.parse = keep  # type: ignore[attr-defined]
    _installed = True
