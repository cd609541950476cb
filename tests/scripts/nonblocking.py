"""Nonblocking and persistent collectives through the pool, against stock.

    mpiexec -n N python tests/scripts/nonblocking.py SCENARIO

Every value is compared with what the plain communicator (stock MPI) gives
on the same data; rank 0 prints one line ``RESULT {json}`` with ``ok`` and
what was counted (calls the pool took: a run where none did proves
nothing, and says so).  Scenarios:

  each        every nonblocking collective, several sizes and roots
  forms       in-place forms; a derived datatype on one rank, arrays on the
              others
  inflight    many calls in flight on one communicator, mixed with
              point-to-point and stock requests in Waitall/Waitany/Testall,
              blocking calls in between
  persistent  every persistent collective started many times, data changing;
              MPI.Prequest.Startall over lists mixed with stock requests
  rooted      Igather, Iscatter, Iallgatherv, Ireduce_scatter and their
              persistent forms: every root, in place, uneven counts
  vectors     Igatherv, Iscatterv, Ialltoallv and their persistent forms:
              every root, in place (IN_PLACE and None), counts that differ
              by rank (zero, one element, several chunks)
  progress    a posted call completes while its rank computes without
              calling MPI (the worker progresses it)
  mismatch    rank 0 posts an Iallreduce, the others an Ibcast of the same
              bytes: every rank raises (a mismatch), none hangs
  timeout     only rank 0 posts: its Wait raises by CXLMPI_TIMEOUT
  variants    every pool variant pinned in the routes: the call runs with it
  free        the communicator is freed with calls in flight, then waited
"""

from __future__ import annotations

import json
import sys
import time

import numpy as np
from mpi4py import MPI
from posting import ready

import cxlmpi
from cxlmpi import _shim

SCENARIO = sys.argv[1]
world = MPI.COMM_WORLD
rank, size = world.Get_rank(), world.Get_size()
comm, plain = ready(cxlmpi.wrap(world.Dup())), world.Dup()
problems: list[str] = []


def check(what: str, got, want) -> None:
    if not np.array_equal(got, want):
        problems.append(f"{what}: rank {rank} differs from stock")


def data(n: int, k: int, dtype=np.float64) -> np.ndarray:
    return (np.arange(n) % 1013 + 7 * rank + k).astype(dtype)


