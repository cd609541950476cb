"""The settings table: every setting says deliberately whether all ranks
must agree on it, and the agreement check compares exactly those."""

from __future__ import annotations

import dataclasses
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from cxlmpi import config
from cxlmpi.errors import CXLMPIConfigError
from cxlmpi.pools.group import disagreement

# A valid value other than the default, for every setting: a setting added
# to the table without one here fails test_every_setting_is_covered.
OTHER_VALUES = {
    "CXLMPI_POOL": "numa:0",
    "CXLMPI_POOL_GROUP": "nogroup",
    "CXLMPI_HEARTBEAT": "0.5",
    "CXLMPI_LEASE_BEATS": "10",
    "CXLMPI_POOL_GROUPS": "2",
    "CXLMPI_POOL_SIZE": "32M",
    "CXLMPI_ARENA_SIZE": "2G",
    "CXLMPI_ZEROCOPY_THRESHOLD": "1M",
    "CXLMPI_THRESHOLD": "8K",
    "CXLMPI_HOSTS_THRESHOLD": "8K",
    "CXLMPI_TUNING": "pool",
    "CXLMPI_CACHE": "off",
    "CXLMPI_CHUNK_SIZE": "64K",
    "CXLMPI_RSAG_THRESHOLD": "128K",
    "CXLMPI_TIMEOUT": "30",
    "CXLMPI_COHERENCE": "sw",
    "CXLMPI_EMULATE_SEED": "7",
    "CXLMPI_EMULATE_FAULT": "skip-flush",
    "CXLMPI_OBJECTS": "1",
    "CXLMPI_ALLOC": "1",
    "CXLMPI_ALLOC_THRESHOLD": "1M",
    "CXLMPI_PROGRESS": "0",
    "CXLMPI_ORDERING": "0",
    "CXLMPI_NONBLOCKING": "0",
    "CXLMPI_NONBLOCKING_THRESHOLD": "256K",
    "CXLMPI_OBJECTS_THRESHOLD": "1M",
    "CXLMPI_STATS": "1",
    "CXLMPI_DISABLE": "1",
}

# The settings ranks need not agree on (each says why in its description).
LOCAL = {var.name for var in config.VARIABLES if not var.agreed}


def test_agreed_is_a_required_field() -> None:
    field = {f.name: f for f in dataclasses.fields(config.Variable)}["agreed"]
    assert field.default is dataclasses.MISSING and field.default_factory is dataclasses.MISSING
    with pytest.raises(TypeError):
        config.Variable("CXLMPI_X", str, "", "doc")  # type: ignore[call-arg]


def test_every_setting_says_whether_ranks_must_agree() -> None:
    assert all(type(var.agreed) is bool for var in config.VARIABLES)
    assert LOCAL and LOCAL != {var.name for var in config.VARIABLES}


def test_every_setting_is_described() -> None:
    """One paragraph each, whose first sentence (the usage text's line)
    says what the setting is; names unique; defaults parse."""
    names = [var.name for var in config.VARIABLES]
    assert len(names) == len(set(names))
    for var in config.VARIABLES:
        assert re.fullmatch(r"CXLMPI_[A-Z0-9_]+", var.name), var.name
        assert var.doc.endswith((".", ")")) and "\n" not in var.doc, var.name
        assert 10 < len(var.summary) < len(var.doc) or var.summary + "." == var.doc, var.name
        var.parse(var.default)


def test_every_setting_is_covered() -> None:
    assert set(OTHER_VALUES) == {var.name for var in config.VARIABLES}


def test_the_check_compares_the_flagged_settings() -> None:
    flagged = tuple(var.name for var in config.VARIABLES if var.agreed)
    assert config.AGREED == flagged
    assert tuple(config.Config({}).agreed()) == flagged


@pytest.mark.parametrize("name", list(OTHER_VALUES))
def test_disagreement_names_the_setting(name: str) -> None:
    """Ranks with the default and with another value of `name`: the check
    names it exactly when the table flags it."""
    base = config.Config({})
    other = config.Config({name: OTHER_VALUES[name]})
    error = disagreement([base.agreed(), base.agreed(), other.agreed()])
    if name in LOCAL:
        assert error is None
    else:
        assert error is not None and name in error and "rank 2" in error
        assert set(re.findall(r"CXLMPI_[A-Z_]+", error)) == {name}  # and no other


