"""The large frames of the nonblocking object collectives through the node
heap (`objects_progress` moves the rest through MPI point-to-point).

Under CXLMPI_OBJECTS=1 a sender whose frame is too large for a header
message and at least CXLMPI_NONBLOCKING_THRESHOLD and CXLMPI_THRESHOLD
bytes (on a pool spanning hosts, CXLMPI_HOSTS_THRESHOLD alone: MPI would
cross the network) builds it in its own arena of the node heap -- the
memory every rank of the communicator's pool maps, where pool-resident
arrays live -- and sends each receiver only a header that holds its
offset.  The receiver copies the frame out into a private buffer (one copy,
without the GIL, where MPI's point-to-point copies twice: into its shared
cells and out of them) and answers with an empty message on the frame's
tag; the sender's block goes back to its arena once every receiver has
answered.  A root's broadcast or an allgather writes its frame once, for
every receiver.

Which path a frame takes is the sender's decision alone, read by every
receiver from the header, so the ranks need not agree on anything: a frame
goes through MPI where the communicator (or, failing that, COMM_WORLD,
which then holds every rank of it) has no pool with arenas yet -- a
nonblocking call never sets one up, that would wait for the peers --, where
the heap is full or /dev/shm cannot hold the frame, and where the pool
spans several pools (a Hierarchy).  Every rank of a communicator looks the
heap up alike: pools are set up collectively, in program order.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from mpi4py import MPI

from .. import config
from .._pool import Pool, PoolNoSpace, flush
from ..pools.state import _states
from .objects import _Payload

__all__ = ["heap_of", "HeapFrame", "fetch", "frame_in"]


def heap_of(comm: MPI.Intracomm) -> Pool | None:
    """The node heap every rank of `comm` maps, or None, setting nothing
    up: the heap of `comm`'s own pool, else of COMM_WORLD's when that is
    one pool."""
    for handle in (comm.handle, MPI.COMM_WORLD.handle):
        state = _states.get(handle)
        pool = getattr(state, "pool", None)
        if isinstance(pool, Pool) and not pool.closed and not pool.inherited:
            heap = pool.heap
            if not heap.closed and heap.arena_nbytes() > 0:
                return heap
    return None


class HeapFrame:
    """A frame built in this rank's arena of the node heap (a `_Block`
    that objects._load and the wire both read): `offset` in the heap."""

    __slots__ = ("buffer", "view", "address", "offset")

    def __init__(self, buffer: Any) -> None:
        self.buffer = buffer                   # (back to the arena when collected)
        self.view = memoryview(buffer)
        self.address: int = buffer.address
        self.offset: int = buffer.offset


def frame_in(heap: Pool | None, payload: _Payload, eager_nbytes: int) -> Any:
    """`payload`'s frame: in the node heap where CXLMPI_OBJECTS is on and it
    is too large for a header message (`eager_nbytes`) and at least the
    thresholds, else a private `_Block` (objects._Payload.frame).  (At 2
    ranks on one node the heap and MPI's point-to-point take about as long
    from 1 MiB, MPI less below: measured with tools/bench_objects.py.)"""
    nbytes = payload.frame_nbytes
    cfg = config.get()
    if heap is None or not cfg.objects or cfg.disable or nbytes <= eager_nbytes:
        return payload.frame()
    floor = (cfg.floor(True) if heap.hosts > 1
             else max(cfg.floor(False), cfg.nonblocking_threshold))
    if nbytes < floor:
        return payload.frame()
    try:
        frame = HeapFrame(heap.allocate(nbytes))
    except (MemoryError, PoolNoSpace, ValueError):   # (full, no /dev/shm room, closed)
        return payload.frame()
    payload.frame(frame)
    if heap.software_coherence:
        flush(frame.address, nbytes, False, counted=True)
    return frame


def fetch(heap: Pool | None, offset: int, nbytes: int, into: Any) -> None:
    """Copy a peer's frame of `nbytes` at `offset` of the node heap into
    the private buffer `into` (a `_Block` of that size); ValueError where
    the range is not in the heap's arenas or this rank has no heap."""
    if heap is None:
        raise ValueError("cxlmpi: a peer sent an object through the node heap, which "
                         "this rank has not mapped (its communicator has no pool here)")
    source = heap.view(offset, nbytes)   # (checks the range against the arenas)
    src = np.frombuffer(source, np.uint8)
    if heap.software_coherence:
        flush(source.address, nbytes, True, counted=True)
    np.copyto(np.frombuffer(into.view, np.uint8), src)   # (without the GIL)
