"""The large frames of the nonblocking object collectives through the node
heap (`objects_progress` moves the rest through MPI point-to-point).

Under CXLMPI_OBJECTS=1 a sender whose frame is too large for a header
message and at least CXLMPI_OBJECTS_THRESHOLD and CXLMPI_THRESHOLD
bytes (on a pool spanning hosts, CXLMPI_HOSTS_THRESHOLD alone: MPI would
cross the network) builds it in its own arena of the node heap -- the
memory every rank of the communicator's pool maps, where pool-resident
arrays live -- and sends each receiver only a header that holds its
offset and which heap holds it.  The receiver copies the frame out into a
private buffer (one copy, without the GIL, where MPI's point-to-point
copies twice: into its shared cells and out of them) and answers with a
one-byte message (on a tag of its own: `objects_progress`); the sender's
block goes back to its arena once every receiver has answered.  A root's
broadcast or an allgather writes its frame once, for every receiver.

Which path a frame takes is the sender's decision alone, read by every
receiver from the header, so the ranks need not agree on anything: a frame
goes through MPI where the communicator (or, failing that, COMM_WORLD when
it holds every rank of the communicator) has no pool with arenas yet -- a
nonblocking call never sets one up, that would wait for the peers --, where
the heap is full or /dev/shm cannot hold the frame, and where the pool
spans several pools (a Hierarchy).  Ranks need not find the same heap when
they post (another communicator's collectives may set COMM_WORLD's pool up
on one rank first): the header names the sender's heap (`heap_key`), and
the receiver finds it among those it maps when the header comes, or fails
the call clearly -- it never copies from a heap the sender did not name.
"""

from __future__ import annotations

import hashlib
from typing import Any

from mpi4py import MPI

from .. import config
from .._pool import Pool, PoolError, PoolNoSpace, flush
from ..pools.state import _states
from .objects import _Payload

__all__ = ["heap_of", "heaps_of", "heap_key", "find_heap", "HeapFrame", "fetch", "frame_in"]

# Set on a communicator: whether COMM_WORLD holds every rank of it.
_IN_WORLD = MPI.Comm.Create_keyval()


def heaps_of(comm: MPI.Intracomm) -> list[Pool]:
    """The node heaps this rank maps that every rank of `comm` maps too,
    setting nothing up: the heap of `comm`'s own pool, then of COMM_WORLD's
    where that holds every rank of `comm` (not so for a communicator made
    with spawned processes).  A pool that failed (its state holds the
    error) or was closed is left out."""
    handles = [comm.handle]
    if comm.handle != MPI.COMM_WORLD.handle:
        inside = comm.Get_attr(_IN_WORLD)
        if inside is None:
            ranks = MPI.Group.Translate_ranks(comm.Get_group(), list(range(comm.Get_size())),
                                              MPI.COMM_WORLD.Get_group())
            inside = MPI.UNDEFINED not in ranks
            comm.Set_attr(_IN_WORLD, inside)
        if inside:
            handles.append(MPI.COMM_WORLD.handle)
    heaps = []
    for handle in handles:
        state = _states.get(handle)
        pool = getattr(state, "pool", None)
        if (isinstance(pool, Pool) and getattr(state, "error", None) is None
                and not pool.closed and not pool.inherited):
            heap = pool.heap
            if not heap.closed and heap.arena_nbytes() > 0:
                heaps.append(heap)
    return heaps


def heap_of(comm: MPI.Intracomm) -> Pool | None:
    """The node heap a frame sent on `comm` goes to, or None: MPI (one
    rank: nobody to send to)."""
    if comm.Get_size() < 2:
        return None
    heaps = heaps_of(comm)
    return heaps[0] if heaps else None


def heap_key(heap: Pool) -> int:
    """A nonzero 64-bit name of `heap`, the same in every process that maps
    it (from its segment's name and token)."""
    digest = hashlib.blake2b(repr(heap.identity).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") or 1


def find_heap(comm: MPI.Intracomm, key: int, known: list[Pool]) -> Pool:
    """The heap named `key` among those this rank maps for `comm` now, or
    among `known` (those it mapped when it posted the call: `comm` may have
    been freed since, with the call in flight, as MPI allows); ValueError
    where there is none (the sender's heap is not mapped here)."""
    try:
        heaps = heaps_of(comm)
    except Exception:   # (a freed communicator)
        heaps = []
    for heap in heaps + known:
        if not heap.closed and heap_key(heap) == key:
            return heap
    raise ValueError("cxlmpi: a peer sent an object through a node heap this rank does not "
                     "map (its communicator's pool, or COMM_WORLD's, is not set up here, or "
                     "failed); set CXLMPI_OBJECTS=0 to send objects through MPI")


class HeapFrame:
    """A frame built in this rank's arena of the node heap (a `_Block`
    that objects._load and the wire both read): `offset` in the heap
    named `key`."""

    __slots__ = ("buffer", "view", "address", "offset", "key")

    def __init__(self, buffer: Any, key: int) -> None:
        self.buffer = buffer                   # (back to the arena when collected)
        self.view = memoryview(buffer)
        self.address: int = buffer.address
        self.offset: int = buffer.offset
        self.key = key


def frame_in(heap: Pool | None, payload: _Payload, eager_nbytes: int) -> Any:
    """`payload`'s frame: in the node heap where CXLMPI_OBJECTS is on and it
    is too large for a header message (`eager_nbytes`) and at least the
    thresholds, else a private `_Block` (objects._Payload.frame).  (Below
    CXLMPI_OBJECTS_THRESHOLD the heap saved nothing over MPI in
    tools/bench_objects.py: 2 ranks, one 2-core VM.)"""
    nbytes = payload.frame_nbytes
    cfg = config.get()
    if heap is None or not cfg.objects or cfg.disable or nbytes <= eager_nbytes:
        return payload.frame()
    floor = (cfg.floor(True) if heap.hosts > 1
             else max(cfg.floor(False), cfg.objects_threshold))
    if nbytes < floor:
        return payload.frame()
    try:
        frame = HeapFrame(heap.allocate(nbytes), heap_key(heap))
    except (MemoryError, PoolNoSpace, PoolError, ValueError):   # (full, no room, revoked,
        return payload.frame()                                  # closed)
    payload.frame(frame)
    if heap.software_coherence:
        flush(frame.address, nbytes, False, counted=True)
    return frame


def fetch(heap: Pool, offset: int, nbytes: int, into: Any) -> None:
    """Copy a peer's frame of `nbytes` at `offset` of the node heap into
    the private buffer `into` (a `_Block` of that size); ValueError where
    the range is not in the heap's arenas."""
    import numpy as np  # (not at import: a program's own imports come first)

    source = heap.view(offset, nbytes)   # (checks the range against the arenas)
    src = np.frombuffer(source, np.uint8)
    if heap.software_coherence:
        flush(source.address, nbytes, True, counted=True)
    np.copyto(np.frombuffer(into.view, np.uint8), src)   # (without the GIL)
