"""The requests of nonblocking and persistent collectives that run in the pool.

A call the pool takes (``comm.Iallreduce(a, b)``, planned by the compiled
shim: pyx/shim/nonblocking.pxi) is posted to its pool's worker thread and
returned as a generalized request (``MPI.Grequest``): a real MPI request,
so ``Wait``, ``Test``, ``MPI.Request.Waitall`` and the rest work on lists
that mix it with point-to-point and stock requests.  The shim starts it
with C callbacks (`query` here only where the call failed or staged a
message); the worker completes it (``MPI_Grequest_complete``) once the
call has run.  `PoolRequest` adds
what MPI cannot know (its methods that every call runs are compiled, in
pyx/shim/requests.pxi): its ``Wait`` sleeps until the worker has run the call
(instead of spinning in MPI's progress loop, which would take the core the
worker needs) and raises cxlmpi's own error when the call failed in the
pool; where MPI completes the request (``Waitall``), a failure surfaces as
an MPI error whose message cxlmpi prints.

A persistent collective (``comm.Allreduce_init(a, b)``) is planned once:
`PersistentRequest.Start` posts the same plan each time and takes the
generalized request's handle, so ``Wait``/``Test``/``Waitall`` see an MPI
request while it is active and ``MPI_REQUEST_NULL`` (inactive) after.
Lists start with ``MPI.Prequest.Startall`` as with stock requests (see
`_route`), stock persistent requests in the same list too.
"""

from __future__ import annotations

import ctypes
from typing import Any

from mpi4py import MPI

from .. import _shim
from ..errors import CXLMPIMismatchError, CXLMPIPoolError, CXLMPITimeoutError

__all__ = ["PoolRequest", "PersistentRequest"]


def query(record: Any, rc: int) -> None:
    """The end of a posted call that failed (`rc`, the pool's code) or
    staged a message, in MPI's query of its request (the shim's C query
    function has filled the status; a call that ran and staged nothing
    needs none of this)."""
    if rc == 0:
        _shim.finish(record.plan)   # (staged messages back)
        return
    if not record.raised:
        # Inside MPI's completion (where the worker may not have ended the
        # call yet: never wait for it here): say what failed, close nothing
        # (the communicator's next call does, see _shim settle_posted).
        raise record.error or _error_of(record, record.op.error(rc))


def _error_of(record: Any, exc: Any) -> Exception:
    """The error of a failed call, without the side effects of closing its
    pool (which `failure` has)."""
    comm = record.comm
    where = f"{exc.what} (rank {comm.Get_rank()} of {comm.Get_size()})"
    if exc.mismatch:
        return CXLMPIMismatchError(f"cxlmpi: {where}: the ranks' calls do not match "
                                   f"(sizes, roots, ops and types must agree, as MPI "
                                   f"requires)")
    if exc.timed_out:
        return CXLMPITimeoutError(f"cxlmpi: {where} timed out in the pool (raise "
                                  f"CXLMPI_TIMEOUT if its peers are just slow)")
    return CXLMPIPoolError(f"cxlmpi: {where} failed in the pool (code {exc.code}, rank "
                           f"{exc.rank}); the communicator's next call says more")


# Calls still in flight when the program ends MPI (erroneous in MPI, done by
# real programs) are ended before MPI finalizes, where the program does it:
# its `MPI.Finalize()`, or at exit (mpi4py finalizes MPI after the
# interpreter's atexit handlers).  Inside MPI_Finalize the worker must not
# call MPI: there (the deletion of an attribute of MPI_COMM_SELF, the first
# thing MPI_Finalize does, which stays as the last resort for a finalize
# neither saw) MPICH aborted 1-4 % of such jobs at 3 ranks, a mutex of its
# own busy as it destroyed it.
_STOCK_FINALIZE = MPI.Finalize


def _end_in_flight(stacklevel: int) -> None:
    """Let every pool's worker end the calls posted to it, so that none
    runs -- progressing MPI, completing its request -- once MPI is
    finalizing ("Attempting to use an MPI routine after finalizing MPICH"
    from the worker, before).  MPI requires a program to complete its
    requests before MPI_Finalize: one that did not is told so, once per
    process.  Nothing where MPI is not running."""
    if not MPI.Is_initialized() or MPI.Is_finalized():
        return
    pending = _shim.finish_posted()
    if pending:
        import warnings

        warnings.warn(f"cxlmpi: {pending} nonblocking or persistent collective call"
                      f"{'s' if pending > 1 else ''} still in flight at MPI_Finalize "
                      f"(MPI requires each request completed first: Wait, Test or "
                      f"Waitall); cxlmpi ended {'them' if pending > 1 else 'it'} before "
                      f"MPI finalized", RuntimeWarning, stacklevel=stacklevel + 1)


def _finalize() -> None:
    """`MPI.Finalize` once the pool has taken a posted call: the calls in
    flight end first."""
    _end_in_flight(2)
    _STOCK_FINALIZE()


def _at_finalize(comm: MPI.Comm, keyval: int, attr: Any) -> None:
    """MPI_Finalize has begun (MPI is still usable), which neither
    `_finalize` nor the atexit handler saw."""
    _end_in_flight(1)