def each() -> None:
    for n in (8192, 1 << 17, (1 << 17) + 3):
        a = data(n, 1)
        for op in (MPI.SUM, MPI.MAX):
            out, ref = np.zeros(n), np.zeros(n)
            comm.Iallreduce(a, out, op).Wait()
            plain.Allreduce(a, ref, op)
            check(f"Iallreduce {n} {op}", out, ref)
        inplace = a.copy()
        comm.Iallreduce(MPI.IN_PLACE, inplace).Wait()
        plain.Allreduce(a, ref := np.zeros(n))
        check(f"Iallreduce in place {n}", inplace, ref)
        for root in range(size):
            out, ref = np.zeros(n), np.zeros(n)
            comm.Ireduce(a, out, MPI.SUM, root).Wait()
            plain.Reduce(a, ref, MPI.SUM, root)
            if rank == root:
                check(f"Ireduce root {root}", out, ref)
            buf = data(n, root) if rank == root else np.zeros(n)
            ref = buf.copy()
            plain.Bcast(ref, root)
            comm.Ibcast(buf, root).Wait()
            check(f"Ibcast root {root}", buf, ref)
        for name, stock in (("Iscan", plain.Scan), ("Iexscan", plain.Exscan)):
            out, ref = np.zeros(n), np.zeros(n)
            getattr(comm, name)(a, out).Wait()
            stock(a, ref)
            if name == "Iscan" or rank > 0:
                check(f"{name} {n}", out, ref)
        block = n // size * 8
        s = data(block, 3, np.uint8)
        out, ref = np.zeros(block * size, np.uint8), np.zeros(block * size, np.uint8)
        comm.Iallgather(s, out).Wait()
        plain.Allgather(s, ref)
        check(f"Iallgather {block}", out, ref)
        s = data(block * size, 4, np.uint8)
        out, ref = np.zeros_like(s), np.zeros_like(s)
        comm.Ialltoall(s, out).Wait()
        plain.Alltoall(s, ref)
        check(f"Ialltoall {block}", out, ref)
        s = data(n // size * size, 5)
        out, ref = np.zeros(n // size), np.zeros(n // size)
        comm.Ireduce_scatter_block(s, out).Wait()
        plain.Reduce_scatter_block(s, ref)
        check(f"Ireduce_scatter_block {n}", out, ref)
        # the forms MPI keeps
        s = data(block, 6, np.uint8)
        out = np.zeros(block * size, np.uint8) if rank == 0 else None
        ref = np.zeros(block * size, np.uint8) if rank == 0 else None
        comm.Igather(s, out, 0).Wait()
        plain.Gather(s, ref, 0)
        if rank == 0:
            check("Igather", out, ref)
    comm.Ibarrier().Wait()


def forms() -> None:
    """In-place forms, and messages of different forms on different ranks
    (a derived datatype on one, an array on the others: the same type
    signature, as MPI requires): staged through the pool like a blocking
    call's, never sent to MPI by one rank alone."""
    n = 1 << 14
    a = data(n * size, 1)
    for name in ("Iallgather", "Ialltoall", "Ireduce_scatter_block", "Iscan", "Ireduce"):
        x = a.copy()
        if name == "Iallgather":
            x[rank * n:(rank + 1) * n] = data(n, 9)
            ref = np.zeros_like(x)
            plain.Allgather(data(n, 9), ref)
            comm.Iallgather(MPI.IN_PLACE, x).Wait()
        elif name == "Ialltoall":
            ref = np.zeros_like(x)
            plain.Alltoall(a, ref)
            comm.Ialltoall(MPI.IN_PLACE, x).Wait()
        elif name == "Ireduce_scatter_block":
            ref = np.zeros(n)
            plain.Reduce_scatter_block(a, ref)
            comm.Ireduce_scatter_block(MPI.IN_PLACE, x).Wait()
            x = x[:n]
        elif name == "Iscan":
            ref = np.zeros_like(x)
            plain.Scan(a, ref)
            comm.Iscan(MPI.IN_PLACE, x).Wait()
        else:
            ref = np.zeros_like(x)
            plain.Reduce(a, ref, MPI.SUM, 0)
            comm.Ireduce(MPI.IN_PLACE if rank == 0 else x, x if rank == 0 else None,
                         MPI.SUM, 0).Wait()
            if rank != 0:
                continue
        check(f"{name} in place", x, ref)
    contiguous = MPI.DOUBLE.Create_contiguous(n).Commit()
    for root in range(size):
        buf = data(n, root) if rank == root else np.zeros(n)
        ref = buf.copy()
        plain.Bcast(ref, root)
        # rank 1 names the message with a derived datatype, the others not
        msg = [buf, 1, contiguous] if rank == 1 else buf
        comm.Ibcast(msg, root).Wait()
        check(f"Ibcast root {root} mixed forms", buf, ref)
    contiguous.Free()
    x = data(n, 3)
    out, ref = np.zeros(n), np.zeros(n)
    msg = [x, 1, MPI.DOUBLE.Create_contiguous(n).Commit()] if rank == 0 else x
    comm.Iallgather(msg, big := np.zeros(n * size)).Wait()
    plain.Allgather(x, ref_big := np.zeros(n * size))
    check("Iallgather mixed forms", big, ref_big)
    del out, ref


def inflight() -> None:
    n = 1 << 16
    for rounds in range(20):
        a = [data(n, rounds + k) for k in range(6)]
        outs = [np.zeros(n) for _ in range(6)]
        refs = [np.zeros(n) for _ in range(6)]
        reqs = [comm.Iallreduce(a[0], outs[0]), comm.Ibcast(outs[1] if rank else a[1], 0)]
        if rank == 0:
            outs[1] = a[1]
        reqs.append(comm.Iallreduce(a[2], outs[2], MPI.MAX))
        blocking = np.zeros(n)
        comm.Allreduce(a[3], blocking)   # (a blocking call between posted ones)
        reqs.append(comm.Iallreduce(a[4], outs[4]))
        token = np.full(4, float(rank))
        got = np.zeros(4)
        reqs.append(plain.Isend(token, (rank + 1) % size, 11))
        reqs.append(plain.Irecv(got, (rank - 1) % size, 11))
        stock = plain.Iallreduce(a[5], outs[5])
        reqs.append(stock)
        if rounds % 4 == 0:
            MPI.Request.Waitall(reqs)
        elif rounds % 4 == 1:
            pending = list(reqs)
            while pending:
                i = MPI.Request.Waitany(pending)
                pending.pop(i)
        elif rounds % 4 == 2:
            while not MPI.Request.Testall(reqs):
                pass
        else:
            left = len(reqs)
            while left:
                done = MPI.Request.Waitsome(reqs)
                left -= len(done or [])
            for r in reqs:   # (inactive now: an empty status each)
                r.Get_status()
        plain.Allreduce(a[0], refs[0])
        plain.Bcast(refs[1] if rank else a[1].copy(), 0)
        refs[1] = data(n, rounds + 1) - 7 * rank
        plain.Allreduce(a[2], refs[2], MPI.MAX)
        plain.Allreduce(a[3], refs[3])
        plain.Allreduce(a[4], refs[4])
        plain.Allreduce(a[5], refs[5])
        for k in (0, 1, 2, 4, 5):
            check(f"round {rounds} call {k}", outs[k], refs[k])
        check(f"round {rounds} blocking", blocking, refs[3])
        check(f"round {rounds} p2p", got, np.full(4, float((rank - 1) % size)))


def persistent() -> None:
    n = (1 << 16) // size * size
    a = data(n, 0)
    out, ref, buf = np.zeros(n), np.zeros(n), np.zeros(n)
    block = n
    s8 = np.zeros(block, np.uint8)
    g8, gref = np.zeros(block * size, np.uint8), np.zeros(block * size, np.uint8)
    reqs = {
        "Allreduce": comm.Allreduce_init(a, out),
        "Bcast": comm.Bcast_init(buf, 0),
        "Allgather": comm.Allgather_init(s8, g8),
    }
    token, got = np.zeros(3), np.zeros(3)
    send = plain.Send_init(token, (rank + 1) % size, 12)
    recv = plain.Recv_init(got, (rank - 1) % size, 12)
    for k in range(int(sys.argv[2]) if len(sys.argv) > 2 else 10):
        a[:] = data(n, k)
        if rank == 0:
            buf[:] = data(n, 100 + k)
        s8[:] = data(block, k, np.uint8)
        token[:] = rank + k
        if k % 2:
            for r in reqs.values():
                r.Start()
            send.Start()
            recv.Start()
        else:   # (stock's name for it, or the class's own)
            starts = MPI.Prequest if k % 4 else type(reqs["Bcast"])
            starts.Startall([send, *reqs.values(), recv])
        MPI.Request.Waitall([*reqs.values(), send, recv])
        plain.Allreduce(a, ref)
        check(f"Allreduce_init start {k}", out, ref)
        check(f"Bcast_init start {k}", buf, data(n, 100 + k) - 7 * rank)
        plain.Allgather(s8, gref)
        check(f"Allgather_init start {k}", g8, gref)
        check(f"Send_init start {k}", got, np.full(3, float((rank - 1) % size + k)))
    for r in [*reqs.values(), send, recv]:
        r.Free()
    for name in ("Reduce", "Scan", "Exscan", "Alltoall", "Reduce_scatter_block", "Barrier"):
        for k in range(3):
            x = data(n, k)
            o, r = np.zeros(n), np.zeros(n)
            if name == "Reduce":
                req, stock = comm.Reduce_init(x, o, MPI.SUM, 0), (plain.Reduce, (x, r, MPI.SUM, 0))
            elif name == "Alltoall":
                req, stock = comm.Alltoall_init(x, o), (plain.Alltoall, (x, r))
            elif name == "Reduce_scatter_block":
                o, r = np.zeros(n // size), np.zeros(n // size)
                x = x[: n // size * size]
                req = comm.Reduce_scatter_block_init(x, o)
                stock = (plain.Reduce_scatter_block, (x, r))
            elif name == "Barrier":
                req, stock = comm.Barrier_init(), (plain.Barrier, ())
            else:
                req = getattr(comm, f"{name}_init")(x, o)
                stock = (getattr(plain, name), (x, r))
            req.Start()
            req.Wait()
            stock[0](*stock[1])
            if not (name == "Exscan" and rank == 0) and not (name == "Reduce" and rank != 0):
                check(f"{name}_init {k}", o, r)
            req.Free()


def start_and_wait(reqs: list, k: int) -> None:
    """Start `reqs` one by one (even `k`) or with Startall (odd); wait for all."""
    if k % 2:
        type(reqs[0]).Startall(reqs)
    else:
        for r in reqs:
            r.Start()
    MPI.Request.Waitall(reqs)


def rooted() -> None:
    """The forms whose sizes each rank reads from its own arguments (the
    root's blocks, the counts every rank passes): posted alike."""
    for n in (4096, (1 << 16) + 24):
        for root in range(size):
            s = data(n, root, np.uint8)
            ref = np.zeros(n * size, np.uint8) if rank == root else None
            plain.Gather(s, ref, root)
            # the root sends nothing of its own: in place, or None (mpi4py's
            # test_cco_nb_buf: MPI copies no elements into its own block)
            for inplace in (False, MPI.IN_PLACE, None):
                out = np.zeros(n * size, np.uint8) if rank == root else None
                if inplace is not False and rank == root:
                    out[root * n:(root + 1) * n] = s
                    comm.Igather(inplace, out, root).Wait()
                else:
                    comm.Igather(s, out, root).Wait()
                if rank == root:
                    check(f"Igather {n} root {root} in place {inplace}", out, ref)
            full = data(n * size, root + 1, np.uint8) if rank == root else None
            ref = np.zeros(n, np.uint8)
            plain.Scatter(full, ref, root)
            for inplace in (False, MPI.IN_PLACE, None):
                got = np.zeros(n, np.uint8)
                if inplace is not False and rank == root:
                    kept = full.copy()
                    comm.Iscatter(full, inplace, root).Wait()
                    check(f"Iscatter {n} root {root} in place {inplace}", full, kept)
                else:
                    comm.Iscatter(full, got, root).Wait()
                    check(f"Iscatter {n} root {root}", got, ref)
        counts = [n // 8 + 3 * q for q in range(size)]
        displs = [sum(counts[:q]) + 5 * q for q in range(size)]
        whole = displs[-1] + counts[-1]
        mine = data(counts[rank], 7)
        ref = np.zeros(whole)
        plain.Allgatherv(mine, [ref, (counts, displs), MPI.DOUBLE])
        for inplace in (False, True):
            out = np.zeros(whole)
            if inplace:
                out[displs[rank]:displs[rank] + counts[rank]] = mine
                comm.Iallgatherv(MPI.IN_PLACE, [out, (counts, displs), MPI.DOUBLE]).Wait()
            else:
                comm.Iallgatherv(mine, [out, (counts, displs), MPI.DOUBLE]).Wait()
            check(f"Iallgatherv {n} in place {inplace}", out, ref)
        total = sum(counts)
        x = data(total, 8)
        ref = np.zeros(counts[rank])
        plain.Reduce_scatter(x, ref, counts)
        out = np.zeros(counts[rank])
        comm.Ireduce_scatter(x, out, counts).Wait()
        check(f"Ireduce_scatter {n}", out, ref)
        y = x.copy()
        comm.Ireduce_scatter(MPI.IN_PLACE, y, counts).Wait()
        check(f"Ireduce_scatter {n} in place", y[:counts[rank]], ref)
    n = 1 << 14
    s, out = np.zeros(n), np.zeros(n * size)
    part, full = np.zeros(n), np.zeros(n * size)
    counts = [n // 2 + q for q in range(size)]
    v_in, v_out = np.zeros(counts[rank]), np.zeros(sum(counts))
    rs_in, rs_out = np.zeros(sum(counts)), np.zeros(counts[rank])
    reqs = [comm.Gather_init(s, out if rank == 0 else None, 0),
            comm.Scatter_init(full if rank == size - 1 else None, part, size - 1),
            comm.Allgatherv_init(v_in, [v_out, counts, MPI.DOUBLE]),
            comm.Reduce_scatter_init(rs_in, rs_out, counts)]
    for k in range(4):
        s[:], full[:] = data(n, k), data(n * size, k + 1)
        v_in[:], rs_in[:] = data(counts[rank], k + 2), data(sum(counts), k + 3)
        start_and_wait(reqs, k)
        refs = [np.zeros(n * size), np.zeros(n), np.zeros(sum(counts)), np.zeros(counts[rank])]
        plain.Gather(s, refs[0], 0)
        plain.Scatter(full, refs[1], size - 1)
        plain.Allgatherv(v_in, [refs[2], counts, MPI.DOUBLE])
        plain.Reduce_scatter(rs_in, refs[3], counts)
        if rank == 0:
            check(f"Gather_init start {k}", out, refs[0])
        check(f"Scatter_init start {k}", part, refs[1])
        check(f"Allgatherv_init start {k}", v_out, refs[2])
        check(f"Reduce_scatter_init start {k}", rs_out, refs[3])
    for r in reqs:
        r.Free()


def vectors() -> None:
    """The forms whose counts only some ranks hold: posted alike whatever
    their size (the worker learns the largest block)."""
    for big in (0, 1, 3000):
        counts = [big * q + (q % 2) for q in range(size)]   # (rank 0: none)
        displs = [sum(counts[:q]) + 3 * q for q in range(size)]
        whole = displs[-1] + counts[-1] + 2
        for root in range(size):
            mine = data(counts[rank], root)
            ref = np.full(whole, -1.0)
            plain.Gatherv(mine, [ref, (counts, displs), MPI.DOUBLE], root)
            for inplace in (False, MPI.IN_PLACE, None):
                out = np.full(whole, -1.0)
                vec = [out, (counts, displs), MPI.DOUBLE]
                if inplace is not False and rank == root:
                    out[displs[root]:displs[root] + counts[root]] = mine
                    comm.Igatherv(inplace, vec, root).Wait()
                else:
                    comm.Igatherv(mine, vec, root).Wait()
                if rank == root:
                    check(f"Igatherv {big} root {root} in place {inplace}", out, ref)
            full = data(whole, root + 1)
            ref = np.full(counts[rank], -1.0)
            plain.Scatterv([full, (counts, displs), MPI.DOUBLE], ref, root)
            for inplace in (False, MPI.IN_PLACE, None):
                got = np.full(counts[rank], -1.0)
                if inplace is not False and rank == root:
                    kept = full.copy()
                    comm.Iscatterv([full, (counts, displs), MPI.DOUBLE], inplace, root).Wait()
                    check(f"Iscatterv {big} root {root} in place {inplace}", full, kept)
                else:
                    comm.Iscatterv([full, (counts, displs), MPI.DOUBLE], got, root).Wait()
                    check(f"Iscatterv {big} root {root}", got, ref)
        # Ialltoallv: rank r sends big * (r + d) % 5 + d elements to rank d
        sc = [big * ((rank + d) % 5) + d for d in range(size)]
        rc = [big * ((q + rank) % 5) + rank for q in range(size)]
        sd = [sum(sc[:d]) + d for d in range(size)]
        rd = [sum(rc[:q]) + 2 * q for q in range(size)]
        x = data(sd[-1] + sc[-1], 9)
        ref, out = np.full(rd[-1] + rc[-1], -1.0), np.full(rd[-1] + rc[-1], -1.0)
        plain.Alltoallv([x, (sc, sd), MPI.DOUBLE], [ref, (rc, rd), MPI.DOUBLE])
        comm.Ialltoallv([x, (sc, sd), MPI.DOUBLE], [out, (rc, rd), MPI.DOUBLE]).Wait()
        check(f"Ialltoallv {big}", out, ref)
        # a derived datatype at the root (rank 0 of Ialltoallv), arrays elsewhere: staged
        # (before, its send vector, or receive vector of nothing, went to MPI alone)
        root, one = size - 1, MPI.DOUBLE.Create_contiguous(1).Commit()
        mine, full = data(counts[rank], 2), data(whole, 3)
        refs = [np.full(k, -1.0) for k in (whole, counts[rank], rd[-1] + rc[-1])]
        outs = [np.full(k, -1.0) for k in (whole, counts[rank], rd[-1] + rc[-1])]
        plain.Gatherv(mine, [refs[0], (counts, displs), MPI.DOUBLE], root)
        plain.Scatterv([full, (counts, displs), MPI.DOUBLE], refs[1], root)
        plain.Alltoallv([x, (sc, sd), MPI.DOUBLE], [refs[2], (rc, rd), MPI.DOUBLE])
        kind = one if rank == root else MPI.DOUBLE
        comm.Igatherv(mine, [outs[0], (counts, displs), kind], root).Wait()
        comm.Iscatterv([full, (counts, displs), kind], outs[1], root).Wait()
        kind = one if rank == 0 else MPI.DOUBLE
        comm.Ialltoallv([x, (sc, sd), kind], [outs[2], (rc, rd), kind]).Wait()
        one.Free()
        if rank == root:
            check(f"Igatherv {big} derived at the root", outs[0], refs[0])
        check(f"Iscatterv {big} derived at the root", outs[1], refs[1])
        check(f"Ialltoallv {big} derived on rank 0", outs[2], refs[2])
    counts = [1000 + 7 * q for q in range(size)]
    v_in, v_out = np.zeros(counts[rank]), np.zeros(sum(counts))
    s_in, s_out = np.zeros(sum(counts)), np.zeros(counts[rank])
    a_in, a_out = np.zeros(sum(counts)), np.zeros(size * counts[rank])
    a_send = [counts, MPI.DOUBLE]
    reqs = [comm.Gatherv_init(v_in, [v_out, counts, MPI.DOUBLE] if rank == 0 else None, 0),
            comm.Scatterv_init([s_in, counts, MPI.DOUBLE], s_out, size - 1),
            comm.Alltoallv_init([a_in, *a_send], [a_out, [counts[rank]] * size, MPI.DOUBLE])]
    for k in range(4):
        v_in[:], s_in[:], a_in[:] = data(counts[rank], k), data(sum(counts), k + 1), \
            data(sum(counts), k + 2)
        start_and_wait(reqs, k)
        refs = [np.zeros(sum(counts)), np.zeros(counts[rank]), np.zeros(size * counts[rank])]
        plain.Gatherv(v_in, [refs[0], counts, MPI.DOUBLE] if rank == 0 else None, 0)
        plain.Scatterv([s_in, counts, MPI.DOUBLE], refs[1], size - 1)
        plain.Alltoallv([a_in, *a_send], [refs[2], [counts[rank]] * size, MPI.DOUBLE])
        if rank == 0:
            check(f"Gatherv_init start {k}", v_out, refs[0])
        check(f"Scatterv_init start {k}", s_out, refs[1])
        check(f"Alltoallv_init start {k}", a_out, refs[2])
    for r in reqs:
        r.Free()


def progress() -> None:
    n = 1 << 20
    a = data(n, 1)
    out, ref = np.zeros(n), np.zeros(n)
    comm.Allreduce(a, out)   # (the pool and its worker are warm)
    done_before_wait = 0
    for k in range(5):
        req = comm.Iallreduce(a, out)
        record = getattr(req, "_record", None)
        t_end = time.perf_counter() + 60
        x = 0.0
        # compute, with no MPI call, until the call has ended (or a minute)
        while record is not None and not record.op.done and time.perf_counter() < t_end:
            x += float(np.sum(a[:1000]))
        if record is not None and record.op.done:
            done_before_wait += 1
        req.Wait()
        plain.Allreduce(a, ref)
        check(f"progress {k}", out, ref)
    if done_before_wait < 5:
        problems.append(f"rank {rank}: {done_before_wait} of 5 posted calls ended while "
                        f"it computed (the worker progresses them)")


def mismatch() -> None:
    n = 1 << 16
    a = np.ones(n)
    comm.Allreduce(a, np.zeros(n))
    how = sys.argv[2] if len(sys.argv) > 2 else "wait"
    waitall = how == "waitall"
    # counts: the root's count of the last rank's block is one more than
    # that rank sends (a posted Igatherv: no rank may learn it before)
    counts = [n // 8] * size
    counts[-1] += rank == 0
    try:
        if how == "counts":
            req = comm.Igatherv(a[:n // 8], [np.zeros(sum(counts)), counts, MPI.DOUBLE], 0)
        else:
            req = comm.Iallreduce(a, np.zeros(n)) if rank == 0 else comm.Ibcast(a, 0)
        if waitall:
            MPI.Request.Waitall([req])
        else:
            req.Wait()
    except cxlmpi.errors.CXLMPIMismatchError:
        return
    except MPI.Exception:
        if waitall:   # (MPI completed it: MPI's error, cxlmpi's message printed)
            return
        raise
    problems.append(f"rank {rank}: the mismatched calls did not raise")


def variants() -> None:
    """Every pool variant, pinned in the route table: the posted call runs
    with it (its signature says so) and gives stock's values."""
    from cxlmpi import _pool, config, select

    n = 1 << 15
    a = data(n, 1)
    comm.Allreduce(a, np.zeros(n))   # (the pool set up)
    state = _shim.states[comm.handle]
    for name in ("Iallreduce", "Ibcast", "Iallgather"):   # (Ialltoall: MPI's here)
        which = config.COLLECTIVES.index(name[1:].lower())
        for code in range(_pool.POOL_PATH, _pool.MAX_PATH + 1):
            total = n * 8 * (size if name in ("Iallgather", "Ialltoall") else 1)
            for pl in (0, 1):
                state.routes.set(which, select.size_class(total), pl, code, 1 << 62)
            if name == "Iallreduce":
                out, ref = np.zeros(n), np.zeros(n)
                req = comm.Iallreduce(a, out)
                plain.Allreduce(a, ref)
            elif name == "Ibcast":
                out = a.copy() if rank == 0 else np.zeros(n)
                req = comm.Ibcast(out, 0)
                ref = data(n, 1) - 7 * rank
            elif name == "Iallgather":
                out, ref = np.zeros(n * size), np.zeros(n * size)
                req = comm.Iallgather(a, out)
                plain.Allgather(a, ref)
            else:
                x = data(n * size, 2)
                out, ref = np.zeros(n * size), np.zeros(n * size)
                req = comm.Ialltoall(x, out)
                plain.Alltoall(x, ref)
            flags = req._record.op.flags
            req.Wait()
            check(f"{name} {select.code_name(code)}", out, ref)
            if flags != code - 1:
                problems.append(f"{name} pinned to {select.code_name(code)} ran variant "
                                f"{flags}")


def timeout() -> None:
    n = 1 << 16
    a = np.ones(n)
    comm.Allreduce(a, np.zeros(n))
    if rank != 0:
        return   # (never posts: rank 0's Wait must end, by CXLMPI_TIMEOUT)
    t0 = time.perf_counter()
    try:
        comm.Iallreduce(a, np.zeros(n)).Wait()
    except cxlmpi.errors.CXLMPITimeoutError as exc:
        if "timed out" not in str(exc):
            problems.append(f"rank 0: the timeout says {exc}")
        if time.perf_counter() - t0 > 60:
            problems.append("rank 0: the Wait ended only after a minute")
        return
    problems.append("rank 0: a posted call no peer posted did not time out")


def free() -> None:
    n = 1 << 16
    sub = cxlmpi.wrap(world.Dup())
    a = data(n, 2)
    sub.Allreduce(a, np.zeros(n))
    outs = [np.zeros(n) for _ in range(3)]
    reqs = [sub.Iallreduce(a * (k + 1), outs[k]) for k in range(3)]
    sub.Free()
    MPI.Request.Waitall(reqs)
    ref = np.zeros(n)
    plain.Allreduce(a, ref)
    for k in range(3):
        check(f"freed {k}", outs[k], ref * (k + 1))


{"each": each, "inflight": inflight, "persistent": persistent, "progress": progress,
 "rooted": rooted, "vectors": vectors,
 "mismatch": mismatch, "timeout": timeout, "variants": variants,
 "forms": forms, "free": free}[SCENARIO]()
rows = _shim.nonblocking_rows()
posted = sum(r[0] for r in rows.values())
passed = sum(r[1] for r in rows.values())
problems = [p for ps in plain.allgather(problems) for p in ps]
if rank == 0:
    print("RESULT " + json.dumps({"ok": not problems, "problems": problems[:10],
                                  "posted": posted, "passed": passed,
                                  "by": {k: r[0] for k, r in rows.items() if r[0]}}),
          flush=True)
