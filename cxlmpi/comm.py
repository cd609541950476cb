"""CXLComm: an mpi4py Intracomm whose large collectives run in the pool.

One method per intercepted collective.  Each asks the dispatcher whether the
call is the pool's; if so one compiled call runs the whole algorithm without
the GIL, otherwise the call goes to stock mpi4py unchanged.  Every decision
uses only what MPI requires to match on all ranks (see pyx/_shim.pyx).  The
lower-case object methods (bcast, gather, ...) delegate to cxlmpi.objects.
"""

from __future__ import annotations

import atexit
from collections.abc import Sequence
from typing import Any, Callable

from mpi4py import MPI

from . import _shim, config, progress
from ._pool import NO_SPACE, OP_CODES, TYPE_CODES, Pool, PoolFailure, warn_no_space
from .errors import (
    CXLMPIError,
    CXLMPIMismatchError,
    CXLMPIPeerError,
    CXLMPIPoolError,
    CXLMPITimeoutError,
)
from .group import create_pool
from .hierarchy import COLLECTIVES as HIERARCHY_COLLECTIVES
from .hierarchy import Hierarchy

__all__ = ["CXLComm", "wrap", "predefined"]


class _State:
    """Pool state of one MPI communicator (shared by every Python object
    with the same handle); `pool` is None when its ranks share no pool, a
    Hierarchy when they span several; `only` (for a Hierarchy) tells, per
    collective of config.COLLECTIVES, whether it runs over the hierarchy."""

    __slots__ = ("pool", "error", "only", "probe")

    def __init__(self, pool: Pool | Hierarchy | None,
                 probe: MPI.Intracomm | None = None) -> None:
        self.pool = pool
        self.probe = probe  # what the pool's waits probe for MPI progress
        self.error: CXLMPIError | None = None
        self.only: tuple[bool, ...] | None = None
        if isinstance(pool, Hierarchy):
            self.only = tuple(c in HIERARCHY_COLLECTIVES for c in config.COLLECTIVES)

    def close(self) -> None:
        if self.pool is not None:
            self.pool.close()
            self.pool = None

    def free(self) -> None:
        """Close, and free the progress communicator (collective: the
        communicator itself is being freed on every rank)."""
        self.close()
        probe, self.probe = self.probe, None
        if probe is not None and not MPI.Is_finalized():
            probe.Free()


# handle -> state (the dict the compiled hot path reads); an MPI attribute on
# the communicator removes the entry when MPI frees it, whoever frees it.
_states: dict[int, _State] = _shim.states


def _on_free(comm: MPI.Comm, keyval: int, state: _State) -> None:
    # Forget the state first: MPI may give the handle to a new communicator,
    # which must never find this one's (closed) pool.
    if _states.get(comm.handle) is state:
        del _states[comm.handle]
    state.free()


_KEYVAL = MPI.Comm.Create_keyval(delete_fn=_on_free)


@atexit.register
def _close_at_exit() -> None:
    """Let go of the pools of communicators never freed, so that a partition
    of a pool file or device is given back when the job ends (MPI has no
    collective left to run: each rank lets go of its own mappings).  This
    runs before cxlmpi.backends closes the devices (atexit is last in, first
    out); pool arrays still alive keep their memory until the process ends
    (Pool.detach).  In a child made by fork() it touches nothing shared."""
    for state in list(_states.values()):
        pool = state.pool.pool if isinstance(state.pool, Hierarchy) else state.pool
        if pool is not None:
            pool.detach()


def _state_for(comm: MPI.Intracomm) -> _State:
    """Collective: set up the pool state of `comm` on its first pool call.
    The set-up talks through a plain Intracomm on the same handle: its
    lower-case (object) collectives must not come back here.  A pool that
    /dev/shm (or the pool file) cannot hold leaves the communicator with MPI
    alone, with one warning (every rank sees the same error: all agree)."""
    plain = MPI.Intracomm(comm)
    try:
        pool = create_pool(plain)
    except CXLMPIPoolError as exc:
        if NO_SPACE not in str(exc):
            raise
        warn_no_space("a communicator's pool (its collectives go to MPI)",
                      config.get().pool_size)
        pool = None
    state = _State(pool, progress.attach(pool, plain) if config.get().progress else None)
    _states[comm.handle] = state
    comm.Set_attr(_KEYVAL, state)
    return state


def _describe(call: tuple) -> str:
    what, root, op, tcode, nbytes = call
    words = [what]
    if what not in ("Barrier",) and not what.endswith(" header"):
        words.append(f"of {nbytes} bytes")
    if root >= 0:
        words.append(f"root {root}")
    if op >= 0:
        words.append(f"op {_OP_NAMES.get(op, op)}")
    if tcode >= 0:
        words.append(f"type {_TYPE_NAMES.get(tcode, tcode)}")
    return " ".join(w for w in words if w)


