"""The NumPy allocation hook (CXLMPI_ALLOC=1, `python -m cxlmpi --alloc`):
unmodified code's large arrays live in the pool, and collectives on them
give stock MPI's results."""

from __future__ import annotations

import json

import pytest
from harness import run_mpi

SCRIPT = "tests/scripts/alloc_hook.py"
ENV = {"CXLMPI_ZEROCOPY_THRESHOLD": "64K", "CXLMPI_ARENA_SIZE": "64M",
       "CXLMPI_TUNING": "pool"}


def findings(stdout: str) -> list[dict]:
    [line] = [x for x in stdout.splitlines() if x.startswith("ALLOC ")]
    return json.loads(line[len("ALLOC "):])


@pytest.mark.parametrize("nranks", [2, 3])
def test_numpy_arrays_land_in_the_pool(nranks: int) -> None:
    out = run_mpi(nranks, ["-m", "cxlmpi", "--alloc", SCRIPT], env=ENV)
    for rank, got in enumerate(findings(out.stdout)):
        assert got["active"] and got["a_in_pool"] and got["b_in_pool"], (rank, got)
        assert not got["small_in_pool"], (rank, got)
        assert got["allreduce_ok"] and got["bcast_ok"] and got["after_free_ok"], (rank, got)
        assert got["pool_allocs"] >= 4 and got["live_after_del"] == 0, (rank, got)


def test_off_by_default() -> None:
    out = run_mpi(2, ["-m", "cxlmpi", SCRIPT], env=ENV)
    for got in findings(out.stdout):
        assert not got["active"] and not got["a_in_pool"], got
        assert got["allreduce_ok"] and got["bcast_ok"] and got["after_free_ok"], got
