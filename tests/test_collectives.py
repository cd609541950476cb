"""Drive the MPI test bodies in tests/mpi/ under mpiexec at 1 to 4 ranks.

Each body compares the wrapped communicator with the plain one on the same
data; a failure on any rank fails every rank (see tests/mpi/common.py).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from harness import SMALL_POOL_ENV, leaked_segments, our_segments, run_mpi

from cxlmpi import backends


@pytest.mark.parametrize("nranks", [1, 2, 3, 4])
def test_collectives_small_pool(nranks: int) -> None:
    """Every collective, dtype, op, root and size class on a test-sized pool."""
    before = our_segments()
    run_mpi(nranks, ["-m", "pytest", "-q", "-x", "-p", "no:cacheprovider",
                     "tests/mpi"], env=SMALL_POOL_ENV)
    assert leaked_segments(before) == []


@pytest.mark.parametrize("nranks", [2, 3])
def test_collectives_default_pool(nranks: int) -> None:
    """The same bodies with the default settings: adaptive selection, whose
    learning calls alternate stock MPI and the pool's variants (messages
    above 4 KiB, one chunk up to 256 KiB): every result as stock MPI's."""
    run_mpi(nranks, ["-m", "pytest", "-q", "-x", "-p", "no:cacheprovider",
                     "tests/mpi", "-k", "not exhaustive"],
            env={"CXLMPI_TIMEOUT": "60", "CXLMPI_OBJECTS": "1"})


@pytest.mark.parametrize("nranks", [2, 3])
def test_collectives_software_coherence(nranks: int) -> None:
    """sw coherence flushes and invalidates: same results, flush counter > 0."""
    env = dict(SMALL_POOL_ENV, CXLMPI_COHERENCE="sw", CXLMPI_EXPECT_FLUSH="1")
    run_mpi(nranks, ["-m", "pytest", "-q", "-x", "-p", "no:cacheprovider",
                     "tests/mpi", "-k", "not exhaustive"], env=env)


def dax_stand_in(tmp_path: Path) -> dict[str, str]:
    """A regular file standing in for /dev/dax0.0, described by a fixture
    sysfs tree (256 MiB, the default 2 MiB alignment)."""
    device = tmp_path / "dax0.0"
    with open(device, "wb") as f:
        f.truncate(256 << 20)
    device.chmod(0o600)     # pool memory is its owner's alone
    sysfs = tmp_path / "sys" / "bus" / "dax" / "devices" / "dax0.0"
    sysfs.mkdir(parents=True)
    (sysfs / "size").write_text(f"{256 << 20}\n")
    return {"CXLMPI_POOL": f"dax:{device}", "CXLMPI_SYSFS": str(tmp_path / "sys")}


BACKENDS = {
    "file-on-tmpfs": lambda tmp: {"CXLMPI_POOL": f"file:/dev/shm/cxlmpi_test_{os.getpid()}"},
    "file-on-disk": lambda tmp: {"CXLMPI_POOL": f"file:{tmp}/pool"},
    "numa-node-0": lambda tmp: {"CXLMPI_POOL": "numa:0"},
    "dax-stand-in": dax_stand_in,
}


@pytest.mark.parametrize("backend", list(BACKENDS))
def test_collectives_on_backend(backend: str, tmp_path: Path, monkeypatch) -> None:
    """The bodies on every backend this machine offers; afterwards a pool
    file's or device's partitions are all given back."""
    env = dict(SMALL_POOL_ENV, **BACKENDS[backend](tmp_path))
    try:
        run_mpi(3, ["-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", "tests/mpi",
                    "-k", "not exhaustive"], env=env)
        spec = backends.parse_spec(env["CXLMPI_POOL"])
        if spec.shared_file:
            monkeypatch.setenv("CXLMPI_SYSFS", env.get("CXLMPI_SYSFS", "/sys"))
            dev = backends._open(spec, create=False)
            assert dev.entries() == []
            dev.close()
    finally:
        if backend == "file-on-tmpfs":
            os.unlink(env["CXLMPI_POOL"][len("file:"):])


@pytest.mark.parametrize("groups, nranks, extra", [
    (2, 4, {}),
    (2, 3, {}),
    (3, 3, {}),
    (2, 4, {"CXLMPI_COHERENCE": "sw", "CXLMPI_EXPECT_FLUSH": "1"}),
])
def test_collectives_over_pool_groups(groups: int, nranks: int, extra: dict) -> None:
    """CXLMPI_POOL_GROUPS splits the node as if into hosts: collectives run
    in each pool and through MPI among the leaders (at 3 ranks and G = 2, a
    group of two and a group of one; at G = 3, groups of one rank only: no
    pool, every call goes to MPI)."""
    env = dict(SMALL_POOL_ENV, CXLMPI_POOL_GROUPS=str(groups), **extra)
    run_mpi(nranks, ["-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", "tests/mpi"],
            env=env)
