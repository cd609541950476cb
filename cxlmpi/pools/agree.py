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

import hashlib
import itertools
import pickle
from array import array
from typing import Any

from mpi4py import MPI

__all__ = ["allgather", "bcast", "bcast_kept"]

# What `bcast_kept` returned last, by name: (the pickle's digest, the object)
_kept: dict[str, tuple[bytes, Any]] = {}

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
    mine = pickle.dumps(obj, pickle.HIGHEST_PROTOCOL) \
        if MPI.Intracomm(comm).Get_rank() == root else None
    return pickle.loads(_bcast_bytes(comm, mine, root))


def _bcast_bytes(comm: MPI.Intracomm, data: bytes | None, root: int) -> bytes | bytearray:
    """The bytes `data` of rank `root`, on every rank."""
    plain = MPI.Intracomm(comm)
    size = array("q", [0 if data is None else len(data)])
    plain.Bcast([size, MPI.INT64_T], root)
    if data is None:
        data = bytearray(size[0])
    plain.Bcast([data, MPI.BYTE], root)
    return data


def bcast_kept(comm: MPI.Intracomm, name: str, obj: Any, root: int = 0) -> Any:
    """`bcast` of an object that seldom changes (`name`: which one, e.g.
    the selection cache's entries, sent at every communicator's set-up):
    the root sends the digest of its pickle, and the pickle itself only
    where some rank holds another one.  Every rank keeps what it returned
    last, and returns that very object again while it is unchanged (to be
    read, not changed)."""
    plain = MPI.Intracomm(comm)
    data = None
    digest = bytearray(16)
    if plain.Get_rank() == root:
        data = pickle.dumps(obj, pickle.HIGHEST_PROTOCOL)
        digest[:] = hashlib.blake2b(data, digest_size=16).digest()
    plain.Bcast([digest, MPI.BYTE], root)
    kept = _kept.get(name)
    stale = kept is None or kept[0] != digest
    need = array("q", [stale])
    plain.Allreduce(MPI.IN_PLACE, [need, MPI.INT64_T], MPI.MAX)
    if need[0]:
        data = _bcast_bytes(comm, data, root)
        if stale:
            kept = _kept[name] = (bytes(digest), pickle.loads(data))
    assert kept is not None
    return kept[1]
