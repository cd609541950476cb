"""Pool-resident arrays (cxlmpi.empty & co.): every buffer placement - send
and receive private or in the pool, in place, different on different ranks
- gives stock MPI's result; Bcast_view; arrays outlive their communicator."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from common import CFG, PLAIN, RANK, SIZE, agree, make_data, pool_groups, same
from mpi4py import MPI

import cxlmpi
import cxlmpi.pools.state

# Where each rank's buffers live: "pool", "private", or a mix across ranks.
PLACES = ["private", "pool", "rank0-pool", "odd-pool"]


def in_pool(place: str, rank: int = RANK) -> bool:
    return {"private": False, "pool": True, "rank0-pool": rank == 0,
            "odd-pool": rank % 2 == 1}[place]


def buffer(comm, data: np.ndarray, place: str) -> np.ndarray:
    """`data` in private memory or in comm's pool, as `place` says."""
    if in_pool(place):
        return cxlmpi.asarray(data.copy(), comm=comm)  # plain numpy where no pool
    return data.copy()


def counts() -> list[int]:
    """Below and above the zero-copy threshold, odd, several blocks."""
    zc = CFG.zerocopy_threshold // 8
    return sorted({1, 7, max(1, zc - 1), zc + 3, 3 * zc + 5})


@pytest.mark.parametrize("send_place, recv_place",
                         list(itertools.product(PLACES, PLACES)))
def test_allreduce_and_reduce_anywhere(comm, send_place, recv_place):
    bad = []
    for n, op in itertools.product(counts(), [MPI.SUM, MPI.MAX]):
        data = make_data(np.float64, n, 71, op)
        want = np.empty(n)
        PLAIN.Allreduce(data, want, op)
        send = buffer(comm, data, send_place)
        recv = buffer(comm, np.full(n, -7.0), recv_place)
        comm.Allreduce(send, recv, op)
        if not same(recv, want, op) or not np.array_equal(send, data):
            bad.append(f"Allreduce {op} n={n}")
        inplace = buffer(comm, data, send_place)
        comm.Allreduce(MPI.IN_PLACE, inplace, op)
        if not same(inplace, want, op):
            bad.append(f"Allreduce in place {op} n={n}")
        for root in range(SIZE):
            recv = buffer(comm, np.full(n, -7.0), recv_place)
            comm.Reduce(send, recv, op, root)
            if RANK == root and not same(recv, want, op):
                bad.append(f"Reduce {op} n={n} root={root}: {recv[:3]} != {want[:3]}")
            if RANK != root and not np.all(recv == -7.0):
                bad.append(f"Reduce wrote off the root {op} n={n}")
            inplace = buffer(comm, data, send_place)
            if RANK == root:
                comm.Reduce(MPI.IN_PLACE, inplace, op, root)
                if not same(inplace, want, op):
                    bad.append(f"Reduce in place {op} n={n} root={root}")
            else:
                comm.Reduce(inplace, None, op, root)
    agree(not bad, "; ".join(bad))


@pytest.mark.parametrize("send_place, recv_place",
                         list(itertools.product(PLACES, PLACES)))
def test_bcast_and_gathers_anywhere(comm, send_place, recv_place):
    bad = []
    for n in counts():
        for root in range(SIZE):
            data = make_data(np.float64, n, 72, rank=root)
            buf = buffer(comm, data if RANK == root else np.zeros(n), send_place)
            comm.Bcast(buf, root)
            if not np.array_equal(buf, data):
                bad.append(f"Bcast n={n} root={root}")
        mine = make_data(np.int32, n, 73)
        want = np.empty((SIZE, n), np.int32)
        PLAIN.Allgather(mine, want)
        send = buffer(comm, mine, send_place)
        got = buffer(comm, np.zeros((SIZE, n), np.int32), recv_place)
        comm.Allgather(send, got)
        if not np.array_equal(got, want):
            bad.append(f"Allgather n={n}")
        for root in range(SIZE):
            got = buffer(comm, np.zeros((SIZE, n), np.int32), recv_place)
            comm.Gather(send, got if RANK == root else None, root)
            if RANK == root and not np.array_equal(got, want):
                bad.append(f"Gather n={n} root={root}")
    agree(not bad, "; ".join(bad))


