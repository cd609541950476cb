"""Nonblocking collectives on Python objects: the methods comm.ibcast,
igather, iscatter, iallgather, ialltoall, ireduce and iallreduce of CXLComm
-- an extension of mpi4py's API, which has none (mpi4py/mpi4py#505 asks for
them).

Each pickles what it sends when it is posted, with mpi4py's own pickler
(as `cxlmpi.communicator.objects` does), and returns an `ObjectRequest`
whose ``wait()`` returns what the blocking method returns for the same data
on stock mpi4py (None off the root where that returns None).  Here is what
each call sends and receives, all in one step from every sender straight
to every receiver: bcast and scatter from the root, gather and reduce to
it, allgather, alltoall and allreduce from every rank to every rank.
Reductions fold in rank order, ``op(...op(op(x0, x1), x2)..., x_{p-1})``,
every rank of an allreduce alike.  How the messages move, complete and
progress: `cxlmpi.communicator.objects_progress`; large frames through
the node heap: `cxlmpi.communicator.objects_heap`.
"""

from __future__ import annotations

import operator
import time
from typing import Any, Callable

from mpi4py import MPI

from .objects import _Block, _fold, _load, _Payload
from .objects_heap import frame_in, heap_of
from .objects_progress import ObjectRequest, figures, post, reset_figures
from .objects_wire import _EAGER_NBYTES, _PREFIX

__all__ = ["ObjectRequest", "ibcast", "igather", "iscatter", "iallgather", "ialltoall",
           "ireduce", "iallreduce", "figures", "reset_figures"]




def _check_root(comm: MPI.Intracomm, root: Any) -> int:
    """`root` as an int, or MPI's ERR_ROOT (as stock mpi4py raises it)."""
    try:
        r = operator.index(root)
    except TypeError:
        r = -1
    if not 0 <= r < comm.Get_size():
        MPI.Comm.Call_errhandler(comm, MPI.ERR_ROOT)
        raise MPI.Exception(MPI.ERR_ROOT)
    return r


def _frame(heap: Any, obj: Any) -> _Block:
    """The frame of `obj`: in the node heap `heap` where it is large (and
    CXLMPI_OBJECTS on: `objects_heap`), else private."""
    return frame_in(heap, _Payload(obj), _EAGER_NBYTES - _PREFIX)


def _framed(heap: Any, obj: Any) -> tuple[_Block, _Block]:
    """(this rank's own frame, the frame it sends) of `obj`: one frame where
    it travels inside its header (copied there when posted), else two --
    what this rank unpickles must not be memory its peers are still
    reading, through the heap or from MPI's send (a program may change its
    result at once; stock's is a copy of its own), nor hold the heap while
    the program keeps the result."""
    payload = _Payload(obj)
    sent = frame_in(heap, payload, _EAGER_NBYTES - _PREFIX)
    own = payload.frame() if payload.frame_nbytes > _EAGER_NBYTES - _PREFIX else sent
    return own, sent


def _items(comm: MPI.Intracomm, sendobj: Any, heap: Any) -> list[_Block]:
    """The frames of one object per rank (None: p Nones), as stock
    mpi4py's scatter and alltoall read `sendobj` (this rank's own private)."""
    size, rank = comm.Get_size(), comm.Get_rank()
    items = [None] * size if sendobj is None else list(sendobj)
    if len(items) != size:
        raise ValueError(f"expecting {size} items, got {len(items)}")
    payloads = [_Payload(x) for x in items]   # (every one pickles before any is built)
    return [p.frame() if q == rank else frame_in(heap, p, _EAGER_NBYTES - _PREFIX)
            for q, p in enumerate(payloads)]


def _others(comm: MPI.Intracomm) -> list[int]:
    rank = comm.Get_rank()
    return [q for q in range(comm.Get_size()) if q != rank]


def _in_rank_order(frames: dict[int, Any]) -> list[Any]:
    return [_load(frames[q]) for q in range(len(frames))]