def _arm_finalize() -> None:
    """(the first posted call) End the calls in flight before MPI finalizes."""
    keyval = MPI.Comm.Create_keyval(delete_fn=_at_finalize)
    MPI.Comm.Set_attr(MPI.COMM_SELF, keyval, True)
    if MPI.Finalize is _STOCK_FINALIZE:
        MPI.Finalize = _finalize
        import atexit

        atexit.register(_end_in_flight, 1)


class _WaitsForTheWorker:
    """Wait/wait/Test of a request whose call the pool's worker runs
    (compiled: pyx/shim/requests.pxi): sleep until it has run (instead of
    spinning in MPI's progress loop), raise cxlmpi's error if it failed,
    then let MPI complete the request (`_mpi`: the MPI request class whose
    methods do that)."""

    __slots__ = ()
    _mpi: Any = MPI.Request
    Wait = _shim.request_Wait
    wait = _shim.request_wait
    Test = _shim.request_Test


class PoolRequest(_WaitsForTheWorker, MPI.Grequest):
    """The request of a nonblocking collective that runs in the pool."""

    __slots__ = ("_record",)
    _mpi = MPI.Grequest

    def Free(self) -> None:  # noqa: N802
        # MPI: freeing a collective's request is erroneous; here the call
        # ends first (its worker writes into the buffers until then).
        _shim.request_ran(self)
        if self != MPI.REQUEST_NULL:
            MPI.Grequest.Free(self)


class PersistentRequest(_WaitsForTheWorker, MPI.Prequest):
    """A persistent collective that runs in the pool (planned at *_init)."""

    __slots__ = ("_comm", "_plan", "_record", "_freed")
    _mpi = MPI.Prequest

    Start = _shim.persistent_Start

    @staticmethod
    def Startall(requests: list[MPI.Prequest]) -> None:  # noqa: N802
        """Start every request of the list in its order: these in the pool,
        each run of stock persistent requests between them through MPI."""
        stock: list[MPI.Prequest] = []
        for r in [*requests, None]:
            if r is not None and not isinstance(r, PersistentRequest):
                stock.append(r)
                continue
            if stock:
                _STOCK_STARTALL(stock)
                stock = []
            if r is not None:
                r.Start()

    def Free(self) -> None:  # noqa: N802
        """Free the request (once inactive, as MPI requires)."""
        if self._record is not None and not self._record.op.done \
                and self != MPI.REQUEST_NULL:
            raise MPI.Exception(MPI.ERR_REQUEST)   # (still active)
        _shim.request_ran(self)
        if self != MPI.REQUEST_NULL:   # (completed, not yet waited for)
            MPI.Prequest.Wait(self)
        self._freed = True
        self._plan = None


# MPI_Startall cannot start a request MPI did not make, and a program
# written for mpi4py starts lists with ``MPI.Prequest.Startall``: once the
# pool has made a persistent request, that classmethod hands lists holding
# one to `PersistentRequest.Startall`, and the others to MPI as before.
# Likewise ``MPI.Request.Waitall`` (and ``waitall``), once the pool has
# taken a posted call: the calls of the list's pool requests end first, in
# cxlmpi's way (the thread sleeps, or runs a call the worker has not
# started) -- MPI's own wait may spin without yielding the core (Open
# MPI's does) to the worker that must end them -- then MPI completes the
# list, failures included, as before; the Test list functions offer the
# core to the worker first where a call of the list has not ended, and
# Waitany/Waitsome test and offer it in turn while one runs.
# mpi4py's types are immutable; a classmethod is swapped in the type's own
# dict (CPython's, reached through the mappingproxy), which keeps every
# other property of the type, its identity included.
_STOCK_STARTALL = MPI.Prequest.Startall


def _startall(cls: type, requests: list[MPI.Prequest]) -> None:
    if any(isinstance(r, PersistentRequest) for r in requests):
        PersistentRequest.Startall(requests)
    else:
        _STOCK_STARTALL(requests)


def _route(cls: type, name: str, method: Any) -> None:
    """Make `method` the classmethod `name` of mpi4py's type `cls`."""
    namespace = cls.__dict__
    if namespace[name].__func__ is method:
        return
    import gc

    (members,) = [d for d in gc.get_referents(namespace) if isinstance(d, dict)]
    members[name] = classmethod(method)
    ctypes.pythonapi.PyType_Modified(ctypes.py_object(cls))


def _arm() -> None:
    """(the first posted call) End the calls in flight before MPI finalizes;
    end a list's pool calls before MPI waits for it."""
    _arm_finalize()
    for name in ("Waitall", "waitall", "Waitany", "waitany", "Waitsome", "waitsome",
                 "Testall", "testall", "Testany", "testany", "Testsome", "testsome"):
        # (compiled: every list pays them)
        _route(MPI.Request, name, getattr(_shim, f"routed_{name}"))


def persistent(comm: MPI.Intracomm, plan: Any) -> PersistentRequest:
    """The request of a persistent collective that the pool takes."""
    _route(MPI.Prequest, "Startall", _startall)
    request = PersistentRequest()
    request._comm, request._plan, request._record, request._freed = comm, plan, None, False
    return request


_shim.bind_requests(PoolRequest, PersistentRequest, persistent, query, _arm)
