"""Object exchanges of cxlmpi's own set-up steps (which ranks share a pool,
where it lies, what the cache says), made so that no rank holds the GIL
while it waits for a peer.

mpi4py's lower-case collectives set up a private duplicate of the
communicator on their first call (``allreduce``, ``reduce``, the scans:
``MPI_Comm_dup``, a collective) with the GIL held.  A process whose threads
each set up a communicator of their own (``MPI_THREAD_MULTIPLE``) then
deadlocks when, on one rank, thread A holds the GIL in that step waiting
for its peer's thread A, while on the peer thread B holds the GIL waiting
for thread B here: each waits for a thread that needs the GIL the other
holds.  These exchanges go through the upper-case buffer collectives,
which wait with the GIL released, and take no duplicate.

Every function is collective over `comm` (a plain or wrapped intra-
communicator: they talk through a plain one on the same handle, so that a
wrapped communicator's methods never come back into cxlmpi).
"""

from __future__ import annotations

import pickle
from typing import Any

import numpy as np
from mpi4py import MPI

__all__ = ["allgather", "bcast"]


def allgather(comm: MPI.Intracomm, obj: Any) -> list[Any]:
    """Every rank's `obj`, by rank."""
    plain = MPI.Intracomm(comm)
    mine = np.frombuffer(pickle.dumps(obj, pickle.HIGHEST_PROTOCOL), np.uint8)
    sizes = np.empty(plain.Get_size(), np.int64)
    plain.Allgather(np.array([mine.size], np.int64), sizes)
    displs = np.zeros_like(sizes)
    np.cumsum(sizes[:-1], out=displs[1:])
    everyone = np.empty(int(sizes.sum()), np.uint8)
    plain.Allgatherv(mine, [everyone, sizes, displs, MPI.BYTE])
    return [pickle.loads(everyone[d:d + n]) for d, n in zip(displs, sizes)]


def bcast(comm: MPI.Intracomm, obj: Any, root: int = 0) -> Any:
    """`obj` of rank `root`, on every rank."""
    plain = MPI.Intracomm(comm)
    size = np.zeros(1, np.int64)
    data = None
    if plain.Get_rank() == root:
        data = bytearray(pickle.dumps(obj, pickle.HIGHEST_PROTOCOL))
        size[0] = len(data)
    plain.Bcast(size, root)
    if data is None:
        data = bytearray(int(size[0]))
    plain.Bcast(data, root)
    return pickle.loads(data)