def ibcast(comm: MPI.Intracomm, obj: Any, root: int = 0) -> ObjectRequest:
    """Post a broadcast of `obj` from `root`; ``wait()`` returns every
    rank's own unpickled copy (``Intracomm.bcast``)."""
    t0 = time.perf_counter()
    root = _check_root(comm, root)
    if comm.Get_rank() != root:
        return post("ibcast", comm, None, {}, [root], None,
                    lambda frames: _load(frames[root]), t0)
    mine, frame = _framed(heap_of(comm), obj)
    return post("ibcast", comm, mine, {q: frame for q in _others(comm)}, [], root,
                lambda frames: _load(frames[root]), t0)


def igather(comm: MPI.Intracomm, sendobj: Any, root: int = 0) -> ObjectRequest:
    """Post a gather to `root`; ``wait()`` returns the list of every
    rank's object on the root, None elsewhere (``Intracomm.gather``)."""
    return _to_root("igather", comm, sendobj, root, _in_rank_order)


def ireduce(comm: MPI.Intracomm, sendobj: Any,
            op: MPI.Op | Callable[[Any, Any], Any] = MPI.SUM,
            root: int = 0) -> ObjectRequest:
    """Post a reduction to `root`; ``wait()`` returns the rank-order fold
    with `op` on the root, None elsewhere (``Intracomm.reduce``)."""
    return _to_root("ireduce", comm, sendobj, root,
                    lambda frames: _fold(_in_rank_order(frames), op))


def _to_root(name: str, comm: MPI.Intracomm, sendobj: Any, root: Any,
             finish: Callable[[dict[int, Any]], Any]) -> ObjectRequest:
    t0 = time.perf_counter()
    root = _check_root(comm, root)
    if comm.Get_rank() != root:
        return post(name, comm, None, {root: _frame(heap_of(comm), sendobj)}, [], None,
                    lambda frames: None, t0)
    return post(name, comm, _Payload(sendobj).frame(), {}, _others(comm), root, finish, t0)


def iscatter(comm: MPI.Intracomm, sendobj: Any, root: int = 0) -> ObjectRequest:
    """Post a scatter of the p objects of `sendobj` (read on `root`; None:
    p Nones); ``wait()`` returns this rank's (``Intracomm.scatter``)."""
    t0 = time.perf_counter()
    root = _check_root(comm, root)
    rank = comm.Get_rank()
    if rank != root:
        return post("iscatter", comm, None, {}, [root], None,
                    lambda frames: _load(frames[root]), t0)
    frames = _items(comm, sendobj, heap_of(comm))
    return post("iscatter", comm, frames[rank], {q: frames[q] for q in _others(comm)}, [],
                rank, lambda got: _load(got[rank]), t0)


def iallgather(comm: MPI.Intracomm, sendobj: Any) -> ObjectRequest:
    """Post an allgather; ``wait()`` returns the list of every rank's
    object (``Intracomm.allgather``)."""
    t0 = time.perf_counter()
    mine, frame = _framed(heap_of(comm), sendobj)
    others = _others(comm)
    return post("iallgather", comm, mine, {q: frame for q in others}, others,
                comm.Get_rank(), _in_rank_order, t0)


def ialltoall(comm: MPI.Intracomm, sendobj: Any) -> ObjectRequest:
    """Post an alltoall (object i to rank i; None: p Nones); ``wait()``
    returns the p objects received, by source (``Intracomm.alltoall``)."""
    t0 = time.perf_counter()
    rank = comm.Get_rank()
    frames = _items(comm, sendobj, heap_of(comm))
    others = _others(comm)
    return post("ialltoall", comm, frames[rank], {q: frames[q] for q in others}, others,
                rank, _in_rank_order, t0)


def iallreduce(comm: MPI.Intracomm, sendobj: Any,
               op: MPI.Op | Callable[[Any, Any], Any] = MPI.SUM) -> ObjectRequest:
    """Post a reduction to every rank; ``wait()`` returns the rank-order
    fold with `op`, the same on every rank (``Intracomm.allreduce``): every
    rank receives every contribution and folds them itself."""
    t0 = time.perf_counter()
    mine, frame = _framed(heap_of(comm), sendobj)
    others = _others(comm)
    return post("iallreduce", comm, mine, {q: frame for q in others}, others,
                comm.Get_rank(), lambda frames: _fold(_in_rank_order(frames), op), t0)
