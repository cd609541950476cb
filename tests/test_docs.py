"""The documentation's reference says what the code says.

- Every setting (cxlmpi.config.VARIABLES), every flag of every command line
  (python -m cxlmpi's OPTIONS, the admin commands among them, and the
  argparse parsers of bench, tune and tools/compare.py) and every public
  name (the __all__ of cxlmpi, cxlmpi.alloc and cxlmpi.errors) is in the
  reference's source and in the built reference.
- The settings and options tables committed in the reference are what
  ``python -m cxlmpi --info --markdown`` generates from the code
  (regenerated, never edited); the docs build checks the same.
- The architecture page's map of the code names the files there are.
"""

from __future__ import annotations

import importlib
import importlib.util
import re
import subprocess
import sys
from pathlib import Path

import pytest
from harness import ROOT, mpi_env

from cxlmpi import config
from cxlmpi.launch.command_line import OPTIONS
from cxlmpi.reports import info

DOCS = ROOT / "docs"
REFERENCE = DOCS / "reference"
sys.path.insert(0, str(DOCS / "_ext"))
import cxlmpi_reference as generated  # noqa: E402

#: The modules whose __all__ is public API, documented in reference/.
PUBLIC_MODULES = ("cxlmpi", "cxlmpi.alloc", "cxlmpi.errors")
NOT_DOCUMENTED_BY_AUTODOC = {"__version__"}   # a string: named in api.md's text

_TARGET = re.compile(r"^\.\. auto(?:function|class|exception|data)::\s*(\S+)", re.M)


def _page(name: str) -> str:
    return (REFERENCE / f"{name}.md").read_text()


def _public() -> list[tuple[str, str]]:
    """(module, name) of every public name."""
    return [(module, name) for module in PUBLIC_MODULES
            for name in importlib.import_module(module).__all__
            if name not in NOT_DOCUMENTED_BY_AUTODOC]


def _documented_as(module: str, name: str) -> set[str]:
    """The autodoc targets that document `name` of `module`: its own dotted
    name, or cxlmpi's where cxlmpi exports it too."""
    import cxlmpi

    names = {f"{module}.{name}"}
    if name in cxlmpi.__all__:
        names.add(f"cxlmpi.{name}")
    return names


def _flags() -> dict[str, list[str]]:
    """Every flag of every command line, by the reference page's command."""
    out = {"python -m cxlmpi": [flag for option in OPTIONS for flag in option.flags]}
    for command in generated.COMMANDS:
        out[command] = generated.flags_of(generated.parser_of(command))
    return out


# ------------------------------------------------------------ the source


def test_every_setting_is_in_the_settings_reference() -> None:
    page = _page("settings")
    missing = [var.name for var in config.VARIABLES if f"`{var.name}`" not in page]
    assert missing == [], "regenerate docs/reference/settings.md's table"


def test_every_flag_is_in_the_command_line_reference() -> None:
    """python -m cxlmpi's flags are in the committed options table; each
    argparse command has its generated section, and every one of its flags
    is in what that section generates."""
    page = _page("command-line")
    table = generated.generated_blocks()["options"]
    for flag in _flags()["python -m cxlmpi"]:
        assert flag in page and flag in table, flag
    for command in generated.COMMANDS:
        assert f"```{{cxlmpi-argparse}} {command}\n" in page, f"no section for {command}"
        text = generated.argparse_markdown(command)
        missing = [flag for flag in _flags()[command] if flag not in text]
        assert missing == [], command


def test_every_public_name_is_in_the_api_reference() -> None:
    targets = set(_TARGET.findall(_page("api") + _page("errors")))
    missing = [f"{module}.{name}" for module, name in _public()
               if not _documented_as(module, name) & targets]
    assert missing == [], "add an autodoc entry to docs/reference/api.md"


def test_generated_tables_are_what_the_generator_prints() -> None:
    """Each table of `python -m cxlmpi --info --markdown` appears once in
    its reference page, as generated: a setting or option added, changed
    or removed without regenerating the page fails here (replace the
    page's block, markers included, with what the command prints)."""
    assert sorted(generated.generated_blocks()) == sorted(generated.GENERATED_BLOCKS)
    for name, page in generated.GENERATED_BLOCKS.items():
        text = (DOCS / f"{page}.md").read_text()
        assert generated.stale_blocks(name, text) == [], f"regenerate {page}.md's {name} table"


