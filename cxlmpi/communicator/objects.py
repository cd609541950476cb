"""Object (pickle) collectives through the pool: the lower-case methods of
CXLComm (bcast, gather, scatter, allgather, alltoall, reduce, allreduce).

Every rank pickles what it sends with mpi4py's own pickler (``MPI.pickle``:
its protocol, at least 5, its out-of-band threshold, any dumps/loads the
program installed), so large buffers inside an object -- numpy arrays,
bytearrays -- come out of the pickler as raw memory instead of being copied
into the pickle stream.  Each payload becomes one contiguous *frame*::

    u64 stream_nbytes | u64 nbuffers | u64 buffer_nbytes[i]
    | pickle stream | buffer 0 | buffer 1 | ...      (each part 64-byte aligned)

so one raw transfer per rank (or per pair of ranks) moves an object, and the
receiver unpickles straight from the frame: out-of-band buffers become views
of it, without another copy (read-only where the sender's were: pickle
records that in the stream).

The path is settled in a header step of the control lines (`Pool.agree`):
every rank publishes 1 + the bytes of its largest pickle (stream plus
out-of-band buffers; 1 when it sends nothing: "no opinion"), and all ranks
take the pool path when the largest is at least CXLMPI_THRESHOLD bytes (on a
pool spanning hosts CXLMPI_HOSTS_THRESHOLD), else
all call the stock mpi4py method on the same arguments -- which then behaves
exactly as stock.  On the pool path a second small step tells every rank the
frame sizes (8 bytes per frame), so that all know the largest, then the
frames move.

Pickling happens before any pool step, so an unpicklable object raises the
pickler's own exception (the one stock mpi4py raises) on the ranks that
hold one; like in stock MPI, ranks that have nothing to raise wait for them
(here until CXLMPI_TIMEOUT).

Reductions gather every contribution to the root through the pool and fold
them there in rank order, ``op(...op(op(x0, x1), x2)..., x_{p-1})`` -- the
calls stock mpi4py makes (MPI.Op objects are callable on Python objects, and
any Python callable is accepted); allreduce broadcasts the root's result.
"""

from __future__ import annotations

import operator
import struct
import time
from array import array
from typing import Any, Callable

from mpi4py import MPI

from .. import _shim, config
from .._pool import Pool
from ..pools.group import check_agreed
from ..pools.state import pool_for, run_pool

__all__ = ["bcast", "gather", "scatter", "allgather", "alltoall", "reduce",
           "allreduce", "POOL_CALLS", "figures", "reset_figures"]

_METHODS = ("bcast", "gather", "scatter", "allgather", "alltoall", "reduce", "allreduce")

#: Calls that went through the pool, per method, in this process (tests).
POOL_CALLS: dict[str, int] = {name: 0 for name in _METHODS}

# Per method: [pool calls, pass-through calls, bytes through the pool,
# seconds] -- what cxlmpi.stats() shows as "<method>(obj)".  Bytes are the
# frames of all ranks together (the same figure on every rank); seconds
# count pool calls, and with CXLMPI_STATS=1 pass-through calls too, as for
# the buffer collectives.
_FIGURES: dict[str, list[float]] = {name: [0, 0, 0, 0.0] for name in _METHODS}


def figures() -> dict[str, tuple[int, int, int, float]]:
    """{method: (pool_calls, passthrough_calls, nbytes, seconds)} of every
    object collective of this process, called or not."""
    return {name: (int(f[0]), int(f[1]), int(f[2]), f[3]) for name, f in _FIGURES.items()}


def reset_figures() -> None:
    """Forget every count (POOL_CALLS, which tests compare before and
    after a call, keeps counting)."""
    for name in _METHODS:
        _FIGURES[name][:] = [0, 0, 0, 0.0]


def _pooled(name: str, t0: float, nbytes: int) -> None:
    figure = _FIGURES[name]
    figure[0] += 1
    figure[2] += nbytes
    figure[3] += time.perf_counter() - t0
    POOL_CALLS[name] += 1


def _passed(name: str, t0: float) -> None:
    figure = _FIGURES[name]
    figure[1] += 1
    if config.get().stats:
        figure[3] += time.perf_counter() - t0

_Stock = MPI.Intracomm
_PICKLE = MPI.pickle  # the object stock mpi4py pickles with (same settings)
_ALIGN = 64
_HEAD = struct.Struct("<QQ")
assert array("Q").itemsize == 8
_STOCK: Any = object()  # "settled on the MPI path" (a sentinel)


