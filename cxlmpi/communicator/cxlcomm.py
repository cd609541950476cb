"""CXLComm: an mpi4py Intracomm whose large collectives run in the pool.

Its buffer collectives (Bcast, Allreduce, ..., one method per intercepted
collective) are not here: they are the compiled dispatcher's, inherited
from cxlmpi._shim.CommBase (pyx/shim/*.pxi, one file per family).  Each
parses its messages, asks whether the call is the pool's (from what MPI
requires to match on all ranks) and then makes one compiled call that runs
the whole algorithm without the GIL, or calls stock mpi4py unchanged.

This module adds what is Python's: derived communicators (Split, Create,
...) come back wrapped, the lower-case object methods (bcast, gather, ...)
delegate to cxlmpi.communicator.objects, Bcast_view passes a pool-resident
array by reference, the patched COMM_WORLD and COMM_SELF pickle as
themselves, and `wrap` makes a CXLComm of a plain communicator.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Callable

from mpi4py import MPI

from .. import _shim
from .._pool import Pool
from ..pools import agree
from ..pools.state import arena_pool, pool_state
from . import objects as _objects
from . import objects_nb as _objects_nb
from . import requests as _requests  # noqa: F401  (binds the nonblocking requests)

__all__ = ["CXLComm", "wrap", "predefined"]


class CXLComm(_shim.CommBase):
    """An Intracomm on the same MPI handle whose large collectives go
    through the shared pool; usable anywhere an Intracomm is."""

    __slots__ = ()

    # ------------------------------------------------------------ creation

    @classmethod
    def fromhandle(cls, handle: int) -> CXLComm:
        """Wrap the communicator with MPI handle `handle`."""
        return cls(MPI.Comm.fromhandle(handle))

    def Split(self, color: int = 0, key: int = 0) -> CXLComm:
        """Split communicator by color and key (result wrapped)."""
        return type(self)(super().Split(color, key))

    def Split_type(self, split_type: int, key: int = 0,
                   info: MPI.Info = MPI.INFO_NULL) -> CXLComm:
        """Split communicator by split type (result wrapped)."""
        return type(self)(super().Split_type(split_type, key, info))

    def Create(self, group: MPI.Group) -> CXLComm:
        """Create communicator from group (result wrapped)."""
        return type(self)(super().Create(group))

    def Create_group(self, group: MPI.Group, tag: int = 0) -> CXLComm:
        """Create communicator from group, collective over the group only."""
        return type(self)(super().Create_group(group, tag))

    @classmethod
    def Create_from_group(cls, group: MPI.Group, stringtag: str = "org.mpi4py",
                          info: MPI.Info = MPI.INFO_NULL,
                          errhandler: MPI.Errhandler | None = None) -> CXLComm:
        """Create communicator from group (MPI-4 sessions; result wrapped)."""
        return cls(MPI.Intracomm.Create_from_group(group, stringtag, info,
                                                   errhandler))

    # ------------------------------------------ object (pickle) collectives

    def bcast(self, obj: Any, root: int = 0) -> Any:
        """Broadcast (a large pickle through the pool)."""
        return _objects.bcast(self, obj, root)

    def gather(self, sendobj: Any, root: int = 0) -> list[Any] | None:
        """Gather (large pickles through the pool)."""
        return _objects.gather(self, sendobj, root)

    def scatter(self, sendobj: Sequence[Any] | None, root: int = 0) -> Any:
        """Scatter (large pickles through the pool)."""
        return _objects.scatter(self, sendobj, root)

    def allgather(self, sendobj: Any) -> list[Any]:
        """Gather to All (large pickles through the pool)."""
        return _objects.allgather(self, sendobj)

    def alltoall(self, sendobj: Sequence[Any]) -> list[Any]:
        """All to All Scatter/Gather (large pickles through the pool)."""
        return _objects.alltoall(self, sendobj)

    def reduce(self, sendobj: Any, op: MPI.Op | Callable[[Any, Any], Any] = MPI.SUM,
               root: int = 0) -> Any | None:
        """Reduce to Root (large pickles gathered through the pool)."""
        return _objects.reduce(self, sendobj, op, root)

    def allreduce(self, sendobj: Any,
                  op: MPI.Op | Callable[[Any, Any], Any] = MPI.SUM) -> Any:
        """Reduce to All (large pickles through the pool)."""
        return _objects.allreduce(self, sendobj, op)

    # ------------------------- nonblocking object collectives (an extension)
    # mpi4py has no nonblocking forms of its lower-case methods: these post
    # the call and return a request whose wait() returns what the blocking
    # method returns (see cxlmpi.communicator.objects_nb).

    def ibcast(self, obj: Any, root: int = 0) -> _objects_nb.ObjectRequest:
        """Nonblocking bcast (an extension of mpi4py's API): ``wait()``
        returns the object on every rank."""
        return _objects_nb.ibcast(self, obj, root)

    def igather(self, sendobj: Any, root: int = 0) -> _objects_nb.ObjectRequest:
        """Nonblocking gather (an extension of mpi4py's API): ``wait()``
        returns the list on the root, None elsewhere."""
        return _objects_nb.igather(self, sendobj, root)

    def iscatter(self, sendobj: Sequence[Any] | None,
                 root: int = 0) -> _objects_nb.ObjectRequest:
        """Nonblocking scatter (an extension of mpi4py's API): ``wait()``
        returns this rank's object."""
        return _objects_nb.iscatter(self, sendobj, root)

    def iallgather(self, sendobj: Any) -> _objects_nb.ObjectRequest:
        """Nonblocking allgather (an extension of mpi4py's API): ``wait()``
        returns the list of every rank's object."""
        return _objects_nb.iallgather(self, sendobj)

    def ialltoall(self, sendobj: Sequence[Any] | None) -> _objects_nb.ObjectRequest:
        """Nonblocking alltoall (an extension of mpi4py's API): ``wait()``
        returns the objects received, by source."""
        return _objects_nb.ialltoall(self, sendobj)

    def ireduce(self, sendobj: Any, op: MPI.Op | Callable[[Any, Any], Any] = MPI.SUM,
                root: int = 0) -> _objects_nb.ObjectRequest:
        """Nonblocking reduce (an extension of mpi4py's API): ``wait()``
        returns the rank-order fold on the root, None elsewhere."""
        return _objects_nb.ireduce(self, sendobj, op, root)

    def iallreduce(self, sendobj: Any, op: MPI.Op | Callable[[Any, Any], Any] = MPI.SUM
                   ) -> _objects_nb.ObjectRequest:
        """Nonblocking allreduce (an extension of mpi4py's API): ``wait()``
        returns the rank-order fold on every rank."""
        return _objects_nb.iallreduce(self, sendobj, op)

    def ibarrier(self) -> MPI.Request:
        """Nonblocking barrier (an extension of mpi4py's API): the request
        of ``Ibarrier``, whose ``wait()`` returns None."""
        return self.Ibarrier()

    # --------------------------------------------- pointer-passing extension

    def Bcast_view(self, array: Any, root: int = 0) -> Any:
        """Broadcast by reference: every rank gets a read-only view of the
        root's pool-resident `array` (cxlmpi.empty & co.; ignored off the
        root), whatever its size, in the time of one small message.

        The views show the root's array as it is: the root must not change
        or free it until the other ranks are done with their views (e.g. a
        Barrier).  A view keeps the pool mapped.  Raises ValueError on every
        rank when the root's array is not in this communicator's pool."""
        import numpy as np

        from .._pool import flush

        plain = MPI.Intracomm(self)
        pool = arena_pool(self)
        if not isinstance(pool_state(self), Pool):
            pool = None  # ranks in several pools (or none shared): MPI copies
        meta = None
        if self.Get_rank() == root:
            arr = np.asarray(array)
            offset = -1
            if pool is not None and (arr.flags.c_contiguous or arr.flags.f_contiguous):
                offset = pool.offset_of(arr.__array_interface__["data"][0], arr.nbytes)
            order = "C" if arr.flags.c_contiguous else "F"
            if pool is None:
                offset = -2
            meta = (offset, arr.dtype.str, arr.shape, order)
            if offset >= 0 and pool.software_coherence:
                flush(arr.__array_interface__["data"][0], arr.nbytes, False, counted=True)
        offset, dtype, shape, order = agree.bcast(plain, meta, root)
        if offset == -2:
            # (a view at the root: marking it read-only leaves the caller's
            # array writable)
            view = np.ascontiguousarray(array).view() if self.Get_rank() == root else \
                np.empty(shape, dtype)
            plain.Bcast(view, root)
            view.flags.writeable = False
            return view
        if offset < 0:
            raise ValueError(
                f"Bcast_view: the root's array (rank {root}) is not in this "
                f"communicator's pool; allocate it with cxlmpi.empty/zeros/asarray"
                f"(..., comm=comm)")
        if self.Get_rank() == root:
            view = np.asarray(array).view()
        else:
            dt = np.dtype(dtype)
            count = int(np.prod(shape, dtype=np.int64))
            buf = pool.view(offset, count * dt.itemsize)
            if pool.software_coherence:
                flush(buf.address, buf.nbytes, True, counted=True)
            view = np.frombuffer(buf, dtype=dt, count=count).reshape(shape, order=order)
        view.flags.writeable = False
        return view

    # ------------------------------------------------------------- misc

    def free(self) -> None:
        """Call `Free` unless null or predefined, as stock mpi4py: a no-op on
        the patched COMM_WORLD / COMM_SELF themselves; a copy of one (e.g.
        ``type(MPI.COMM_SELF)(MPI.COMM_SELF)``) becomes COMM_NULL without
        freeing the predefined communicator."""
        if any(self is const for const in _CONSTANTS.values()):
            return
        super().free()

    def __reduce__(self) -> str | tuple[Any, ...]:
        # The patched constants unpickle to themselves (stock: the constants
        # pickle by name); a copy of one unpickles to an equal, distinct
        # copy, as in stock mpi4py; anything else as stock does.
        for name, const in _CONSTANTS.items():
            if self is const:
                return (_predefined, (name,))
        return super().__reduce__()

    def __repr__(self) -> str:
        return f"<cxlmpi.CXLComm {self.Get_name() or hex(self.handle)}>"


# The wrapped COMM_WORLD / COMM_SELF that cxlmpi.patch() puts in place (one
# object each, made on first use), and the stock constants they replace.
_CONSTANTS: dict[str, CXLComm] = {}
_STOCK_CONSTANTS: dict[str, MPI.Intracomm] = {"COMM_WORLD": MPI.COMM_WORLD,
                                              "COMM_SELF": MPI.COMM_SELF}


def predefined(name: str) -> CXLComm:
    """The wrapped COMM_WORLD or COMM_SELF (`name`), the one object each."""
    comm = _CONSTANTS.get(name)
    if comm is None:
        comm = _CONSTANTS[name] = CXLComm(_STOCK_CONSTANTS[name])
    return comm


def _predefined(name: str) -> CXLComm:
    """Unpickle a wrapped COMM_WORLD / COMM_SELF: the one object."""
    return predefined(name)


def _stock_constant(name: str) -> MPI.Intracomm:
    """Unpickle a stock COMM_WORLD / COMM_SELF while patched: the object."""
    return _STOCK_CONSTANTS[name]


def reduce_stock(comm: MPI.Intracomm) -> str | tuple[Any, ...]:
    """Pickle a plain Intracomm while patched (copyreg, see cxlmpi.launch.entry):
    stock pickles its constants by name, which then names the wrapped ones,
    so a stock constant -- or a copy of one, which stock pickles as its
    class and the constant -- would fail to pickle.  Everything else as
    stock."""
    for name, const in _STOCK_CONSTANTS.items():
        if comm is const:
            return (_stock_constant, (name,))
    return MPI.Intracomm.__reduce__(comm)


def wrap(comm: MPI.Comm) -> MPI.Comm:
    """Return `comm` wrapped: a CXLComm on the same MPI handle.

    Intracommunicators come back as CXLComm (a CXLComm is returned as is);
    intercommunicators and topology communicators come back unchanged, since
    their collectives always pass through.

    The first collective on a wrapped COMM_WORLD checks that every rank
    agrees on the settings that choose a call's path, as patch() does: a
    rank that sends a call to MPI (CXLMPI_DISABLE, CXLMPI_THRESHOLD) would
    leave the others waiting in the pool's set-up; they all raise
    CXLMPIConfigError instead.  (Not wrap() itself, which may be called by
    some ranks only, or before a point-to-point exchange.)"""
    if isinstance(comm, CXLComm):
        return comm
    if comm == _STOCK_CONSTANTS["COMM_WORLD"]:
        from .. import config

        _shim.check_world_first(lambda: check_settings(config.get()))
    if type(comm) is MPI.Intracomm:
        return CXLComm(comm)
    if type(comm) is MPI.Comm and comm != MPI.COMM_NULL and not comm.Is_inter():
        return CXLComm(comm)
    return comm


_checked: object = None  # the settings checked already


def check_settings(cfg: object) -> None:
    """Collective over COMM_WORLD, once per reading of the settings: every
    rank must agree on the settings of config.AGREED before any call can
    take a path that depends on them (a program's first collective may
    never set a pool up, where the check would otherwise run)."""
    global _checked
    if _checked is cfg or not MPI.Is_initialized() or MPI.Is_finalized():
        return
    world = _STOCK_CONSTANTS["COMM_WORLD"]
    if world.Get_size() > 1:
        from ..pools.group import check_agreed

        check_agreed(world, cfg)
    _checked = cfg