@pytest.mark.parametrize("send_place, recv_place",
                         [("pool", "pool"), ("pool", "private"), ("odd-pool", "pool"),
                          ("private", "pool")])
def test_personalized_collectives_anywhere(comm, send_place, recv_place):
    """Alltoall(v), Scatter, Reduce_scatter(_block), Scan on every placement:
    blocks read in place when every one is in the pool."""
    bad = []
    for n in counts():
        data = make_data(np.int64, n * SIZE, 74)
        send = buffer(comm, data, send_place)
        vector = [n] * SIZE, [n * q for q in range(SIZE)]
        for name in ("Alltoall", "Alltoallv"):
            got = buffer(comm, np.zeros(n * SIZE, np.int64), recv_place)
            want = np.zeros(n * SIZE, np.int64)
            if name == "Alltoall":
                comm.Alltoall(send, got)
                PLAIN.Alltoall(data, want)
            else:
                comm.Alltoallv([send, *vector, MPI.INT64_T], [got, *vector, MPI.INT64_T])
                PLAIN.Alltoallv([data, *vector, MPI.INT64_T], [want, *vector, MPI.INT64_T])
            if not np.array_equal(got, want):
                bad.append(f"{name} n={n}")
        inplace = buffer(comm, data, recv_place)
        comm.Alltoall(MPI.IN_PLACE, inplace)
        want = np.zeros(n * SIZE, np.int64)
        PLAIN.Alltoall(data, want)
        if not np.array_equal(inplace, want):
            bad.append(f"Alltoall in place n={n}")
        for root in range(SIZE):
            got = buffer(comm, np.zeros(n, np.int64), recv_place)
            want = np.zeros(n, np.int64)
            comm.Scatter(send if RANK == root else None, got, root)
            PLAIN.Scatter(data if RANK == root else None, want, root)
            if not np.array_equal(got, want):
                bad.append(f"Scatter n={n} root={root}")
        got = buffer(comm, np.zeros(n, np.int64), recv_place)
        want = np.zeros(n, np.int64)
        comm.Reduce_scatter_block(send, got)
        PLAIN.Reduce_scatter_block(data, want)
        if not np.array_equal(got, want):
            bad.append(f"Reduce_scatter_block n={n}")
        got = buffer(comm, np.zeros(n, np.int64), recv_place)
        comm.Reduce_scatter(send, got, [n] * SIZE)
        if not np.array_equal(got, want):
            bad.append(f"Reduce_scatter n={n}")
        got = buffer(comm, np.zeros(n, np.int64), recv_place)
        comm.Scan(send[:n], got)
        PLAIN.Scan(data[:n], want)
        if not np.array_equal(got, want):
            bad.append(f"Scan n={n}")
        if not np.array_equal(send, data):
            bad.append(f"send buffer changed n={n}")
    agree(not bad, "; ".join(bad))


def test_arrays_are_numpy_arrays_in_the_pool(comm):
    a = cxlmpi.empty((3, 5), np.float32, comm=comm)
    b = cxlmpi.zeros_like(a, comm=comm)
    c = cxlmpi.empty_like(np.zeros((4, 2), order="F"), comm=comm)
    d = cxlmpi.asarray([1, 2, 3], comm=comm)
    ok = (a.shape, a.dtype, b.sum(), c.flags.f_contiguous, list(d)) == \
        ((3, 5), np.float32, 0.0, True, [1, 2, 3])
    ok = ok and cxlmpi.asarray(d, comm=comm) is d
    if cxlmpi.pools.state.arena_pool(comm) is not None:  # (not: a group of one rank)
        ok = ok and all(cxlmpi.is_resident(x, comm=comm) for x in (a, b, c, d))
        ok = ok and not cxlmpi.is_resident(np.zeros(3), comm=comm)
    agree(ok, "pool arrays")


