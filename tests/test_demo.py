"""`make demo` and the README's table of its programs say the same thing:
every program the table shows is one `make demo` runs, and the other way
round (the table once listed a program the demo never ran)."""

from __future__ import annotations

import re

from harness import ROOT


def demo_runs() -> list[tuple[str, str]]:
    """(script, arguments) of every tools/compare.py line of `make demo`,
    the arguments with CXLMPI_ALLOC=1 marked as --alloc."""
    recipe = ROOT.joinpath("Makefile").read_text().split("\ndemo:", 1)[1]
    recipe = recipe.split("\n\n", 1)[0]
    runs = []
    for line in recipe.splitlines():
        m = re.search(r"tools/compare\.py -n \S+ (examples/\S+\.py)(?: -- (.*))?$", line)
        if m:
            args = (m.group(2) or "").strip()
            if "CXLMPI_ALLOC=1" in line:
                args = (args + " --alloc").strip()
            runs.append((m.group(1), args))
    return runs


def readme_rows() -> list[tuple[str, str]]:
    """(script, arguments) of every row of the README's `make demo` table;
    "the same with `--alloc`" repeats the row above with --alloc."""
    text = ROOT.joinpath("README.md").read_text()
    table = text.split("`make demo` runs unmodified programs", 1)[1]
    table = table.split("\n\n", 2)[1]  # the paragraph, then the table
    rows: list[tuple[str, str]] = []
    for line in table.splitlines()[2:]:
        first = line.split("|")[1].strip()
        m = re.fullmatch(r"`(examples/\S+\.py)(?: (.*))?`", first)
        if m:
            rows.append((m.group(1), (m.group(2) or "").strip()))
        else:
            assert "the same with `--alloc`" in first, line
            script, args = rows[-1]
            rows.append((script, (args + " --alloc").strip()))
    return rows


def test_readme_demo_table_lists_what_make_demo_runs() -> None:
    runs = demo_runs()
    assert len(runs) >= 3, runs
    assert readme_rows() == runs
