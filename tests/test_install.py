"""The installed package, seen from where a new user stands: the directory
that holds the clone (named `cxlmpi`, as `git clone` names it).

Run with a Python whose environment has cxlmpi installed the way the
Makefile installs it (the test suite's own interpreter): from any working
directory `import cxlmpi` must give the installed package, never a folder
of the same name taken as a namespace package.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from harness import ROOT

import cxlmpi


def _clean_env() -> dict[str, str]:
    """The caller's environment without PYTHONPATH (the harness puts the
    repository there, which would hide the problem) and CXLMPI_*."""
    return {k: v for k, v in os.environ.items()
            if k != "PYTHONPATH" and not k.startswith("CXLMPI_")}


def _make_lookalike(kind: str, where: Path) -> None:
    """`where/cxlmpi`: the clone itself (a symlink to the repository root,
    whose top level has no __init__.py) or an empty folder."""
    if kind == "clone":
        (where / "cxlmpi").symlink_to(ROOT, target_is_directory=True)
    else:
        (where / "cxlmpi").mkdir()


@pytest.mark.parametrize("kind", ["clone", "empty"])
@pytest.mark.parametrize("how", ["info", "import"])
def test_installed_package_wins_over_a_folder_named_cxlmpi(kind: str, how: str,
                                                           tmp_path: Path) -> None:
    """`python -m cxlmpi --info` and `import cxlmpi` from a directory that
    holds a folder named `cxlmpi` use the installed package (its
    __version__, its compiled modules), not the folder."""
    _make_lookalike(kind, tmp_path)
    if how == "info":
        cmd = [sys.executable, "-m", "cxlmpi", "--info"]
    else:
        cmd = [sys.executable, "-c",
               "import cxlmpi, cxlmpi._shim; print('VERSION', cxlmpi.__version__); "
               "print('FILE', cxlmpi.__file__)"]
    proc = subprocess.run(cmd, cwd=tmp_path, env=_clean_env(), capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr[-3000:]
    if how == "info":
        assert proc.stdout.startswith(f"cxlmpi {cxlmpi.__version__}\n"), proc.stdout[:200]
    else:
        assert f"VERSION {cxlmpi.__version__}\n" in proc.stdout
        found = proc.stdout.split("FILE ", 1)[1].strip()
        assert Path(found).resolve() == (ROOT / "cxlmpi" / "__init__.py").resolve()


def test_every_package_is_shipped() -> None:
    """pyproject.toml lists the packages a (non-editable) install ships: it
    must name every folder of cxlmpi that holds an __init__.py, or `pip
    install .` leaves that layer out (the editable install of the tests
    would not notice)."""
    text = (ROOT / "pyproject.toml").read_text()
    listed = re.search(r"^packages = \[([^\]]*)\]", text, re.M)
    assert listed, "pyproject.toml: no packages = [...]"
    folders = {".".join(path.parent.relative_to(ROOT).parts)
               for path in (ROOT / "cxlmpi").rglob("__init__.py")}
    assert set(re.findall(r'"([\w.]+)"', listed.group(1))) == folders