def test_bcast_view(comm):
    n = counts()[-1]
    src = cxlmpi.empty(n, np.int64, comm=comm)
    if RANK == 0:
        src[:] = np.arange(n) * 3
    view = comm.Bcast_view(src if RANK == 0 else None, 0)
    ok = np.array_equal(view, np.arange(n) * 3) and not view.flags.writeable
    try:
        view[0] = 1
        ok = False
    except ValueError:
        pass
    matrix = cxlmpi.zeros((4, 6), np.float32, order="F", comm=comm)
    if RANK == SIZE - 1:
        matrix[:] = np.arange(24, dtype=np.float32).reshape(4, 6)
    mview = comm.Bcast_view(matrix, SIZE - 1)
    ok = ok and np.array_equal(mview, np.arange(24, dtype=np.float32).reshape(4, 6))
    comm.Barrier()  # every view is read before the roots change their arrays
    agree(ok, "Bcast_view")


def test_write_back_and_invalidate_outside_collectives(comm):
    """The contract for data written by hand: the owner of a pool array
    that peers hold views of changes it, writes it back
    (cxlmpi.write_back) and tells them (an MPI Barrier: no pool step); they
    invalidate (cxlmpi.invalidate) and read the change -- also where the
    memory keeps no coherence (sw, emulate)."""
    n = counts()[-1]
    src = cxlmpi.empty(n, np.int64, comm=comm)
    if RANK == 0:
        src[:] = 1
    view = comm.Bcast_view(src if RANK == 0 else None, 0)
    multi = pool_groups()[0] > 1 or \
        not isinstance(cxlmpi.pools.state.arena_pool(comm), cxlmpi._pool.Pool)
    ok = np.all(view == 1)
    comm.Barrier()
    if RANK == 0:
        src[:] = np.arange(n)
        cxlmpi.write_back(src, comm=comm)
    PLAIN.Barrier()
    cxlmpi.invalidate(view, comm=comm)
    if SIZE > 1 and not multi:   # (across pool groups a view is a copy)
        ok = ok and np.array_equal(view, np.arange(n))
    comm.Barrier()   # every view read before src goes
    agree(ok, "a view after write_back and invalidate")


def test_bcast_view_needs_a_pool_array(comm):
    err = None
    try:
        comm.Bcast_view(np.arange(5) if RANK == 0 else None, 0)
    except ValueError as exc:
        err = str(exc)
    multi = pool_groups()[0] > 1 or \
        not isinstance(cxlmpi.pools.state.arena_pool(comm), cxlmpi._pool.Pool)
    if SIZE > 1 and not multi:
        agree(err is not None and "not in this communicator's pool" in err, f"{err}")


def test_arrays_outlive_their_communicator():
    dup = cxlmpi.wrap(PLAIN.Dup())
    a = cxlmpi.zeros(1000, np.float64, comm=dup)
    dup.Allreduce(MPI.IN_PLACE, a)   # the pool is in use
    dup.Free()
    a += 1                            # still mapped
    agree(float(a.sum()) == 1000.0, "array after Free")


# Shapes whose size or byte size does not fit a Py_ssize_t (or wraps an
# int64 product around to 0, or to a negative), and a negative dimension.
ABSURD_SHAPES = [((1 << 61) - 8,), (1 << 61,), (1 << 31, 1 << 31, 4), (3, 1 << 62),
                 (1 << 62, 2), (1 << 63,), (-1,), (4, -2)]


