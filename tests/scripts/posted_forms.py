"""Posted collectives whose message one rank gives in a form of its own.

    mpiexec -n N python tests/scripts/posted_forms.py SCENARIO

Every rank decides a posted call's path alone (it must return without
waiting for its peers), so one rank whose message the pool cannot take as
given must never send the call to MPI by itself: its peers' workers would
wait in the pool for ever.  Each call runs on a fresh communicator (its
first call sets the pool up) and again on one whose pool exists.
Rank 0 prints one line ``RESULT {json}``.  Scenarios:

  empty    a rank that sends or receives nothing as mpi4py lets it say so,
           ``[None, MPI.INT]``, ``[None, None, MPI.INT]``, ``[MPI.BOTTOM,
           None, MPI.INT]``, ``[None, counts, displs, MPI.INT]`` with zero
           counts: Iallgatherv, Igatherv, Iscatterv, Ialltoallv, Ibcast give
           stock's values, through the pool
  none     None where mpi4py reads it as MPI.IN_PLACE (Allgather, Allreduce,
           Alltoall, Scan, Reduce_scatter_block; the root of Reduce, Gather,
           Scatter), posted and blocking: stock's values, through the pool
  refused  a root whose send buffer lies inside its receive vector's span
           (MPICH takes it), a root naming a negative count (stock raises
           on the root): every rank raises CXLMPIMessageError, none hangs,
           and the next call on another communicator runs
"""

from __future__ import annotations

import json
import sys

import numpy as np
from mpi4py import MPI
from posting import ready

import cxlmpi
from cxlmpi import _shim

SCENARIO = sys.argv[1]
world = MPI.COMM_WORLD
rank, size = world.Get_rank(), world.Get_size()
plain = world.Dup()
problems: list[str] = []
N = 3000   # elements of a non-empty block (several of the test pool's chunks)
# what a rank that has no elements may pass, as mpi4py reads it
NOTHING = ([None, MPI.INT], [None, None, MPI.INT], [MPI.BOTTOM, None, MPI.INT])


def check(what: str, got, want) -> None:
    if not np.array_equal(got, want):
        problems.append(f"{what}: rank {rank} differs from stock")


def both(call) -> None:
    """`call(comm, label)` on a wrapped communicator whose pool was just
    set up (its first posted calls) and then once more on it."""
    comm = ready(cxlmpi.wrap(world.Dup()))
    call(comm, "first call")
    call(comm, "pool set up")
    comm.Free()


def gatherv(comm, label: str) -> None:
    # ranks > 0 send nothing, as [None, MPI.INT]; the root sends N
    counts = [N] + [0] * (size - 1)
    for k, nothing in enumerate(NOTHING):
        send = np.arange(N, dtype="i") + k if rank == 0 else nothing
        out = {}
        for name, c in (("cxlmpi", comm), ("stock", plain)):
            recv = np.full(N, -1, "i") if rank == 0 else None
            c.Igatherv(send, [recv, counts, [0] * size, MPI.INT] if rank == 0 else None,
                       0).Wait()
            out[name] = recv
        if rank == 0:
            check(f"Igatherv, senders of {nothing}, {label}", out["cxlmpi"], out["stock"])


def gatherv_root_none(comm, label: str) -> None:
    # the root gathers nothing at all: [None, zeros, zeros, MPI.INT]
    zeros = [0] * size
    for root_gets in ([None, zeros, zeros, MPI.INT], [None, None, None, MPI.INT]):
        for c in (comm, plain):
            c.Igatherv([None, 0, MPI.INT], root_gets if rank == 0 else None, 0).Wait()


def scatterv(comm, label: str) -> None:
    counts = [N] + [0] * (size - 1)
    out = {}
    for name, c in (("cxlmpi", comm), ("stock", plain)):
        recv = np.full(N, -1, "i") if rank == 0 else [None, MPI.INT]
        send = [np.arange(N, dtype="i") + 5, counts, [0] * size, MPI.INT] if rank == 0 else None
        c.Iscatterv(send, recv, 0).Wait()
        out[name] = recv
    if rank == 0:
        check(f"Iscatterv, [None, type] receivers, {label}", out["cxlmpi"], out["stock"])


def alltoallv(comm, label: str) -> None:
    # rank 0 sends nothing: [None, zeros, zeros, MPI.INT]; the others send
    # N to every rank
    zeros = [0] * size
    out = {}
    for name, c in (("cxlmpi", comm), ("stock", plain)):
        rc = [0] + [N] * (size - 1)
        recv = np.full(N * (size - 1), -1, "i")
        rmsg = [recv, rc, [0] + [N * (q - 1) for q in range(1, size)], MPI.INT]
        if rank == 0:
            smsg = [None, zeros, zeros, MPI.INT]
        else:
            smsg = [np.arange(N * size, dtype="i") + rank, [N] * size,
                    [N * q for q in range(size)], MPI.INT]
        c.Ialltoallv(smsg, rmsg).Wait()
        out[name] = recv
    check(f"Ialltoallv, a [None, ...] sender, {label}", out["cxlmpi"], out["stock"])


