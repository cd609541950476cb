"""The README's settings table says what cxlmpi.config.VARIABLES says: every
setting once, with its default (the table is written by hand for readers;
this keeps it from drifting)."""

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