@pytest.mark.parametrize("shape", ABSURD_SHAPES)
@pytest.mark.parametrize("dtype", [np.uint8, np.float64])
def test_absurd_shapes_refused_like_numpy(comm, shape, dtype):
    """cxlmpi.empty refuses what np.empty refuses, with numpy's exception
    and message (a MemoryError: the full arena's), before asking the arena
    for anything (a byte size that wrapped around must never reach the
    pool's allocator)."""
    from cxlmpi.resident.arrays import arena_pool

    pool = arena_pool(comm)
    free = pool.arena_free() if pool is not None else 0
    try:
        np.empty(shape, dtype)
        want = None
    except Exception as exc:  # noqa: BLE001 - compared with cxlmpi's
        want = exc
    try:
        cxlmpi.empty(shape, dtype, comm=comm)
        got = None
    except Exception as exc:  # noqa: BLE001 - compared with numpy's
        got = exc
    # np.empty's MemoryError (no memory for it) is a full arena's here
    if isinstance(want, MemoryError):  # numpy's is a subclass of its own
        ok = isinstance(got, MemoryError)
    else:
        ok = want is not None and type(got) is type(want) and str(got) == str(want)
    ok = ok and (pool is None or pool.arena_free() == free)
    agree(ok, f"{shape} {dtype.__name__}: cxlmpi {got!r}, numpy {want!r}")


