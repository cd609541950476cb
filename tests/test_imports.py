"""cxlmpi's modules import one another one way: down the layers of LAYERS
(every module in one of them), with no cycles (a module that imports a
package-level name depends on the package __init__, which imports the
public modules), and the tools in cxlmpi/tools/ are never imported by the
library.  Read from the sources, nothing is imported."""

from __future__ import annotations

import re
from pathlib import Path

from harness import ROOT

PACKAGE = ROOT / "cxlmpi"
COMPILED = {"_shim", "_pool", "_alloc"}
PY_SOURCES = sorted(PACKAGE.rglob("*.py"))
SOURCES = [*PY_SOURCES, ROOT / "pyx" / "_shim.pyx", ROOT / "pyx" / "_alloc.pyx",
           ROOT / "pyx" / "_pool.pyx", *(ROOT / "pyx").glob("*/*.pxi")]
# The layers, top to bottom (docs/explanation/architecture.md draws them): a
# module may import from its own layer and the layers below it, never from
# one above.  An entry names a module or a package (then every module in
# it).  The order is the order of imports, which is the order of calls
# except at the compiled dispatcher: cxlmpi._shim imports nothing above the
# settings; the pool state and the selector it calls are handed to it
# (`_shim.bind` by pools.state, a Routes' `selector` by pools.selection).
LAYERS: list[tuple[str, list[str]]] = [
    ("commands", ["__main__", "bench", "tune"]),          # python -m cxlmpi[.bench|.tune]
    ("tools", ["tools"]),                                # measuring tools over the public API
    ("reports", ["reports"]),                            # --info, --pool-status, --pool-reset
    ("public", ["__init__", "auto", "alloc"]),           # cxlmpi.*, import cxlmpi.auto
    ("launch", ["launch"]),                              # patch(), the runner, MPI's start
    ("communicator", ["communicator", "resident"]),      # CXLComm, objects, stats; arrays
    ("pool state", ["pools"]),                           # per-communicator pools, set-up
    ("selection", ["select"]),                           # the path-selection policy, cache
    ("dispatch", ["_shim"]),                             # compiled: messages, routes, runs
    ("memory", ["memory"]),                              # backends, partitions, liveness
    ("settings", ["config", "spec"]),                    # CXLMPI_*, read by all
    ("pool", ["_pool", "_alloc"]),                       # compiled: algorithms, kernels, codes
    ("base", ["errors", "_version", "startup"]),           # MPI started where cxlmpi needs it
]

# The commands that keep their old names (python -m cxlmpi.bench, -m
# cxlmpi.tune): the only modules outside cxlmpi/tools that may import it.
TOOL_ENTRIES = {"bench", "tune"}

_FROM = re.compile(r"^\s*from (\.*)([\w.]*) c?import (?:\(([^)]*)\)|([\w ,]+))", re.M)


def _name(path: Path) -> str:
    """A source's module, relative to cxlmpi: "config", "tools.bench"; a
    package is its folder ("tools"), cxlmpi's own __init__ is "__init__";
    pyx/pool/*.pxi is part of "_pool", pyx/shim/*.pxi of "_shim" (the
    extension that includes its folder)."""
    if path.suffix in (".pyx", ".pxi"):
        return f"_{path.parent.name}" if path.suffix == ".pxi" else path.stem
    parts = path.relative_to(PACKAGE).with_suffix("").parts
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts) or "__init__"


MODULES = {_name(p) for p in PY_SOURCES} | COMPILED
PACKAGES = {_name(p) for p in PY_SOURCES if p.name == "__init__.py"}


def _package_of(module: str, path: Path) -> list[str]:
    """The package a module's relative imports start from, as parts."""
    if module == "__init__":
        return []
    parts = module.split(".")
    return parts if path.name == "__init__.py" else parts[:-1]


def _graph() -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {}
    for path in SOURCES:
        module = _name(path)
        text = path.read_text()
        deps = graph.setdefault(module, set())
        for dots, source, grouped, names in _FROM.findall(text):
            if dots:
                base = _package_of(module, path)
                base = base[:len(base) - (len(dots) - 1)]
                target = [*base, *filter(None, source.split("."))]
            elif source == "cxlmpi" or source.startswith("cxlmpi."):
                target = source.split(".")[1:]
            else:
                continue  # not cxlmpi's
            target_name = ".".join(target) or "__init__"
            if target_name not in PACKAGES:
                deps.add(target_name)
                continue
            prefix = "".join(f"{part}." for part in target)
            for name in (grouped or names).split(","):
                name = name.split(" as ")[0].strip()
                if name:
                    deps.add(prefix + name if prefix + name in MODULES else target_name)
        for imported in re.findall(r"^\s*import (cxlmpi[\w.]*)\s*$", text, re.M):
            deps.add(".".join(imported.split(".")[1:]) or "__init__")
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


def _layer(module: str) -> int | None:
    """The index in LAYERS of `module`'s layer (its longest entry), or None."""
    best: tuple[int, int] | None = None
    for index, (_, entries) in enumerate(LAYERS):
        for entry in entries:
            if module == entry or module.startswith(entry + "."):
                if best is None or len(entry) > best[0]:
                    best = (len(entry), index)
    return None if best is None else best[1]


def _upward(graph: dict[str, set[str]]) -> list[str]:
    """The imports of `graph` that go up the layers, as "a (layer) -> b (layer)"."""
    found = []
    for module, deps in sorted(graph.items()):
        for dep in sorted(deps):
            low, high = _layer(module), _layer(dep)
            if low is not None and high is not None and high < low:
                found.append(f"{module} ({LAYERS[low][0]}) -> {dep} ({LAYERS[high][0]})")
    return found


def test_every_module_is_in_a_layer() -> None:
    assert sorted(m for m in MODULES | set(_graph()) if _layer(m) is None) == []
    entries = [entry for _, layer in LAYERS for entry in layer]
    assert len(entries) == len(set(entries)), "an entry in two layers"
    assert sorted(e for e in entries if e not in MODULES) == [], "an entry that is no module"


def test_imports_run_down_the_layers() -> None:
    assert _upward(_graph()) == []


def test_the_check_sees_an_upward_import() -> None:
    assert _upward({"config": {"errors"}, "launch.entry": {"pools.state"}}) == []
    assert _upward({"memory.backends": {"pools.state"}}) == [
        "memory.backends (memory) -> pools.state (pool state)"]
    assert _layer("tools.bench") == _layer("tools") and _layer("nowhere") is None


def test_no_import_cycles() -> None:
    assert _cycle(_graph()) is None, " -> ".join(_cycle(_graph()) or [])


def test_the_check_sees_a_cycle() -> None:
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    graph = _graph()
    assert "pools.state" in graph["communicator.objects"]
    assert "_shim" in graph["communicator.cxlcomm"] and "select" in graph["pools.state"]
    assert "tools.bench" in graph["tools.tune"] and "config" in graph["tools.bench"]
    assert graph["bench"] == {"tools.bench"}


def test_the_library_does_not_import_the_tools() -> None:
    """cxlmpi/tools/ (bench, tune) imports the library, never the reverse:
    a program that imports cxlmpi never loads a measuring tool."""
    importers = {module for module, deps in _graph().items()
                 if any(dep == "tools" or dep.startswith("tools.") for dep in deps)}
    assert importers - TOOL_ENTRIES == {m for m in importers if m.startswith("tools.")}
