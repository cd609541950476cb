"""Pool-resident numpy arrays: memory every rank of a communicator's pool
maps, so that collectives on them move each byte the fewest times.

    a = cxlmpi.empty((1 << 21,), np.float64, comm=comm)   # in comm's pool
    b = cxlmpi.zeros_like(a)
    comm.Allreduce(a, b)        # peers read a and write b in place

Each rank allocates from its own arena of the pool (CXLMPI_ARENA_SIZE per
rank; first fit, freed blocks coalesce; a C allocator with its own lock, so
threads may allocate at once and a garbage collection may free an array in
the middle of another's allocation).  An array is an ordinary numpy array: its
memory goes back to the arena when it is garbage-collected, and it keeps the
pool mapped, so it stays valid after its communicator is freed and at exit.

Setting a communicator's pool up is collective: the first of these calls on
a communicator must be made by all of its ranks (as the first collective
would be).  On a communicator without a pool (one rank, or no two ranks
sharing memory), in a child made by fork() (the pool is its parent's), and
when /dev/shm or the pool file cannot hold the array (one warning per
process) they return ordinary numpy arrays.
"""

from __future__ import annotations

import math
import operator
import sys
from typing import Any

import numpy as np
from mpi4py import MPI

from .._pool import PoolNoSpace, PoolRevoked
from ..errors import CXLMPIPoolError
from ..pools.state import arena_pool

__all__ = ["empty", "zeros", "empty_like", "zeros_like", "asarray", "is_resident",
           "write_back", "invalidate", "arena_pool"]


def empty(shape: int | tuple[int, ...], dtype: Any = float, order: str = "C", *,
          comm: MPI.Intracomm | None = None) -> np.ndarray:
    """A new uninitialized array in the pool of `comm` (COMM_WORLD if None)."""
    dt = np.dtype(dtype)
    shape = (shape,) if isinstance(shape, (int, np.integer)) else tuple(shape)
    shape = tuple(operator.index(n) for n in shape)
    if order not in ("C", "F"):
        raise ValueError("order must be 'C' or 'F'")
    pool = arena_pool(comm)  # collective the first time: before any refusal
    if pool is None or pool.inherited:
        return np.empty(shape, dt, order)
    count = math.prod(shape)
    try:
        buf = pool.allocate(_nbytes(shape, dt))
    except PoolNoSpace:
        return np.empty(shape, dt, order)   # the pool said so, once
    except PoolRevoked as exc:
        raise CXLMPIPoolError(str(exc)) from None
    flat = np.frombuffer(buf, dtype=dt, count=count)
    return flat.reshape(shape, order=order)


def _nbytes(shape: tuple[int, ...], dt: np.dtype) -> int:
    """Bytes of an array of `shape` and `dt`, refused as np.empty refuses it
    (same exception and message): in Python integers, so that a size which
    wraps around an int64 never reaches the pool's allocator."""
    for n in shape:
        if operator.index(n) > sys.maxsize:
            raise ValueError("Maximum allowed dimension exceeded")
    if any(n < 0 for n in shape):
        raise ValueError("negative dimensions are not allowed")
    nbytes = math.prod(shape) * dt.itemsize
    if nbytes > sys.maxsize:
        raise ValueError("array is too big; `arr.size * arr.dtype.itemsize` is larger "
                         "than the maximum possible size.")
    return nbytes


def zeros(shape: int | tuple[int, ...], dtype: Any = float, order: str = "C", *,
          comm: MPI.Intracomm | None = None) -> np.ndarray:
    """A new zero-filled array in the pool of `comm`."""
    a = empty(shape, dtype, order, comm=comm)
    a.fill(0)
    return a


def empty_like(prototype: np.ndarray, dtype: Any = None, *,
               comm: MPI.Intracomm | None = None) -> np.ndarray:
    """An uninitialized pool array with the shape (and dtype) of `prototype`."""
    proto = np.asarray(prototype)
    order = "F" if proto.flags.f_contiguous and not proto.flags.c_contiguous else "C"
    return empty(proto.shape, proto.dtype if dtype is None else dtype, order, comm=comm)


def zeros_like(prototype: np.ndarray, dtype: Any = None, *,
               comm: MPI.Intracomm | None = None) -> np.ndarray:
    """A zero-filled pool array with the shape (and dtype) of `prototype`."""
    a = empty_like(prototype, dtype, comm=comm)
    a.fill(0)
    return a


def asarray(x: Any, dtype: Any = None, *, comm: MPI.Intracomm | None = None) -> np.ndarray:
    """`x` itself if it already lives in the pool of `comm` (with `dtype`),
    else a pool copy of it."""
    src = np.asarray(x, dtype=dtype)
    if arena_pool(comm) is None or is_resident(src, comm=comm):
        return src
    out = empty(src.shape, src.dtype, comm=comm)
    np.copyto(out, src)
    return out


def write_back(a: Any, *, comm: MPI.Intracomm | None = None) -> None:
    """Make what this rank wrote into its pool array `a` by hand visible to
    peers that read it outside a collective (through a view of
    `comm.Bcast_view` they already hold, say): under software coherence
    (CXLMPI_COHERENCE=sw or emulate, or a pool spanning hosts) the array's
    cache lines are written back; otherwise, and for an array outside the
    pool, nothing is needed and nothing is done.  Collectives do this for
    their own buffers (see the docs' Coherence page: what a collective flushes); call it
    between the writes and whatever tells the peers to read (a Barrier)."""
    _flush(a, comm, False)


def invalidate(a: Any, *, comm: MPI.Intracomm | None = None) -> None:
    """Before reading a pool array `a` (a peer's, through a view) that its
    owner changed outside a collective and wrote back (`write_back`): under
    software coherence this rank's cached lines of it are dropped (any it
    wrote itself are written back first), so that the loads that follow
    see memory; otherwise nothing is done."""
    _flush(a, comm, True)


def _flush(a: Any, comm: MPI.Intracomm | None, invalidate: bool) -> None:
    from .._pool import flush

    arr = np.asarray(a)
    if not (arr.flags.c_contiguous or arr.flags.f_contiguous) or arr.nbytes == 0:
        raise ValueError("cxlmpi.write_back/invalidate: a contiguous array, please")
    pool = arena_pool(comm)
    if pool is None or pool.closed or not pool.software_coherence:
        return
    address = arr.__array_interface__["data"][0]
    if pool.offset_of(address, arr.nbytes) >= 0:
        flush(address, arr.nbytes, invalidate, counted=True)


def is_resident(a: Any, *, comm: MPI.Intracomm | None = None) -> bool:
    """Whether the contiguous array `a` lives in the pool of `comm`, so that
    peers can use it in place."""
    arr = np.asarray(a)
    if not (arr.flags.c_contiguous or arr.flags.f_contiguous):
        return False
    pool = arena_pool(comm)
    if pool is None or pool.closed:
        return False
    return pool.offset_of(arr.__array_interface__["data"][0], arr.nbytes) >= 0
