"""The README says what the code says: its tables of settings and of the
command line's options are what `python -m cxlmpi --info --markdown`
generates from cxlmpi.config.VARIABLES and cxlmpi.launch.command_line.OPTIONS
(regenerated, never edited), its "How it works" map names the files there
are (written by hand for readers; this test keeps it from drifting)."""

from __future__ import annotations

import re
import subprocess
import sys

from harness import ROOT, mpi_env

from cxlmpi.reports import info

_MARKED = re.compile(r"^<!-- (\w+): python -m cxlmpi --info --markdown .*?^<!-- end of \1 -->$",
                     re.M | re.S)


def test_generated_tables_are_what_the_generator_prints() -> None:
    """Each generated table appears once in the README, as generated: a
    setting or option added, changed or removed without regenerating the
    README fails here (replace the README's block, markers included, with
    what `python -m cxlmpi --info --markdown` prints)."""
    readme = (ROOT / "README.md").read_text()
    in_readme = {m.group(1): m.group(0) for m in _MARKED.finditer(readme)}
    generated = {m.group(1): m.group(0) for m in _MARKED.finditer(info.markdown())}
    assert sorted(generated) == ["options", "settings"]
    assert len(_MARKED.findall(readme)) == len(in_readme) == len(generated)
    for name, block in generated.items():
        assert in_readme[name] == block, f"regenerate the README's {name} table"


def test_the_generator_is_the_command_line() -> None:
    env = {var: value for var, value in mpi_env().items() if not var.startswith("CXLMPI_")}
    proc = subprocess.run([sys.executable, "-m", "cxlmpi", "--info", "--markdown"], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == info.markdown() + "\n"


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
