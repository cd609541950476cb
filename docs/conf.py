"""Sphinx configuration of cxlmpi's documentation (make docs).

Everything is local: no intersphinx, nothing fetched.  The reference pages'
tables are generated from the code by docs/_ext/cxlmpi_reference.py, the
performance page's figures from results/ by docs/_ext/cxlmpi_performance.py.
cxlmpi's modules (autodoc, the generators) start MPI as a singleton: no
mpiexec needed.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE / "_ext"), str(HERE.parent)]
os.environ.setdefault("CXLMPI_CACHE", "off")   # the build reads no selection cache

from cxlmpi import __version__  # noqa: E402

project = "cxlmpi"
author = "the cxlmpi developers"
copyright = "the cxlmpi developers"
release = version = __version__

extensions = [
    "myst_parser",
    "sphinx.ext.autodoc",
    "cxlmpi_reference",
    "cxlmpi_performance",
]
source_suffix = {".md": "markdown"}
exclude_patterns = ["_build", "_generated"]
myst_heading_anchors = 3
myst_enable_extensions = ["colon_fence"]

html_theme = "alabaster"
html_title = f"cxlmpi {release}"
html_static_path: list[str] = []

autodoc_typehints = "none"
autodoc_member_order = "bysource"
nitpicky = True
# Without intersphinx, names of Python and mpi4py cannot be linked.
nitpick_ignore_regex = [
    ("py:class", r"(ValueError|TimeoutError|ConnectionError|OSError|MemoryError|Exception)"),
    ("py:class", r"(mpi4py\.)?MPI\..*|cxlmpi\._shim\..*"),
]