def test_the_generator_is_the_command_line() -> None:
    env = {var: value for var, value in mpi_env().items() if not var.startswith("CXLMPI_")}
    proc = subprocess.run([sys.executable, "-m", "cxlmpi", "--info", "--markdown"], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == info.markdown() + "\n"


def test_the_pool_table_names_every_intercepted_collective() -> None:
    from cxlmpi._pool import COLLECTIVES

    text = generated.pool_table_markdown()
    assert all(f"| `{name}` |" in text for name in COLLECTIVES)
    assert "`Iallreduce`" in text   # a method CXLComm leaves to mpi4py, or takes itself


# ------------------------------------------------------------ the map of the code

SOURCE_PATTERNS = ("cxlmpi/**/*.py", "cxlmpi/*.json", "pyx/**/*.pyx", "pyx/**/*.pxd",
                   "pyx/**/*.pxi", "pyx/**/*.h", "tools/*.py")


def _map_names() -> set[str]:
    """The file names in the architecture page's map of the code, brace
    groups (pyx/pool/{bcast,reduce,...}.pxi, cxl_alloc.{h,pxd}) spelt out."""
    page = (DOCS / "explanation" / "architecture.md").read_text()
    block = page.split("Every source file, and what it holds", 1)[1]
    lines = block.split("```text\n", 1)[1].split("```\n", 1)[0].splitlines()
    # The files column starts where the first row's first path does.
    column = lines[0].index("cxlmpi/")
    text = " ".join(line[column:] for line in lines)
    text = re.sub(r"([\w.-]*)\{([^}]*)\}([\w.]*)",
                  lambda m: " ".join(m.group(1) + name.strip() + m.group(3)
                                     for name in m.group(2).split(",")), text)
    return {name for name in re.findall(r"[\w.-]+", text)
            if re.search(r"\.(py|pyx|pxd|pxi|h|json)$", name)}


def test_the_map_of_the_code_matches_the_files() -> None:
    """Every source file appears in the map (by name), and every file the
    map names exists."""
    files = {path.name for pattern in SOURCE_PATTERNS for path in ROOT.glob(pattern)}
    named = _map_names()
    assert sorted(files - named) == [], "files the map does not name"
    assert sorted(named - files) == [], "names in the map that are no file"


# ------------------------------------------------------------ the built pages

_HAVE_SPHINX = all(importlib.util.find_spec(m) for m in ("sphinx", "myst_parser"))


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> Path:
    """The reference built as HTML, as CI builds it (warnings fail)."""
    if not _HAVE_SPHINX:
        pytest.skip("sphinx and myst-parser are not installed (pip install -e '.[docs]')")
    out = tmp_path_factory.mktemp("docs")
    proc = subprocess.run([sys.executable, "-m", "sphinx", "-W", "--keep-going", "-n", "-q",
                           "-E", "-b", "html", str(DOCS), str(out)], cwd=ROOT,
                          env={**mpi_env(), "CXLMPI_CACHE": "off"}, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-6000:]
    return out / "reference"


def test_the_built_reference_has_every_setting(built: Path) -> None:
    text = (built / "settings.html").read_text()
    assert [var.name for var in config.VARIABLES if f">{var.name}<" not in text] == []


def test_the_built_reference_has_every_flag(built: Path) -> None:
    text = (built / "command-line.html").read_text()
    missing = [f"{command}: {flag}" for command, flags in _flags().items()
               for flag in flags if not re.search(rf"[>\[ ]{re.escape(flag)}[<,\] ]", text)]
    assert missing == []


def test_the_built_reference_has_every_public_name(built: Path) -> None:
    text = (built / "api.html").read_text() + (built / "errors.html").read_text()
    missing = [f"{module}.{name}" for module, name in _public()
               if not any(f'id="{target}"' in text for target in _documented_as(module, name))]
    assert missing == []