def _aligned(n: int) -> int:
    return (n + _ALIGN - 1) & ~(_ALIGN - 1)


def _layout(stream_nbytes: int, buffer_nbytes: list[int]) -> tuple[int, list[int], int]:
    """(stream offset, buffer offsets, frame bytes) of a frame."""
    off = _aligned(_HEAD.size + 8 * len(buffer_nbytes))
    stream_off = off
    off += stream_nbytes
    offsets = []
    for n in buffer_nbytes:
        off = _aligned(off)
        offsets.append(off)
        off += n
    return stream_off, offsets, off


class _Block:
    """A private, 64-byte aligned buffer of `nbytes` bytes (uninitialized)."""

    __slots__ = ("view", "address")

    def __init__(self, nbytes: int) -> None:
        mem = MPI.buffer.allocate(nbytes + _ALIGN)
        pad = -mem.address % _ALIGN
        self.address: int = mem.address + pad
        self.view = memoryview(mem)[pad:pad + nbytes]  # keeps `mem` alive


class _Payload:
    """One object pickled (stream + out-of-band buffers), its frame size
    known; the frame itself is built only for the pool path."""

    __slots__ = ("stream", "buffers", "nbytes", "frame_nbytes")

    def __init__(self, obj: Any) -> None:
        self.stream, self.buffers = _PICKLE.dumps_oob(obj)
        sizes = [b.nbytes for b in self.buffers]
        #: what the path is settled on: the pickle stream and its buffers
        self.nbytes: int = len(self.stream) + sum(sizes)
        #: what travels: the frame (with its length table and alignment)
        self.frame_nbytes: int = _layout(len(self.stream), sizes)[2]

    def frame(self, block: Any = None) -> _Block:
        """The frame: length table, stream, buffers (see the module doc),
        built in `block` (anything with a ``view`` of frame_nbytes) or in
        a new _Block."""
        sizes = [b.nbytes for b in self.buffers]
        stream_off, offsets, total = _layout(len(self.stream), sizes)
        block = _Block(total) if block is None else block
        view = block.view
        struct.pack_into(f"<QQ{len(sizes)}Q", view, 0, len(self.stream), len(sizes), *sizes)
        view[stream_off:stream_off + len(self.stream)] = self.stream
        for off, n, buf in zip(offsets, sizes, self.buffers):
            view[off:off + n] = buf
        return block


def _load(block: _Block) -> Any:
    """Unpickle a frame; its out-of-band buffers become views of it."""
    view = block.view
    stream_nbytes, nbuffers = _HEAD.unpack_from(view, 0)
    sizes = list(struct.unpack_from(f"<{nbuffers}Q", view, _HEAD.size))
    stream_off, offsets, _ = _layout(stream_nbytes, sizes)
    buffers = [view[off:off + n] for off, n in zip(offsets, sizes)]
    return _PICKLE.loads_oob(view[stream_off:stream_off + stream_nbytes], buffers)


# ------------------------------------------------------------- the decision

# Set on a communicator once its ranks have agreed on the settings.
_AGREED = MPI.Comm.Create_keyval()


def _pool(comm: MPI.Intracomm) -> Pool | None:
    """The pool of `comm` (collective on first use), or None: pass through.
    The first call on a communicator checks, in one allgather, that its
    ranks agree on the settings (CXLMPI_OBJECTS above all): a rank without
    the pool path would otherwise wait in stock MPI for ranks setting a
    pool up."""
    cfg = config.get()
    if comm.Get_size() < 2:
        return None
    _shim.ready_posted(comm)   # (a blocking call: posted calls may have asked)
    if comm.Get_attr(_AGREED) is None:
        check_agreed(comm, cfg)
        comm.Set_attr(_AGREED, True)
    if cfg.disable or not cfg.objects:
        return None
    return pool_for(comm)


def _root(comm: MPI.Intracomm, root: Any) -> int | None:
    """`root` as an int when valid; None lets stock mpi4py report it."""
    try:
        r = operator.index(root)
    except TypeError:
        return None
    return r if 0 <= r < comm.Get_size() else None


