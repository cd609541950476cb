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

import itertools
import pickle
from array import array
from typing import Any

from mpi4py import MPI

__all__ = ["allgather", "bcast"]

# (not NumPy: `python -m cxlmpi` patches before the program runs, and the
# program may set OMP_NUM_THREADS & co. before it imports NumPy itself)


def allgather(comm: MPI.Intracomm, obj: Any) -> list[Any]:
    """Every rank's `obj`, by rank."""
    plain = MPI.Intracomm(comm)
    mine = pickle.dumps(obj, pickle.HIGHEST_PROTOCOL)
    sizes = array("q", bytes(8 * plain.Get_size()))
    plain.Allgather([array("q", [len(mine)]), MPI.INT64_T], [sizes, MPI.INT64_T])
    displs = [0, *itertools.accumulate(sizes)]
    everyone = bytearray(displs[-1])
    plain.Allgatherv([mine, MPI.BYTE], [everyone, (list(sizes), displs[:-1]), MPI.BYTE])
    view = memoryview(everyone)
    return [pickle.loads(view[d:d + n]) for d, n in zip(displs, sizes)]


def bcast(comm: MPI.Intracomm, obj: Any, root: int = 0) -> Any:
    """`obj` of rank `root`, on every rank."""
    plain = MPI.Intracomm(comm)
    size = array("q", [0])
    data = None
    if plain.Get_rank() == root:
        data = bytearray(pickle.dumps(obj, pickle.HIGHEST_PROTOCOL))
        size[0] = len(data)
    plain.Bcast([size, MPI.INT64_T], root)
    if data is None:
        data = bytearray(size[0])
    plain.Bcast([data, MPI.BYTE], root)
    return pickle.loads(data)
