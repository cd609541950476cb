"""CXLComm: an mpi4py Intracomm whose large collectives run in the pool.

One method per intercepted collective.  Each asks the dispatcher whether the
call is the pool's; if so one compiled call runs the whole algorithm without
the GIL, otherwise the call goes to stock mpi4py unchanged.  Every decision
uses only what MPI requires to match on all ranks (see dispatch.py).
"""

from __future__ import annotations

from time import perf_counter
from typing import Any

import numpy as np
from mpi4py import MPI

from . import config, dispatch
from ._pool import Pool, PoolFailure
from .errors import CXLMPIError, CXLMPIPeerError, CXLMPITimeoutError
from .group import create_pool
from .stats import record

__all__ = ["CXLComm", "wrap"]

_ndarray = np.ndarray
_IN_PLACE = MPI.IN_PLACE
_Intracomm = MPI.Intracomm


class _State:
    """Pool state of one MPI communicator (shared by every Python object
    with the same handle), or `pool=None` when its ranks share no pool."""

    __slots__ = ("pool", "error")

    def __init__(self, pool: Pool | None) -> None:
        self.pool = pool
        self.error: CXLMPIError | None = None

    def close(self) -> None:
        if self.pool is not None:
            self.pool.close()
            self.pool = None


# handle -> state; an MPI attribute on the communicator removes the entry
# when MPI frees the communicator, whoever frees it.
_states: dict[int, _State] = {}


def _on_free(comm: MPI.Comm, keyval: int, state: _State) -> None:
    state.close()
    if _states.get(comm.handle) is state:
        del _states[comm.handle]


_KEYVAL = MPI.Comm.Create_keyval(delete_fn=_on_free)


def _state(comm: MPI.Intracomm) -> _State:
    """The communicator's pool state, set up collectively on first use."""
    state = _states.get(comm.handle)
    if state is None:
        state = _State(create_pool(comm))
        _states[comm.handle] = state
        comm.Set_attr(_KEYVAL, state)
    return state


def _fail(comm: MPI.Intracomm, state: _State, exc: PoolFailure) -> CXLMPIError:
    """Turn an algorithm failure into the exception the user sees; the pool
    of this communicator is unusable afterwards (ranks are out of step)."""
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


def _run(comm: MPI.Intracomm, state: _State, method: str, *args: Any) -> None:
    if state.error is not None:
        raise state.error
    try:
        getattr(state.pool, method)(*args)
    except PoolFailure as exc:
        raise _fail(comm, state, exc) from None


def _small(obj: Any, threshold: int) -> bool:
    # Fast exit for the commonest small message: a bare numpy array.
    return type(obj) is _ndarray and obj.nbytes < threshold