def _settle(comm: MPI.Intracomm, pool: Pool, local: int) -> bool:
    """Header step: publish `local` (1 + the bytes of this rank's largest
    pickle, 1: no opinion, 0: decline); whether every rank takes the pool
    path (the largest pickle of any rank is at least CXLMPI_THRESHOLD, or
    CXLMPI_HOSTS_THRESHOLD when the pool spans hosts, and its memory is
    there: Pool.prepare) --
    otherwise every rank passes through to stock mpi4py."""
    agreed = run_pool(comm, pool, "agree", local)
    if agreed == 0 or agreed - 1 < config.get().floor(pool.hosts > 1):
        return False
    # (a pool whose data halves are not reserved yet: every rank reserves
    # them now, or all go to MPI -- the steps below cannot leave half way)
    return bool(run_pool(comm, pool, "prepare", "object collective"))


def _items(comm: MPI.Intracomm, sendobj: Any) -> tuple[list[_Payload] | None, Any]:
    """The pickled per-destination objects of scatter/alltoall, as stock
    reads them, and what to hand stock mpi4py if the call goes there (an
    iterator is read once, here).  None where stock would raise (not one
    object per rank, one that does not pickle): the rank then declines the
    pool, every rank passes through, and stock raises its own error on that
    rank while the others wait as they would under stock MPI -- never a
    peer waiting in the pool for a rank that left."""
    size = comm.Get_size()
    try:
        items = [None] * size if sendobj is None else list(sendobj)
    except Exception:   # (stock reads what is left, and raises on this rank too)
        return None, sendobj
    payloads = [_pickled(x) for x in items] if len(items) == size else [None]
    return (None if None in payloads else payloads), items


def _pickled(obj: Any) -> _Payload | None:
    """`obj` pickled, or None where it does not pickle (see _items)."""
    try:
        return _Payload(obj)
    except Exception:
        return None


def _u64(values: list[int]) -> tuple[array, list[int]]:
    """A uint64 table and the address of each entry."""
    table = array("Q", values)
    base = table.buffer_info()[0]
    return table, [base + 8 * i for i in range(len(values))]


# ------------------------------------------------------------ pool paths

def _gather(comm: MPI.Intracomm, pool: Pool, sendobj: Any, root: int,
            what: str) -> Any:
    """Gather (root >= 0) or allgather (root < 0) of pickled objects:
    (every rank's frame on readers, still pickled -- see _run -- None
    elsewhere; the bytes of every rank's frame together), or _STOCK when
    settled for MPI."""
    size, rank = comm.Get_size(), comm.Get_rank()
    payload = _pickled(sendobj)
    if not _settle(comm, pool, payload.nbytes + 1 if payload is not None else 0):
        return _STOCK
    # Frame sizes to every rank: the readers need each, all need the largest.
    mine, mine_addr = _u64([payload.frame_nbytes])
    sizes, size_addrs = _u64([0] * size)
    run_pool(comm, pool, "gather", mine_addr[0], 8, size_addrs, [8] * size, -1, 8, what)
    max_nbytes = max(sizes)
    frame = payload.frame()
    del payload
    reader = root < 0 or rank == root
    if reader:
        blocks = [frame if q == rank else _Block(sizes[q]) for q in range(size)]
        addrs = [b.address for b in blocks]
        nbytes = sizes.tolist()
    else:
        addrs, nbytes = [frame.address] * size, [0] * size
    run_pool(comm, pool, "gather", frame.address, len(frame.view), addrs, nbytes, root,
             max_nbytes, what)
    return (blocks if reader else None), sum(sizes)


def _load_all(blocks: list[_Block] | None) -> list[Any] | None:
    """The objects of gathered frames (None: none, off the root)."""
    return None if blocks is None else [_load(b) for b in blocks]


def _fold(items: list[Any], op: Callable[[Any, Any], Any]) -> Any:
    """Rank-order left fold, as stock mpi4py's reduction of Python objects."""
    result = items[0]
    for item in items[1:]:
        result = op(result, item)
    return result


# ---------------------------------------------------------------- methods

def _bcast(comm: MPI.Intracomm, pool: Pool, obj: Any, root: int) -> Any:
    """Broadcast through the pool: (the object's frame, still pickled --
    see _run --, the frame's bytes), or _STOCK when settled for MPI."""
    payload, local = None, 1          # (1: no opinion)
    if comm.Get_rank() == root:
        payload = _pickled(obj)
        local = payload.nbytes + 1 if payload is not None else 0
    if not _settle(comm, pool, local):
        return _STOCK
    size, size_addr = _u64([payload.frame_nbytes if payload is not None else 0])
    run_pool(comm, pool, "bcast", size_addr[0], 8, root)
    nbytes = size[0]
    block = payload.frame() if payload is not None else _Block(nbytes)
    del payload
    run_pool(comm, pool, "bcast", block.address, nbytes, root)
    return block, nbytes


