"""Drive the MPI test bodies in tests/mpi/ under mpiexec at 1 to 4 ranks.

Each body compares the wrapped communicator with the plain one on the same
data; a failure on any rank fails every rank (see tests/mpi/common.py).
"""

from __future__ import annotations

import pytest
from harness import SMALL_POOL_ENV, leaked_segments, our_segments, run_mpi


@pytest.mark.parametrize("nranks", [1, 2, 3, 4])
def test_collectives_small_pool(nranks: int) -> None:
    """Every collective, dtype, op, root and size class on a test-sized pool."""
    before = our_segments()
    run_mpi(nranks, ["-m", "pytest", "-q", "-x", "-p", "no:cacheprovider",
                     "tests/mpi"], env=SMALL_POOL_ENV)
    assert leaked_segments(before) == []


@pytest.mark.parametrize("nranks", [2, 3])
def test_collectives_default_pool(nranks: int) -> None:
    """The same bodies with the default settings (messages above 4 KiB
    through the pool, one chunk up to 256 KiB)."""
    run_mpi(nranks, ["-m", "pytest", "-q", "-x", "-p", "no:cacheprovider",
                     "tests/mpi", "-k", "not exhaustive"],
            env={"CXLMPI_TIMEOUT": "60", "CXLMPI_OBJECTS": "1"})


@pytest.mark.parametrize("nranks", [2, 3])
def test_collectives_software_coherence(nranks: int) -> None:
    """sw coherence flushes and invalidates: same results, flush counter > 0."""
    env = dict(SMALL_POOL_ENV, CXLMPI_COHERENCE="sw", CXLMPI_EXPECT_FLUSH="1")
    run_mpi(nranks, ["-m", "pytest", "-q", "-x", "-p", "no:cacheprovider",
                     "tests/mpi", "-k", "not exhaustive"], env=env)
