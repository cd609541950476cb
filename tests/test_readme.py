"""The README says what the code says: its settings table what
cxlmpi.config.VARIABLES says (every setting once, with its default), its
"How it works" map the files there are (both are written by hand for
readers; these tests keep them from drifting)."""

from __future__ import annotations

import re

from harness import ROOT

from cxlmpi import config


def test_settings_table_matches_the_variables() -> None:
    readme = (ROOT / "README.md").read_text()
    rows = re.findall(r"^\| `(CXLMPI_[A-Z_]+)` \| `([^`]*)` \|", readme, re.M)
    names = [name for name, _ in rows]
    assert len(names) == len(set(names)), "a setting appears twice in the README table"
    assert dict(rows) == {var.name: var.default for var in config.VARIABLES}


SOURCE_PATTERNS = ("cxlmpi/**/*.py", "cxlmpi/*.json", "pyx/**/*.pyx", "pyx/**/*.pxd",
                   "pyx/**/*.pxi", "pyx/**/*.h", "tools/*.py")


def _map_names() -> set[str]:
    """The file names in the README's "How it works" map, brace groups
    (pyx/pool/{bcast,reduce,...}.pxi, cxl_alloc.{h,pxd}) spelt out."""
    readme = (ROOT / "README.md").read_text()
    lines = readme.split("\n## How it works\n", 1)[1].split("```\n", 2)[1].splitlines()
    # The files column starts where the first row's first path does.
    column = lines[0].index("cxlmpi/")
    block = " ".join(line[column:] for line in lines)
    block = re.sub(r"([\w.-]*)\{([^}]*)\}([\w.]*)",
                   lambda m: " ".join(m.group(1) + name.strip() + m.group(3)
                                      for name in m.group(2).split(",")), block)
    return {name for name in re.findall(r"[\w.-]+", block)
            if re.search(r"\.(py|pyx|pxd|pxi|h|json)$", name)}


def test_how_it_works_map_matches_the_files() -> None:
    """Every source file appears in the README's map of the code (by name),
    and every file the map names exists."""
    files = {path.name for pattern in SOURCE_PATTERNS for path in ROOT.glob(pattern)}
    named = _map_names()
    assert sorted(files - named) == [], "files the map does not name"
    assert sorted(named - files) == [], "names in the map that are no file"