def _run(name: str, comm: MPI.Intracomm, root: Any,
         through_pool: Callable[[Pool, int], Any], stock: Callable[[], Any]) -> Any:
    """Object collective `name`: `through_pool(pool, root)` returns (what
    makes the result, bytes moved) or _STOCK when the ranks settled for
    MPI; `stock()` runs it there (also for an invalid root, which stock
    mpi4py then reports, and without a pool).  `root` None: a collective
    without one.

    The result is made -- unpickled, folded with the program's op -- only
    after the collective has ended on every rank (`_shim.order_calls`, the
    MPI barrier of CXLMPI_ORDERING): that is code of the program's, which
    may raise on one rank only (an op that refuses, an object that does not
    unpickle there), after the data moved, as it does under stock mpi4py,
    whose other ranks then return.  Made before, the rank that raised
    never reached the barrier, and every other rank waited out
    CXLMPI_TIMEOUT in it and raised, the pool closed for good."""
    t0 = time.perf_counter()
    r = -1 if root is None else _root(comm, root)
    pool = _pool(comm) if r is not None else None
    if pool is not None:
        result = through_pool(pool, r)
        if result is not _STOCK:
            make, nbytes = result
            _shim.order_calls(comm)
            _pooled(name, t0, nbytes)
            return make()
    out = stock()
    _passed(name, t0)
    return out


def _then(moved: Any, make: Callable[[Any], Any]) -> Any:
    """A pool path's (what makes the result, bytes) for _run from what it
    moved -- (frames, bytes) -- and `make(frames)`; _STOCK as it is."""
    if moved is _STOCK:
        return _STOCK
    frames, nbytes = moved
    return (lambda: make(frames)), nbytes


def bcast(comm: MPI.Intracomm, obj: Any, root: int = 0) -> Any:
    """Broadcast a Python object from `root` (``Intracomm.bcast``); a large
    pickle goes through the pool, every rank gets its own unpickled copy."""
    return _run("bcast", comm, root,
                lambda pool, r: _then(_bcast(comm, pool, obj, r), _load),
                lambda: _Stock.bcast(comm, obj, root))


def gather(comm: MPI.Intracomm, sendobj: Any, root: int = 0) -> list[Any] | None:
    """Gather Python objects to `root` (``Intracomm.gather``): the list of
    every rank's object on the root, None elsewhere."""
    return _run("gather", comm, root,
                lambda pool, r: _then(_gather(comm, pool, sendobj, r, "gather"), _load_all),
                lambda: _Stock.gather(comm, sendobj, root))


def allgather(comm: MPI.Intracomm, sendobj: Any) -> list[Any]:
    """Gather Python objects to every rank (``Intracomm.allgather``)."""
    return _run("allgather", comm, None,
                lambda pool, r: _then(_gather(comm, pool, sendobj, -1, "allgather"),
                                      _load_all),
                lambda: _Stock.allgather(comm, sendobj))


def scatter(comm: MPI.Intracomm, sendobj: Any, root: int = 0) -> Any:
    """Scatter the p objects of `sendobj` (on `root`; None: p Nones) one to
    each rank (``Intracomm.scatter``)."""
    t0 = time.perf_counter()
    r = _root(comm, root)
    pool = _pool(comm) if r is not None else None
    if pool is None:
        out = _Stock.scatter(comm, sendobj, root)
        _passed("scatter", t0)
        return out
    size, rank = comm.Get_size(), comm.Get_rank()
    payloads: list[_Payload] | None = None
    local = 1
    if rank == r:
        payloads, sendobj = _items(comm, sendobj)
        local = 1 + max(p.nbytes for p in payloads) if payloads is not None else 0
    if not _settle(comm, pool, local):
        out = _Stock.scatter(comm, sendobj, root)
        _passed("scatter", t0)
        return out
    sizes, size_addrs = _u64([p.frame_nbytes for p in payloads] if payloads is not None
                             else [0] * size)
    run_pool(comm, pool, "bcast", size_addrs[0], 8 * size, r)
    max_nbytes = max(sizes)
    if payloads is not None:
        frames = [p.frame() for p in payloads]
        del payloads
        block = frames[rank]
        send_addrs = [f.address for f in frames]
        send_nbytes = sizes.tolist()
    else:
        block = _Block(sizes[rank])
        send_addrs, send_nbytes = [block.address] * size, [0] * size
    recv_nbytes = [0] * size
    recv_nbytes[r] = sizes[rank]
    run_pool(comm, pool, "exchange", send_addrs, send_nbytes, [block.address] * size,
             recv_nbytes, max_nbytes, "scatter")
    _shim.order_calls(comm)   # (the end of the collective, before any unpickling: _run)
    _pooled("scatter", t0, sum(sizes))
    return _load(block)


