"""Optional: NumPy places every large array in the pool (NEP 49), so that an
unmodified program's collectives on them take the zero-copy paths.

    CXLMPI_ALLOC=1 mpiexec -n 4 python -m cxlmpi app.py     # or --alloc
    cxlmpi.alloc.enable()                                     # from a program

Arrays of CXLMPI_ALLOC_THRESHOLD (by default CXLMPI_ZEROCOPY_THRESHOLD)
bytes and more allocated by NumPy in this
thread (NumPy keeps its handler per context: threads started afterwards use
NumPy's default) come from this rank's arena of the node heap (cxlmpi.pools.group:
used in place by every communicator whose ranks map it), the arena
cxlmpi.empty & co. allocate from: NumPy's arrays may take all of it.  The
heap is kept for good: such arrays stay valid after communicators are freed
and up to interpreter exit.  When the arena is full, when /dev/shm cannot
hold more (one warning), in a child made by fork(), or for smaller arrays,
NumPy's own allocator is used.
"""

from __future__ import annotations

import atexit
import importlib.abc
import importlib.machinery
import sys
from typing import Any

from mpi4py import MPI

from .. import config
from ..pools.state import arena_pool

__all__ = ["enable", "disable", "active", "stats"]

_heap: Any = None   # the Pool whose arena NumPy allocates from: kept for good


def enable(comm: MPI.Intracomm | None = None, threshold: int | None = None) -> bool:
    """Collective over `comm` (the wrapped COMM_WORLD if None) the first
    time: make NumPy allocate arrays of at least `threshold` bytes in this
    rank's arena of the heap `comm`'s pool uses.  False when the
    communicator has no pool (nothing to share)."""
    global _heap
    cfg = config.get()
    if threshold is None:
        threshold = cfg.alloc_threshold or cfg.zerocopy_threshold
    if _heap is None:
        pool = arena_pool(comm)
        if pool is None or pool.inherited or pool.arena_free() < threshold:
            return False
        pool.keep()
        _heap = pool
    if "numpy" in sys.modules:
        _install(threshold)
    else:
        # Installing the handler imports NumPy, which starts its BLAS thread
        # pool: not before the program had its chance to set OMP_NUM_THREADS
        # & co.  The handler goes in right after the program imports NumPy.
        _NumpyWatcher.arm(threshold)
    return True


def _install(threshold: int) -> None:
    from .. import _alloc

    _alloc.install(_heap.arena_address(), threshold)


@atexit.register
def _retire() -> None:
    """At exit (before cxlmpi.pools.state gives the pools back): NumPy's
    arrays stop coming from the pool, whose partition may soon be another
    job's."""
    if "cxlmpi._alloc" in sys.modules:
        from .. import _alloc

        _alloc.retire()


class _NumpyWatcher(importlib.abc.MetaPathFinder):
    """Runs `_install` right after `numpy` itself has been imported."""

    threshold = 0

    @classmethod
    def arm(cls, threshold: int) -> None:
        cls.threshold = threshold
        if not any(isinstance(f, cls) for f in sys.meta_path):
            sys.meta_path.insert(0, cls())

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> Any:
        if name != "numpy":
            return None
        sys.meta_path.remove(self)
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None:
            return spec
        loader = spec.loader
        run = loader.exec_module

        def exec_module(module: Any) -> None:
            run(module)
            _install(type(self).threshold)

        loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec


def disable() -> None:
    """NumPy allocates with its previous handler again (arrays already in the
    pool stay valid)."""
    from .. import _alloc

    _alloc.uninstall()


def active() -> bool:
    """Whether NumPy currently places large arrays in the pool."""
    if "cxlmpi._alloc" not in sys.modules:
        return False
    from .. import _alloc

    return _alloc.active()


def stats() -> dict[str, int]:
    """threshold; arena_bytes, free_bytes, live_arrays, live_bytes (of the
    arena, which cxlmpi.empty & co. share); pool_allocs (NumPy's arrays
    placed in the pool so far)."""
    from .. import _alloc

    return _alloc.stats()
