"""The driver tests run under plain pytest; tests/mpi/ holds the bodies they
launch under mpiexec (never collected here) and tests/scripts/ the programs."""

import atexit
import os
import shutil
import tempfile

collect_ignore = ["mpi", "scripts"]

# Adaptive selection remembers what it learns (CXLMPI_CACHE): the suite's
# jobs keep theirs in a folder of their own, never in the user's cache, so
# that no run starts from what an earlier one learned.
# (one per pytest process: every rank of a tests/mpi job has its own, and
# removes it when it ends)
_cache_dir = tempfile.mkdtemp(prefix="cxlmpi-test-cache-")
atexit.register(shutil.rmtree, _cache_dir, ignore_errors=True)
os.environ["CXLMPI_CACHE"] = os.path.join(_cache_dir, "selection.json")


def pytest_sessionstart(session) -> None:
    from harness import _shm_names

    session.config._cxlmpi_shm_before = _shm_names()


def pytest_sessionfinish(session, exitstatus) -> None:
    """Single-process MPI starts (Open MPI singletons) and interrupted jobs
    leave the MPI library's own segments behind; remove those no process
    maps any more (cxlmpi's own are checked, never removed, by the tests)."""
    from harness import _remove_mpi_leftovers

    _remove_mpi_leftovers(getattr(session.config, "_cxlmpi_shm_before", set()))
