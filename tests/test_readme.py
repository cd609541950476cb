"""The README stays what issue 41 made it: short, a door into the docs, no
lab notebook. It is at most 250 lines, its links lead to files that exist,
it tells no history ("at <commit>": that is CHANGELOG.md's), it states no
speedup that the generated performance page does not show, and its Python
examples -- and the docs' -- run as they are written.

(The generated tables of settings and options, and the map of the code,
moved to the docs reference with their tests: tests/test_docs.py.)"""

from __future__ import annotations

import re
import sys

import pytest
from harness import ROOT, run_mpi

README = ROOT / "README.md"
MAX_LINES = 250


def test_readme_is_short() -> None:
    lines = README.read_text().splitlines()
    assert len(lines) <= MAX_LINES, f"the README has {len(lines)} lines: move detail to docs/"


def test_readme_links_lead_to_files() -> None:
    """Every relative link of the README names a file of the clone (an
    anchor after it is the docs build's to check)."""
    links = re.findall(r"\]\(([^)\s]+)\)", README.read_text())
    local = [link.split("#", 1)[0] for link in links if "://" not in link]
    assert local, "the README links into the docs"
    missing = [link for link in local if link and not (ROOT / link).exists()]
    assert missing == []


def test_readme_tells_no_history() -> None:
    """No "at <commit>" passages: what changed when is CHANGELOG.md's."""
    text = README.read_text()
    assert re.findall(r"\bat [0-9a-f]{7,40}\b", text) == []


def test_readme_figures_are_on_the_performance_page() -> None:
    """A speedup the README states ("1.23x") is one the generated
    performance page shows: figures come from results files, not prose."""
    sys.path.insert(0, str(ROOT / "docs" / "_ext"))
    try:
        import cxlmpi_performance
    finally:
        sys.path.remove(str(ROOT / "docs" / "_ext"))
    page = cxlmpi_performance.generate(plots=False, write=False)
    figures = set(re.findall(r"\b\d+\.\d+x\b", README.read_text()))
    assert sorted(f for f in figures if f not in page) == []


def _programs() -> list[tuple[str, str]]:
    """(where, code) of every complete Python program in the README and the
    docs: a ```python block whose first line imports (a fragment, such as
    one that continues an example above it, starts otherwise)."""
    out = []
    for path in [README, *sorted((ROOT / "docs").rglob("*.md"))]:
        if "_build" in path.parts or "_generated" in path.parts:
            continue
        for i, code in enumerate(re.findall(r"^```python\n(.*?)^```", path.read_text(),
                                            re.M | re.S)):
            if re.match(r"(import|from) ", code):
                out.append((f"{path.relative_to(ROOT)}#{i + 1}", code))
    return out


def test_there_are_programs_to_run() -> None:
    where = [w for w, _ in _programs()]
    assert sum(w.startswith("README.md") for w in where) >= 2, where


@pytest.mark.parametrize("where,code", _programs(), ids=[w for w, _ in _programs()])
def test_example_program_runs(where: str, code: str, tmp_path) -> None:
    """The example runs on 2 ranks as a reader would run it (its own
    asserts are its checks)."""
    program = tmp_path / "example.py"
    program.write_text(code)
    run_mpi(2, [str(program)], env={"CXLMPI_CACHE": "off"}, timeout=120)