# ------------------------------------------------- unknown CXLMPI_* names

# Names the tests use on purpose as misspellings or strays (never read).
FAKE_NAMES = {"CXLMPI_X", "CXLMPI_THRESHHOLD", "CXLMPI_POOLSIZE", "CXLMPI_NO_SUCH_THING"}


def test_unknown_names_suggest_the_closest_setting() -> None:
    env = {"CXLMPI_THRESHHOLD": "1M", "CXLMPI_POOLSIZE": "8M", "CXLMPI_NO_SUCH_THING": "1",
           "CXLMPI_THRESHOLD": "8K", "CXLMPI_SYSFS": "/sys", "OTHER_THRESHHOLD": "1"}
    assert config.unknown(env) == [("CXLMPI_NO_SUCH_THING", None),
                                   ("CXLMPI_POOLSIZE", "CXLMPI_POOL_SIZE"),
                                   ("CXLMPI_THRESHHOLD", "CXLMPI_THRESHOLD")]
    assert "did you mean CXLMPI_THRESHOLD?" in config.describe_unknown(
        "CXLMPI_THRESHHOLD", "CXLMPI_THRESHOLD")


def test_settings_and_internal_names_are_known() -> None:
    env = {name: "1" for name in [*(v.name for v in config.VARIABLES), *config.INTERNAL]}
    assert config.unknown(env) == []


def test_every_name_the_project_reads_is_known() -> None:
    """Every CXLMPI_* name in the code (Python, Cython, C), tools, tests,
    Makefile, README and docs is a setting described in config.VARIABLES or
    deliberately listed, with its description, in config.INTERNAL: none
    would warn, and none is read without a description."""
    root = Path(__file__).resolve().parent.parent
    files = [root / "Makefile", root / "setup.py", root / "README.md",
             *(root / "docs").rglob("*.md"),
             *(path for pattern in ("cxlmpi/**/*.py", "pyx/**/*.pyx", "pyx/**/*.pxi",
                                    "pyx/**/*.pxd", "pyx/**/*.h", "tools/**/*.py",
                                    "tools/*.sh", "examples/**/*.py", "tests/**/*.py")
               for path in root.glob(pattern))]
    names = set()
    for path in files:
        names |= set(re.findall(r"\bCXLMPI_[A-Z0-9_]*[A-Z0-9]\b", path.read_text()))
    assert names, files
    known = {v.name for v in config.VARIABLES} | set(config.INTERNAL)
    assert names - known - FAKE_NAMES == set()


def test_a_tuning_table_is_checked_before_it_is_used(tmp_path) -> None:
    """CXLMPI_TUNING tables whose windows do not fit the compiled window
    table (a bound of 2**63 or more, true for a number, deep nesting) or
    that are no regular file are refused with CXLMPIConfigError (before:
    taken, or a FIFO hung every rank at start-up); a valid one is read as
    written."""
    table = tmp_path / "tuning.json"
    for bad in ('{"bcast": [0, 9223372036854775808]}', '{"bcast": [true, null]}',
                '{"bcast": [0, 1e3]}', "[" * 100000 + "]" * 100000):
        table.write_text(bad)
        with pytest.raises(CXLMPIConfigError, match="CXLMPI_TUNING"):
            config.Config({"CXLMPI_TUNING": str(table)}).tuning_table()
    table.write_text('{"bcast": [4096, 9223372036854775807], "reduce": null}')
    assert config.Config({"CXLMPI_TUNING": str(table)}).tuning_table() == {
        "bcast": [4096, (1 << 63) - 1], "reduce": None}
    fifo = tmp_path / "fifo.json"
    os.mkfifo(fifo)
    code = ("import sys\nfrom cxlmpi import config\n"
            "try:\n    config.Config({'CXLMPI_TUNING': sys.argv[1]}).tuning_table()\n"
            "except config.CXLMPIConfigError as exc:\n    print('refused', exc)\n")
    proc = subprocess.run([sys.executable, "-c", code, str(fifo)], capture_output=True,
                          text=True, timeout=60)
    assert proc.stdout.startswith("refused") and "not a regular file" in proc.stdout, proc
