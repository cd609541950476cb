"""The settings table: every setting says deliberately whether all ranks
must agree on it, and the agreement check compares exactly those."""

from __future__ import annotations

import dataclasses
import re

import pytest

from cxlmpi import config
from cxlmpi.group import disagreement

# A valid value other than the default, for every setting: a setting added
# to the table without one here fails test_every_setting_is_covered.
OTHER_VALUES = {
    "CXLMPI_POOL": "numa:0",
    "CXLMPI_POOL_GROUPS": "2",
    "CXLMPI_POOL_SIZE": "32M",
    "CXLMPI_ARENA_SIZE": "2G",
    "CXLMPI_ZEROCOPY_THRESHOLD": "1M",
    "CXLMPI_THRESHOLD": "8K",
    "CXLMPI_TUNING": "pool",
    "CXLMPI_CHUNK_SIZE": "64K",
    "CXLMPI_RSAG_THRESHOLD": "128K",
    "CXLMPI_TIMEOUT": "30",
    "CXLMPI_COHERENCE": "sw",
    "CXLMPI_OBJECTS": "1",
    "CXLMPI_ALLOC": "1",
    "CXLMPI_PROGRESS": "0",
    "CXLMPI_STATS": "1",
    "CXLMPI_DISABLE": "1",
}

# Settings that never change which path a call takes nor the pool's layout.
LOCAL = {"CXLMPI_TIMEOUT", "CXLMPI_STATS", "CXLMPI_PROGRESS"}


def test_agreed_is_a_required_field() -> None:
    field = {f.name: f for f in dataclasses.fields(config.Variable)}["agreed"]
    assert field.default is dataclasses.MISSING and field.default_factory is dataclasses.MISSING
    with pytest.raises(TypeError):
        config.Variable("CXLMPI_X", str, "", "doc")  # type: ignore[call-arg]


def test_every_setting_says_whether_ranks_must_agree() -> None:
    assert all(type(var.agreed) is bool for var in config.VARIABLES)
    assert {var.name for var in config.VARIABLES if not var.agreed} == LOCAL


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
