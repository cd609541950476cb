"""What the test scripts of posted calls share (imported from beside them)."""

from __future__ import annotations

from mpi4py import MPI

from cxlmpi import _shim


def ready(comm: MPI.Intracomm) -> MPI.Intracomm:
    """`comm`, its pool able to take posted calls: set up by its first
    blocking collective, and its data halves reserved (collective), which a
    posted call never waits for its peers to do (tests/scripts/posted_first.py
    shows how a program gets there: a blocking collective after a posted
    call).  Counts no call."""
    comm.Barrier()
    pool = _shim.pool_of(comm, 0)
    if pool is not None and hasattr(pool, "prepare"):
        pool.prepare()
    return comm