def alltoall(comm: MPI.Intracomm, sendobj: Any) -> list[Any]:
    """Every rank sends its i-th object to rank i (``Intracomm.alltoall``;
    `sendobj` None: p Nones); returns the p objects received, by source."""
    t0 = time.perf_counter()
    pool = _pool(comm)
    if pool is None:
        out = _Stock.alltoall(comm, sendobj)
        _passed("alltoall", t0)
        return out
    size, rank = comm.Get_size(), comm.Get_rank()
    payloads, sendobj = _items(comm, sendobj)
    if not _settle(comm, pool,
                   1 + max(p.nbytes for p in payloads) if payloads is not None else 0):
        out = _Stock.alltoall(comm, sendobj)
        _passed("alltoall", t0)
        return out
    # Every rank's row of frame sizes to every rank: all need the largest.
    row, row_addr = _u64([p.frame_nbytes for p in payloads])
    matrix, _ = _u64([0] * size * size)
    base = matrix.buffer_info()[0]
    run_pool(comm, pool, "gather", row_addr[0], 8 * size,
             [base + 8 * size * q for q in range(size)], [8 * size] * size, -1, 8 * size,
             "alltoall")
    max_nbytes = max(matrix)
    sizes = [matrix[q * size + rank] for q in range(size)]
    frames = [p.frame() for p in payloads]
    del payloads
    blocks = [frames[rank] if q == rank else _Block(sizes[q]) for q in range(size)]
    run_pool(comm, pool, "exchange", [f.address for f in frames], row.tolist(),
             [b.address for b in blocks], sizes, max_nbytes, "alltoall")
    del frames
    _shim.order_calls(comm)   # (the end of the collective, before any unpickling: _run)
    _pooled("alltoall", t0, sum(matrix))
    return [_load(b) for b in blocks]


def reduce(comm: MPI.Intracomm, sendobj: Any,
           op: MPI.Op | Callable[[Any, Any], Any] = MPI.SUM, root: int = 0) -> Any:
    """Reduce Python objects to `root` with `op` (``Intracomm.reduce``): the
    contributions are gathered through the pool and folded in rank order."""

    def fold(blocks: list[_Block] | None) -> Any:
        return None if blocks is None else _fold(_load_all(blocks), op)

    def through_pool(pool: Pool, r: int) -> Any:
        return _then(_gather(comm, pool, sendobj, r, "reduce"), fold)

    return _run("reduce", comm, root, through_pool,
                lambda: _Stock.reduce(comm, sendobj, op, root))


def allreduce(comm: MPI.Intracomm, sendobj: Any,
              op: MPI.Op | Callable[[Any, Any], Any] = MPI.SUM) -> Any:
    """Reduce Python objects to every rank (``Intracomm.allreduce``): a
    reduce to rank 0, then a broadcast of its result (each settled alike)."""

    def through_pool(pool: Pool, r: int) -> Any:
        gathered = _gather(comm, pool, sendobj, 0, "allreduce")
        if gathered is _STOCK:
            return _STOCK
        blocks, nbytes = gathered
        # (rank 0 folds between the gather and the bcast, as stock mpi4py's
        # reduce-then-bcast does: an op that raises there leaves the other
        # ranks waiting for the bcast under stock too)
        result = _fold(_load_all(blocks), op) if blocks is not None else None
        del blocks, gathered
        spread = _bcast(comm, pool, result, 0)
        if spread is _STOCK:
            value = _Stock.bcast(comm, result, 0)
            return (lambda: value), nbytes
        block, more = spread
        return (lambda: _load(block)), nbytes + more

    return _run("allreduce", comm, None, through_pool,
                lambda: _Stock.allreduce(comm, sendobj, op))
