"""cxlmpi's modules import one another one way: no cycles (a module that
imports a package-level name depends on the package __init__, which imports
the public modules).  Read from the sources, nothing is imported."""

from __future__ import annotations

import re

from harness import ROOT

PACKAGE = ROOT / "cxlmpi"
MODULES = {p.stem for p in PACKAGE.glob("*.py")} | {"_shim", "_pool", "_alloc"}
SOURCES = [*PACKAGE.glob("*.py"), ROOT / "pyx" / "_shim.pyx", ROOT / "pyx" / "_alloc.pyx",
           ROOT / "pyx" / "_pool.pyx", *(ROOT / "pyx" / "pool").glob("*.pxi")]


def _graph() -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {}
    for path in SOURCES:
        module = "_pool" if path.suffix == ".pxi" else path.stem
        text = path.read_text()
        deps = graph.setdefault(module, set())
        deps.update(re.findall(r"^\s*from (?:\.|cxlmpi\.)(\w+) (?:c?import)", text, re.M))
        for names in re.findall(r"^\s*from (?:\.|cxlmpi) import ([\w ,]+)", text, re.M):
            for name in (n.split(" as ")[0].strip() for n in names.split(",")):
                deps.add(name if name in MODULES else "__init__")
        if re.search(r"^\s*import cxlmpi\s*$", text, re.M):
            deps.add("__init__")
        deps.discard(module)
    return graph


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    done: set[str] = set()

    def visit(node: str, path: list[str]) -> list[str] | None:
        if node in path:
            return path[path.index(node):] + [node]
        if node in done:
            return None
        for dep in sorted(graph.get(node, ())):
            found = visit(dep, [*path, node])
            if found:
                return found
        done.add(node)
        return None

    for module in sorted(graph):
        found = visit(module, [])
        if found:
            return found
    return None


def test_no_import_cycles() -> None:
    assert _cycle(_graph()) is None, " -> ".join(_cycle(_graph()) or [])


def test_the_check_sees_a_cycle() -> None:
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert "comm" in _graph()["objects"] or "state" in _graph()["objects"]