class CXLComm(MPI.Intracomm):
    """An Intracomm on the same MPI handle whose large collectives go
    through the shared pool; usable anywhere an Intracomm is."""

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

    def free(self) -> None:
        """Call `Free` unless null or predefined (COMM_WORLD, COMM_SELF)."""
        if self.handle in (MPI.COMM_WORLD.handle, MPI.COMM_SELF.handle):
            return
        super().free()

    def __reduce__(self) -> str | tuple[Any, ...]:
        if self.handle == MPI.COMM_WORLD.handle:
            return (_predefined, ("COMM_WORLD",))
        if self.handle == MPI.COMM_SELF.handle:
            return (_predefined, ("COMM_SELF",))
        return super().__reduce__()

    def __repr__(self) -> str:
        return f"<cxlmpi.CXLComm {self.Get_name() or hex(self.handle)}>"

    # --------------------------------------------------------- collectives

    def Barrier(self) -> None:
        """Barrier synchronization (in the pool once the pool exists)."""
        t0 = perf_counter()
        state = _states.get(self.handle)
        if state is None or state.pool is None or config.get().disable:
            super().Barrier()
            record("barrier", False, 0, perf_counter() - t0)
            return
        _run(self, state, "barrier")
        record("barrier", True, 0, perf_counter() - t0)

    def Bcast(self, buf: Any, root: int = 0) -> None:
        """Broadcast data from one process to all other processes."""
        t0 = perf_counter()
        cfg = config.get()
        msg = None
        if not (cfg.disable or _small(buf, cfg.threshold)) and \
                0 <= root < self.Get_size():
            msg = dispatch.parse(buf, root != self.Get_rank())
            if msg is not None and msg.nbytes < cfg.threshold:
                msg = None
        state = _state(self) if msg is not None else None
        if state is None or state.pool is None:
            super().Bcast(buf, root)
            record("bcast", False, 0, perf_counter() - t0)
            return
        _run(self, state, "bcast", msg.address, msg.nbytes, root)
        record("bcast", True, msg.nbytes, perf_counter() - t0)

    def Reduce(self, sendbuf: Any, recvbuf: Any, op: MPI.Op = MPI.SUM,
               root: int = 0) -> None:
        """Reduce to root."""
        t0 = perf_counter()
        plan = None
        if 0 <= root < self.Get_size():
            plan = self._plan_reduce(sendbuf, recvbuf, op,
                                     root == self.Get_rank())
        state = _state(self) if plan is not None else None
        if state is None or state.pool is None:
            super().Reduce(sendbuf, recvbuf, op, root)
            record("reduce", False, 0, perf_counter() - t0)
            return
        send, recv, opc = plan
        _run(self, state, "reduce", send.address,
             recv.address if recv is not None else 0, send.count,
             send.itemsize, opc, send.tcode, root)
        record("reduce", True, send.nbytes, perf_counter() - t0)

    def Allreduce(self, sendbuf: Any, recvbuf: Any,
                  op: MPI.Op = MPI.SUM) -> None:
        """Reduce to all."""
        t0 = perf_counter()
        plan = self._plan_reduce(sendbuf, recvbuf, op, True)
        state = _state(self) if plan is not None else None
        if state is None or state.pool is None:
            super().Allreduce(sendbuf, recvbuf, op)
            record("allreduce", False, 0, perf_counter() - t0)
            return
        send, recv, opc = plan
        _run(self, state, "reduce", send.address, recv.address, send.count,
             send.itemsize, opc, send.tcode, -1)
        record("allreduce", True, send.nbytes, perf_counter() - t0)

    def _plan_reduce(self, sendbuf: Any, recvbuf: Any, op: MPI.Op,
                     receiving: bool) -> tuple | None:
        """(send, recv, op code) when the pool can take this reduction; the
        send message stands for the recv buffer when sendbuf is IN_PLACE."""
        cfg = config.get()
        if cfg.disable:
            return None
        opc = dispatch.op_code(op)
        if opc is None:
            return None
        recv = None
        if receiving:
            if _small(recvbuf, cfg.threshold):
                return None
            recv = dispatch.parse(recvbuf, True)
            if recv is None:
                return None
            if sendbuf is _IN_PLACE:
                send = recv
            else:
                send = dispatch.parse(sendbuf, False)
                if (send is None or send.count != recv.count
                        or send.datatype.handle != recv.datatype.handle
                        or dispatch.overlap(send, recv)):
                    return None
        else:
            if _small(sendbuf, cfg.threshold):
                return None
            send = dispatch.parse(sendbuf, False)
            if send is None:
                return None
        if send.nbytes < cfg.threshold or not dispatch.reduction_ok(opc, send.tcode):
            return None
        return send, recv, opc


def _predefined(name: str) -> CXLComm:
    """Unpickle a wrapped COMM_WORLD / COMM_SELF (the patched object if any)."""
    from . import patch as _patch

    return _patch.predefined(name)


def wrap(comm: MPI.Comm) -> MPI.Comm:
    """Return `comm` wrapped: a CXLComm on the same MPI handle.

    Intracommunicators come back as CXLComm (a CXLComm is returned as is);
    intercommunicators and topology communicators come back unchanged, since
    their collectives always pass through."""
    if isinstance(comm, CXLComm):
        return comm
    if type(comm) is _Intracomm or (isinstance(comm, MPI.Comm) and
                                    type(comm) is MPI.Comm and not comm.Is_inter()
                                    and comm != MPI.COMM_NULL):
        return CXLComm(comm)
    return comm