def _mismatch(comm: MPI.Intracomm, state: _State, exc: PoolFailure) -> CXLMPIError:
    """The error of a call whose ranks disagree (every rank raises it; the
    pool stays usable: every rank stopped at the same step)."""
    name = comm.Get_name() or f"communicator {comm.handle:#x}"
    head = (f"cxlmpi: {exc.what} on {name} (rank {comm.Get_rank()} of "
            f"{comm.Get_size()}): the ranks' calls do not match: ")
    if exc.rank < 0:
        return CXLMPIMismatchError(
            head + "a rank sends a block of a size its receiver does not expect "
            "(the counts of the ranks must agree, as MPI requires)")
    calls = state.pool.signatures() if state.pool is not None else []
    if not calls:
        return CXLMPIMismatchError(head + "a rank passed the call to MPI")
    seen: dict[tuple, list[int]] = {}
    for q, call in enumerate(calls):
        seen.setdefault(call, []).append(q)
    parts = [f"rank{'s' if len(qs) > 1 else ''} {', '.join(map(str, qs))}: {_describe(c)}"
             for c, qs in seen.items()]
    return CXLMPIMismatchError(
        head + "; ".join(parts) + " (sizes, roots, ops and types must agree on every rank, "
        "as MPI requires)")


def _fail(comm: MPI.Intracomm, state: _State, exc: PoolFailure) -> CXLMPIError:
    """Turn an algorithm failure into the exception the user sees; after a
    timeout or a dead peer the pool of this communicator is unusable (ranks
    are out of step)."""
    if exc.mismatch:
        return _mismatch(comm, state, exc)
    pool = state.pool
    missing = pool.missing_ranks() if pool is not None else [exc.rank]
    name = comm.Get_name() or f"communicator {comm.handle:#x}"
    if exc.timed_out:
        timeout = config.get().timeout
        err: CXLMPIError = CXLMPITimeoutError(
            f"cxlmpi: {exc.what} on {name} (rank {comm.Get_rank()} of "
            f"{comm.Get_size()}) timed out after {timeout:g} s waiting for "
            f"ranks {missing} (raise CXLMPI_TIMEOUT if they are just slow)")
    else:
        err = CXLMPIPeerError(
            f"cxlmpi: {exc.what} on {name} (rank {comm.Get_rank()}): rank "
            f"{exc.rank} died in the middle of the collective")
    state.close()
    state.error = err
    return err


_shim.bind(_state_for, _fail)

_OP_NAMES = {code: name for name, code in OP_CODES.items()}
_TYPE_NAMES = {code: name for name, code in TYPE_CODES.items()}


def pool_for(comm: MPI.Intracomm) -> Pool | None:
    """The pool of `comm`, set up on first use (collective then: every rank
    must call it at the same point), or None when its ranks share no pool.
    Raises the error that broke the pool, if one did."""
    return _shim.pool_of(comm)


def pool_state(comm: MPI.Intracomm) -> Pool | Hierarchy | None:
    """What `comm`'s ranks share: a Pool, a Hierarchy of pools, or None (set
    up on first use, collective then)."""
    _shim.pool_of(comm, 0)  # Barrier: every kind of pool state runs it
    return _states[comm.handle].pool


def arena_pool(comm: MPI.Intracomm | None) -> Pool | None:
    """The pool whose arenas hold `comm`'s pool-resident arrays (its group's
    pool when it spans several; None without arenas): collective the first
    time.  `comm` None: the wrapped COMM_WORLD."""
    comm = wrap(MPI.COMM_WORLD) if comm is None else comm
    pool = pool_state(comm) if not isinstance(comm, MPI.Intercomm) else None
    if isinstance(pool, Hierarchy):
        pool = pool.pool
    if pool is not None and pool.arena_nbytes() == 0:
        return None
    return pool


def run_pool(comm: MPI.Intracomm, pool: Pool, method: str, *args: Any) -> Any:
    """Call `pool.<method>(*args)`, turning an algorithm failure into the
    CXLMPIError the user sees (timeout, dead peer)."""
    return _shim.run_pool(comm, getattr(pool, method), *args)


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

        from ._pool import flush

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
        offset, dtype, shape, order = plain.bcast(meta, root)
        if offset == -2:
            view = np.ascontiguousarray(array) if self.Get_rank() == root else \
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
    """Pickle a plain Intracomm while patched (copyreg, see cxlmpi.entry):
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
    their collectives always pass through."""
    if isinstance(comm, CXLComm):
        return comm
    if type(comm) is MPI.Intracomm:
        return CXLComm(comm)
    if type(comm) is MPI.Comm and comm != MPI.COMM_NULL and not comm.Is_inter():
        return CXLComm(comm)
    return comm


# The object collectives build on pool_for/run_pool above (import cycle).
from . import objects as _objects  # noqa: E402