def _derived(comm) -> list[tuple[str, MPI.Intracomm]]:
    """Communicators derived from `comm` every way MPI offers (some of one
    rank: no pool there, MPI alone)."""
    everyone = comm.Get_group()
    reverse = everyone.Incl(list(reversed(range(SIZE))))
    pair = everyone.Incl([r for r in range(SIZE) if r // 2 == RANK // 2])
    try:
        return [("Dup", comm.Dup()), ("Split", comm.Split(RANK // 2, RANK)),
                ("Split_type", comm.Split_type(MPI.COMM_TYPE_SHARED, RANK)),
                ("Create_group", comm.Create_group(reverse)),
                ("Create", comm.Create(pair))]
    finally:
        for g in (everyone, reverse, pair):
            g.Free()


def test_arrays_are_used_in_place_on_every_derived_communicator(comm):
    """One heap per node: arrays allocated for `comm` are read and written in
    place by the collectives of every communicator derived from it -- Dup,
    Split, Split_type, Create_group, Create -- and arrays allocated for a
    derived communicator by `comm`'s, each with stock MPI's result."""
    n = 2 * CFG.zerocopy_threshold // 8 + 5
    base = cxlmpi.pools.state.arena_pool(comm)
    flat = pool_groups()[0] == 1 and base is not None and \
        isinstance(cxlmpi.pools.state.pool_state(comm), cxlmpi._pool.Pool)
    bad = []
    for name, sub in _derived(comm):
        p = sub.Get_size()
        plain = MPI.Intracomm(sub)
        data = make_data(np.float64, n, 81, rank=RANK)
        mine = cxlmpi.asarray(data, comm=comm)        # allocated for comm
        theirs = cxlmpi.asarray(data.copy(), comm=sub)  # allocated for sub
        out = cxlmpi.zeros(n, comm=comm)
        many = cxlmpi.zeros(n * p, comm=comm)
        blocks = cxlmpi.asarray(np.tile(data, p), comm=sub)
        before = cxlmpi.stats()
        want = np.empty(n)
        plain.Allreduce(data, want)
        sub.Allreduce(mine, out)
        if not same(out, want, MPI.SUM):
            bad.append(f"{name}: Allreduce")
        sub.Bcast(theirs, root=p - 1)
        want = data.copy()
        plain.Bcast(want, root=p - 1)
        if not np.array_equal(theirs, want):
            bad.append(f"{name}: Bcast")
        sub.Allgather(mine, many)
        want = np.empty(n * p)
        plain.Allgather(data, want)
        if not np.array_equal(many, want):
            bad.append(f"{name}: Allgather")
        sub.Alltoall(blocks, many)
        plain.Alltoall(np.tile(data, p), want)
        if not np.array_equal(many, want):
            bad.append(f"{name}: Alltoall")
        comm.Allreduce(theirs, out)                   # sub's array on comm
        want = np.empty(n)
        PLAIN.Allreduce(theirs, want)
        if not same(out, want, MPI.SUM):
            bad.append(f"{name}: Allreduce on comm of sub's array")
        after = cxlmpi.stats()
        zc = {k: after[k].get("zerocopy_calls", 0) - before.get(k, {}).get("zerocopy_calls", 0)
              for k in ("allreduce", "bcast", "allgather", "alltoall")}
        # (comm's Allreduce of sub's arrays: in place when every rank's
        # sub had a pool to allocate them from)
        on_comm = bool(PLAIN.allreduce(int(cxlmpi.is_resident(theirs, comm=comm)), MPI.MIN))
        if flat and p > 1 and CFG.tuning == "pool":
            resident = all(cxlmpi.is_resident(x, comm=sub) for x in (mine, theirs, out))
            if not resident or zc != {"allreduce": 1 + on_comm, "bcast": 1, "allgather": 1,
                                      "alltoall": 1}:
                bad.append(f"{name}: in place {resident}, zero-copy calls {zc}")
        sub.Free()
    agree(not bad, "; ".join(bad))


def test_posted_calls_on_pool_arrays_run_in_place_and_are_counted(comm):
    """Iallreduce (in place and not) and Ibcast on pool arrays give stock's
    values and, where the pool takes them (CXLMPI_TUNING=pool, a flat pool
    of several ranks), run zero-copy -- and stats() counts them so, as it
    does the blocking forms (before, a posted call's zero-copy run counted
    nothing: its row read 0 whatever ran).  Each call counts once, however
    its request completes: polled by Get_status first (before, each poll
    of a completed request counted it again)."""
    n = max(CFG.nonblocking_threshold, CFG.zerocopy_threshold) // 8 + 5
    data = make_data(np.float64, n, 83, rank=RANK)
    mine = cxlmpi.asarray(data, comm=comm)
    out = cxlmpi.zeros(n, comm=comm)
    want = np.empty(n)
    PLAIN.Allreduce(data, want)
    before = cxlmpi.stats()
    bad = []
    comm.Iallreduce(mine, out).Wait()
    if not same(out, want, MPI.SUM):
        bad.append("Iallreduce")
    comm.Iallreduce(MPI.IN_PLACE, mine).Wait()
    if not same(mine, want, MPI.SUM):
        bad.append("Iallreduce in place")
    out[:] = 0   # (`data` again: asarray may have handed it over as `mine`, reduced in place)
    polled = comm.Iallreduce(cxlmpi.asarray(make_data(np.float64, n, 83, rank=RANK), comm=comm),
                             out)
    while not polled.Get_status():
        pass
    polled.Get_status()
    polled.Wait()
    if not same(out, want, MPI.SUM):
        bad.append("Iallreduce polled")
    root = SIZE - 1
    mine[:] = data
    comm.Ibcast(mine, root=root).Wait()
    sent = data.copy()
    PLAIN.Bcast(sent, root=root)
    if not np.array_equal(mine, sent):
        bad.append("Ibcast")
    after = cxlmpi.stats()
    posted = {k: after[k]["pool_calls"] - before[k]["pool_calls"]
              for k in ("iallreduce", "ibcast")}
    zc = {k: after[k]["zerocopy_calls"] - before[k]["zerocopy_calls"]
          for k in ("iallreduce", "ibcast")}
    flat = pool_groups()[0] == 1 and cxlmpi.pools.state.arena_pool(comm) is not None
    if flat and SIZE > 1 and CFG.tuning == "pool" and \
            (posted != {"iallreduce": 3, "ibcast": 1} or zc != posted):
        bad.append(f"posted {posted}, zero-copy {zc}")
    agree(not bad, "; ".join(bad))
