"""Optional: NumPy places every large array in the pool (NEP 49), so that an
unmodified program's collectives on them take the zero-copy paths.

    CXLMPI_ALLOC=1 mpiexec -n 4 python -m cxlmpi app.py     # or --alloc
    cxlmpi.alloc.enable()                                     # from a program

Arrays of CXLMPI_ZEROCOPY_THRESHOLD bytes and more allocated by NumPy in this
thread (NumPy keeps its handler per context: threads started afterwards use
NumPy's default) come from a region of this rank's arena in COMM_WORLD's
pool, reserved for good: such arrays stay valid after communicators are
freed and up to interpreter exit.  When the region is full, or for smaller
arrays, NumPy's own allocator is used.
"""

from __future__ import annotations

from typing import Any

from mpi4py import MPI

from . import arrays, config

__all__ = ["enable", "disable", "active", "stats"]

_region: Any = None   # the reserved PoolBuffer: never released


def enable(comm: MPI.Intracomm | None = None, threshold: int | None = None,
           fraction: float = 0.75) -> bool:
    """Collective over `comm` (the wrapped COMM_WORLD if None) the first
    time: reserve `fraction` of this rank's arena and make NumPy allocate
    arrays of at least `threshold` bytes there.  False when the communicator
    has no pool (nothing to share)."""
    from . import _alloc

    global _region
    threshold = config.get().zerocopy_threshold if threshold is None else threshold
    if _region is None:
        pool = arrays.pool_of(comm)
        if pool is None:
            return False
        nbytes = int(pool.arena_free() * fraction) // 4096 * 4096
        if nbytes < threshold:
            return False
        _region = pool.allocate(nbytes)
    _alloc.install(_region.address, _region.nbytes, threshold)
    return True


def disable() -> None:
    """NumPy allocates with its previous handler again (arrays already in the
    pool stay valid)."""
    from . import _alloc

    _alloc.uninstall()


def active() -> bool:
    """Whether NumPy currently places large arrays in the pool."""
    from . import _alloc

    return _alloc.active()


def stats() -> dict[str, int]:
    """threshold, region_bytes, free_bytes, live_arrays, live_bytes,
    pool_allocs (arrays placed in the pool so far)."""
    from . import _alloc

    return _alloc.stats()