def allgatherv(comm, label: str) -> None:
    # rank 0 sends nothing as [None, MPI.INT]
    counts = [0] + [N] * (size - 1)
    for nothing in NOTHING:
        send = nothing if rank == 0 else np.full(N, rank, "i")
        out = {}
        for name, c in (("cxlmpi", comm), ("stock", plain)):
            recv = np.full(sum(counts), -1, "i")
            c.Iallgatherv(send, [recv, counts, MPI.INT]).Wait()
            out[name] = recv
        check(f"Iallgatherv, a sender of {nothing}, {label}", out["cxlmpi"], out["stock"])


def bcast(comm, label: str) -> None:
    # nothing to broadcast: the root's empty array, the others' [None, None, type]
    for c in (comm, plain):
        c.Ibcast(np.empty(0, "i") if rank == 0 else NOTHING[1], 0).Wait()


def empty() -> None:
    for call in (gatherv, gatherv_root_none, scatterv, alltoallv, allgatherv, bcast):
        both(call)


def refused() -> None:
    """Every rank raises, on a communicator whose pool was just set up and
    on one whose pool took a call.  (On a fresh one the call goes to MPI on
    every rank: stock's outcome, a root that raises alone on the negative
    count while its peers wait.)"""
    for what in ("gap", "negative"):
        for warm in (False, True):
            comm = ready(cxlmpi.wrap(world.Dup()))
            if warm:
                comm.Igatherv(np.ones(N, "i"), [np.empty(N * size, "i"), [N] * size,
                                                MPI.INT] if rank == 0 else None, 0).Wait()
            recv = np.full(3 * size, -1, "i")
            if rank == 0 and what == "gap":
                # blocks at 0, 3, 6, ...: the send buffer is recv[1:2], in no block
                send, rmsg = recv[1:2], [recv, [1] * size, [3 * q for q in range(size)], MPI.INT]
            elif rank == 0:
                send, rmsg = np.ones(1, "i"), [recv, [-1] + [1] * (size - 1),
                                               list(range(size)), MPI.INT]
            else:
                send, rmsg = np.ones(1, "i"), None
            try:
                comm.Igatherv(send, rmsg, 0).Wait()
                problems.append(f"{what}, warm={warm}: rank {rank} did not raise")
            except cxlmpi.CXLMPIMessageError:
                pass
            plain.Barrier()   # (every rank got here: none hangs)


def in_place_as_none() -> None:
    """mpi4py reads None as MPI.IN_PLACE where a collective takes it: each
    such call, posted and blocking, on a fresh communicator and again,
    against stock's in-place call on the same data."""
    n = N

    def calls(comm, label: str) -> None:
        def run(name, make, args):
            """`make()` (the buffers) for both; `args(buf)`: the call's
            arguments with None where stock gets IN_PLACE."""
            for form in (name, "I" + name[0].lower() + name[1:]):
                got, want = make(), make()
                result = getattr(comm, form)(*args(got, None))
                if form != name:
                    result.Wait()
                getattr(plain, name)(*args(want, MPI.IN_PLACE))
                check(f"{form}(None) {label}", got, want)

        base = lambda k: (np.arange(k) % 7 + rank + 1).astype("d")  # noqa: E731
        run("Allgather", lambda: np.where(np.arange(n * size) // n == rank,
                                          np.arange(n * size) % 5 + rank, 0.0),
            lambda b, ip: (ip, b))
        run("Allreduce", lambda: base(n), lambda b, ip: (ip, b))
        run("Alltoall", lambda: base(n * size), lambda b, ip: (ip, b))
        run("Scan", lambda: base(n), lambda b, ip: (ip, b))
        run("Reduce_scatter_block", lambda: base(n * size), lambda b, ip: (ip, b))
        run("Reduce", lambda: base(n), lambda b, ip: (ip if rank == 0 else b, b if rank == 0
                                                       else None, MPI.SUM, 0))
        run("Gather", lambda: np.where(np.arange(n * size) // n == rank, 1.0 + rank, 0.0),
            lambda b, ip: (ip if rank == 0 else b[rank * n:(rank + 1) * n],
                           b if rank == 0 else None, 0))
        run("Scatter", lambda: base(n * size) if rank == 0 else base(n),
            lambda b, ip: (b if rank == 0 else None, ip if rank == 0 else b, 0))

    both(calls)


{"empty": empty, "refused": refused, "none": in_place_as_none}[SCENARIO]()
rows = _shim.nonblocking_rows()
problems = [p for ps in plain.allgather(problems) for p in ps]
if rank == 0:
    print("RESULT " + json.dumps({"ok": not problems, "problems": problems[:10],
                                  "by": {k: r[0] for k, r in rows.items() if r[0]},
                                  "passed": {k: r[1] for k, r in rows.items() if r[1]},
                                  "blocking": {k: int(v["pool_calls"]) for k, v in
                                               cxlmpi.stats().items()
                                               if v.get("pool_calls") and k in rows}}),
          flush=True)
