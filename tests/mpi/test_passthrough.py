"""What the pool does not take passes through unchanged: nonblocking and
persistent collectives, Alltoallw, neighborhood collectives, derived
datatypes, intercommunicators -- results equal to stock on the same data,
also when mixed with pool collectives on the same communicator."""

from __future__ import annotations

import numpy as np
import pytest
from common import CFG, PLAIN, RANK, SIZE, agree, counts_for, make_data, same
from mpi4py import MPI

import cxlmpi


def test_nonblocking_mixed_with_pool_calls(comm):
    n = counts_for(np.float64)[-1]
    a = make_data(np.float64, n, 70)
    want = np.zeros(n)
    PLAIN.Allreduce(a, want)
    got_nb, got_pool, got_b = np.zeros(n), np.zeros(n), np.zeros(n)
    bsrc = make_data(np.float64, n, 71, rank=0)
    bbuf = bsrc.copy() if RANK == 0 else np.zeros(n)
    reqs = [comm.Iallreduce(a, got_nb), comm.Ibcast(bbuf, 0), comm.Ibarrier()]
    comm.Allreduce(a, got_pool)          # a pool collective while they are pending
    # complete them in another order than they were started
    reqs[2].Wait()
    MPI.Request.Waitall(reqs[:2][::-1])
    got_b[:] = bbuf
    agree(same(got_nb, want, MPI.SUM) and same(got_pool, want, MPI.SUM)
          and np.array_equal(got_b, bsrc), "nonblocking mixed with pool calls")
    # the other nonblocking collectives, against their blocking stock twins
    blk = max(1, n // SIZE)
    s = make_data(np.float64, blk * SIZE, 72)
    out, ref = np.zeros(blk * SIZE), np.zeros(blk * SIZE)
    comm.Ialltoall(s, out).Wait()
    PLAIN.Alltoall(s, ref)
    ok = np.array_equal(out, ref)
    out, ref = np.zeros(blk * SIZE), np.zeros(blk * SIZE)
    comm.Iallgather(s[:blk], out).Wait()
    PLAIN.Allgather(s[:blk], ref)
    ok &= np.array_equal(out, ref)
    out, ref = np.zeros(blk), np.zeros(blk)
    req = comm.Ireduce_scatter_block(s, out)
    while not req.Test():
        pass
    PLAIN.Reduce_scatter_block(s, ref)
    ok &= same(out, ref, MPI.SUM)
    agree(ok, "Ialltoall/Iallgather/Ireduce_scatter_block")


def test_persistent_collective(comm):
    n = counts_for(np.float64)[-1]
    a = make_data(np.float64, n, 73)
    got = np.zeros(n)
    req = comm.Allreduce_init(a, got)
    ok = True
    for step in range(3):
        a[:] = make_data(np.float64, n, 74 + step)
        want = np.zeros(n)
        PLAIN.Allreduce(a, want)
        req.Start()
        req.Wait()
        ok &= same(got, want, MPI.SUM)
    req.Free()
    agree(ok, "Allreduce_init")


def test_alltoallw_and_derived_types(comm):
    n = 5
    send = make_data(np.float64, n * SIZE, 75)
    want, got = np.zeros(n * SIZE), np.zeros(n * SIZE)
    counts = [n] * SIZE
    bdispls = [8 * n * q for q in range(SIZE)]
    types = [MPI.DOUBLE] * SIZE
    PLAIN.Alltoallw([send, counts, bdispls, types], [want, counts, bdispls, types])
    comm.Alltoallw([send, counts, bdispls, types], [got, counts, bdispls, types])
    ok = np.array_equal(got, want)
    # a strided (non-contiguous) derived datatype, used on every rank
    vec = MPI.DOUBLE.Create_vector(counts_for(np.float64)[-1] // 2, 1, 2).Commit()
    m = counts_for(np.float64)[-1] // 2 * 2
    data = make_data(np.float64, m, 76)
    want = data.copy() if RANK == 0 else np.zeros(m)
    got = data.copy() if RANK == 0 else np.zeros(m)
    PLAIN.Bcast([want, 1, vec], 0)
    comm.Bcast([got, 1, vec], 0)
    vec.Free()
    agree(ok and np.array_equal(got, want), "Alltoallw / strided Bcast")


def test_neighborhood_collectives(comm):
    cart = comm.Create_cart([SIZE], periods=[True])
    try:
        agree(not isinstance(cart, cxlmpi.CXLComm), "topology comms stay stock")
        send = make_data(np.float64, 64, 77)
        want, got = np.zeros(128), np.zeros(128)
        plain_cart = PLAIN.Create_cart([SIZE], periods=[True])
        plain_cart.Neighbor_allgather(send, want)
        plain_cart.Free()
        cart.Neighbor_allgather(send, got)
        agree(np.array_equal(got, want), "Neighbor_allgather")
    finally:
        cart.Free()


def test_intercommunicator_collectives(comm):
    if SIZE < 2:
        return
    local = comm.Split(RANK % 2, RANK)
    inter = local.Create_intercomm(0, comm, 1 - RANK % 2, tag=7)
    try:
        agree(not isinstance(inter, cxlmpi.CXLComm), "intercomm stays stock")
        n = counts_for(np.float64)[-1]
        a = make_data(np.float64, n, 78)
        got = np.zeros(n)
        inter.Allreduce(a, got)  # sum over the remote group
        remote = [q for q in range(SIZE) if q % 2 != RANK % 2]
        want = sum(make_data(np.float64, n, 78, rank=q) for q in remote)
        agree(np.allclose(got, want), "intercomm Allreduce")
    finally:
        inter.Free()
        local.Free()


def test_small_calls_go_straight_to_the_library(comm):
    """A small call that passes through goes straight to the MPI library
    (no second parse by mpi4py): every collective that has a straight path,
    bare arrays and list messages, results equal to stock's on the same
    data, every call that passed through counted as straight, and none
    took a step in the pool (across pool groups a Gatherv took a header
    step through the leaders' MPI, 5x a small Gatherv's time).  The calls
    left to mpi4py (IN_PLACE Allgather, a user-defined op) give stock's
    results and are not counted."""
    from cxlmpi import _shim
    from cxlmpi.pools.hierarchy import Hierarchy
    from cxlmpi.pools.state import pool_state

    n = 1   # element per block: below every pool window at 4 ranks
    data = make_data(np.float64, n * SIZE, 76)
    root = SIZE - 1
    counts = [n] * SIZE
    displs = [(SIZE - 1 - q) * n for q in range(SIZE)]   # blocks in reverse order

    def bcast(c, out):
        out[:n] = data[:n] if RANK == root else 0
        c.Bcast(out[:n], root)

    def in_place(c, out):
        out[:n] = data[:n]
        c.Allreduce(MPI.IN_PLACE, out[:n])

    calls = [
        ("barrier", lambda c, out: c.Barrier()),
        ("bcast", bcast),
        ("reduce", lambda c, out: c.Reduce(data[:n], out[:n], MPI.MAX, root)),
        ("allreduce", lambda c, out: c.Allreduce(data[:n], out[:n], MPI.SUM)),
        ("allreduce", in_place),
        ("scan", lambda c, out: c.Scan(data[:n], out[:n], MPI.SUM)),
        ("exscan", lambda c, out: c.Exscan(data[:n], out[:n], MPI.MIN)),
        ("allgather", lambda c, out: c.Allgather(data[:n], out)),
        ("gather", lambda c, out: c.Gather(data[:n], out, root)),
        ("scatter", lambda c, out: c.Scatter(data, out[:n], root)),
        ("alltoall", lambda c, out: c.Alltoall(data, out)),
        ("reduce_scatter_block", lambda c, out: c.Reduce_scatter_block(data, out[:n])),
        # list messages: parsed once, by the shim
        ("allreduce", lambda c, out: c.Allreduce([data[:n], MPI.DOUBLE], [out[:n], "d"])),
        ("gather", lambda c, out: c.Gather([data, n, MPI.DOUBLE], [out, n, MPI.DOUBLE], root)),
        ("alltoall", lambda c, out: c.Alltoall([data, MPI.DOUBLE], [out, MPI.DOUBLE])),
        # the v-collectives: their counts and displacements read once, by the shim
        ("allgatherv", lambda c, out: c.Allgatherv(data[:n], [out, counts, displs, MPI.DOUBLE])),
        ("allgatherv", lambda c, out: c.Allgatherv(data[:n], [out, (counts, None), "d"])),
        ("allgatherv", lambda c, out: c.Allgatherv(data[:n], out)),
        ("gatherv", lambda c, out: c.Gatherv(data[:n], [out, counts, displs, MPI.DOUBLE]
                                             if RANK == root else None, root)),
        ("scatterv", lambda c, out: c.Scatterv([data, np.array(counts), displs, MPI.DOUBLE]
                                               if RANK == root else None, out[:n], root)),
        ("alltoallv", lambda c, out: c.Alltoallv([data, counts], [out, (counts, n), MPI.DOUBLE])),
        ("reduce_scatter", lambda c, out: c.Reduce_scatter(data, out[:n], counts, MPI.SUM)),
        ("reduce_scatter", lambda c, out: c.Reduce_scatter(data, out[:n], (n,) * SIZE,
                                                            MPI.MAX)),
    ]
    on = _shim.straight_calls()[0]
    ok = on == (not CFG.disable)
    passed = 0
    pool = pool_state(comm)
    pool = pool.pool if isinstance(pool, Hierarchy) else pool   # its group's

    def steps() -> int:
        return 0 if pool is None or pool.closed else pool.step

    for name, call in calls:
        want, got = np.full(n * SIZE, -1.0), np.full(n * SIZE, -1.0)
        call(PLAIN, want)
        before, passes, step = _shim.straight_calls()[1], passthrough_calls(name), steps()
        call(comm, got)
        passes = passthrough_calls(name) - passes
        passed += passes
        straight = _shim.straight_calls()[1] - before
        ok = report(ok and np.array_equal(got, want), f"{name}: result differs from stock")
        ok = report(ok and straight == (passes if on else 0),
                    f"{name}: {straight} straight of {passes} passed through")
        # (a Barrier is the pool's at every size: under adaptive selection
        # its class's first call is a learning call, whose header step may
        # send it to MPI)
        ok = report(ok and (not passes or steps() == step or name == "barrier"),
                    f"{name}: {steps() - step} pool steps before it passed through")
    # (only a Barrier can be the pool's at these sizes; not if the pool is off)
    agree(ok and passed >= len(calls) - 1, f"straight path ({passed} calls passed through)")
    # left to mpi4py: the same results, not counted
    before = _shim.straight_calls()[1]
    want, got = np.zeros(n * SIZE), np.zeros(n * SIZE)
    want[RANK * n:(RANK + 1) * n] = got[RANK * n:(RANK + 1) * n] = data[:n]
    PLAIN.Allgather(MPI.IN_PLACE, want)
    comm.Allgather(MPI.IN_PLACE, got)
    ok = np.array_equal(got, want)
    op = MPI.Op.Create(lambda a, b, t: np.maximum(np.frombuffer(a), np.frombuffer(b),
                                                  out=np.frombuffer(b)), commute=True)
    try:
        PLAIN.Allreduce(data[:n], want[:n], op)
        comm.Allreduce(data[:n], got[:n], op)
    finally:
        op.Free()
    ok &= np.array_equal(got, want)
    agree(ok and _shim.straight_calls()[1] == before, "calls left to mpi4py")


def passthrough_calls(name: str) -> int:
    return int(cxlmpi.stats()[name]["passthrough_calls"])


def report(ok: bool, what: str) -> bool:
    """`ok`, said on this rank when false; all ranks agree on the verdict
    at the end."""
    if not ok:
        print(f"rank {RANK}: {what}", flush=True)
    return ok


@pytest.mark.parametrize("collective", ["Gatherv", "Alltoallv"])
def test_calls_passed_alone_then_the_pool(comm, collective):
    """v-collectives where rank 0's own block is large and every other
    rank's is one element: the others send each call to MPI on their own
    (no header step), rank 0 meets their pass marks in its header step and
    follows.  Gatherv's senders then run many calls ahead of the root (MPI
    sends small messages eagerly) and reach the pool's Barrier while the
    root's step of a call they passed long ago is still up: a late peer,
    not a mismatch (it once was: the job stopped with
    CXLMPIMismatchError).  Results equal stock's throughout."""
    big = 1 << 12   # doubles: 32 KiB, inside the pool's windows
    counts = [big] + [1] * (SIZE - 1)
    displs = [0] + [big + q for q in range(SIZE - 1)]
    total = big + SIZE - 1
    data = make_data(np.float64, total, 77)
    mine = data[displs[RANK]:displs[RANK] + counts[RANK]]
    want, got = np.zeros(total), np.zeros(total)

    def call(c, out):
        if collective == "Gatherv":
            c.Gatherv(mine, [out, counts, displs, MPI.DOUBLE] if RANK == 0 else None, 0)
        else:   # rank 0 keeps its large block, and swaps one element with each rank
            sc = [counts[RANK] if d == RANK else 1 for d in range(SIZE)]
            sd = [displs[RANK] if d == RANK else displs[d] for d in range(SIZE)]
            c.Alltoallv([data, sc, sd, MPI.DOUBLE], [out, sc, sd, MPI.DOUBLE])

    call(PLAIN, want)
    ok = True
    for _ in range(300):   # (no stock call between: nothing holds the senders back)
        got[:] = 0
        call(comm, got)
        ok &= bool(np.array_equal(got, want))
    comm.Barrier()          # the pool's, on every setting
    agree(ok, f"{collective}: results")
