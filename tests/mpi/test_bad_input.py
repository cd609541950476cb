"""Bad input: the exception stock mpi4py raises (or a clear ValueError),
before any memory is touched.  Every case here raises on every rank, so no
rank is left in a collective (test_refused_on_one_rank.py: a message only
one rank's own arguments make bad)."""

from __future__ import annotations

import functools

import numpy as np
import pytest
from common import (
    CFG,
    PLAIN,
    RANK,
    SIZE,
    agree,
    counts_for,
    fresh_against_stock,
    make_data,
)
from mpi4py import MPI

import cxlmpi
import cxlmpi.pools.state


def _raises(fn) -> type | None:
    try:
        fn()
    except Exception as exc:  # noqa: BLE001 - the type is what we compare
        return type(exc)
    return None


def _same_error(wrapped_call, plain_call, what: str) -> None:
    got = _raises(wrapped_call)
    want = _raises(plain_call)
    agree(got is not None and got == want, f"{what}: cxlmpi {got}, stock {want}")


@pytest.fixture(params=[4, 4096], ids=["small", "large"])
def n(request) -> int:
    """Elements per message: small ones pass through (straight to the MPI
    library), large ones are the pool's where the settings allow."""
    return request.param


def test_recv_too_small(comm, n):
    send = make_data(np.float64, n, 30)
    _same_error(lambda: comm.Allreduce(send, np.zeros(n - 1)),
                lambda: PLAIN.Allreduce(send, np.zeros(n - 1)), "recv too small")


def test_count_mismatch(comm, n):
    send = make_data(np.float64, n, 31)
    _same_error(lambda: comm.Allreduce([send, n - 3, MPI.DOUBLE], np.zeros(n)),
                lambda: PLAIN.Allreduce([send, n - 3, MPI.DOUBLE], np.zeros(n)),
                "count mismatch")


def test_type_mismatch(comm, n):
    send = make_data(np.float64, n, 32)
    _same_error(lambda: comm.Allreduce(send, np.zeros(n, np.int64)),
                lambda: PLAIN.Allreduce(send, np.zeros(n, np.int64)), "type mismatch")


def test_readonly_recv(comm, n):
    send = make_data(np.float64, n, 33)
    recv = np.zeros(n)
    recv.setflags(write=False)
    _same_error(lambda: comm.Allreduce(send, recv),
                lambda: PLAIN.Allreduce(send, recv), "read-only recv")


@pytest.mark.parametrize("root", [-1, SIZE, SIZE + 5])
def test_root_out_of_range(comm, n, root):
    buf = np.zeros(n)
    _same_error(lambda: comm.Bcast(buf, root), lambda: PLAIN.Bcast(buf, root), "Bcast root")
    _same_error(lambda: comm.Reduce(buf, np.zeros(n), MPI.SUM, root),
                lambda: PLAIN.Reduce(buf, np.zeros(n), MPI.SUM, root), "Reduce root")


def test_op_not_defined_for_type(comm, n):
    send = make_data(np.complex128, n, 34)
    _same_error(lambda: comm.Allreduce(send, np.zeros_like(send), MPI.MAX),
                lambda: PLAIN.Allreduce(send, np.zeros_like(send), MPI.MAX),
                "MAX on complex")
    flags = np.ones(n, np.bool_)
    _same_error(lambda: comm.Allreduce(flags, np.zeros_like(flags), MPI.SUM),
                lambda: PLAIN.Allreduce(flags, np.zeros_like(flags), MPI.SUM),
                "SUM on bool")


def test_unsupported_type_passes_through(comm, n):
    """long double and MINLOC pairs are not the pool's: stock results."""
    send = make_data(np.float64, n, 35).astype(np.longdouble)
    want = np.zeros_like(send)
    got = np.zeros_like(send)
    PLAIN.Allreduce(send, want)
    comm.Allreduce(send, got)
    agree(np.allclose(got, want), "long double")
    pairs = np.zeros(n, dtype=[("v", "f8"), ("i", "i4")])
    pairs["v"] = make_data(np.float64, n, 36)
    pairs["i"] = RANK
    want = np.zeros_like(pairs)
    got = np.zeros_like(pairs)
    PLAIN.Allreduce([pairs, MPI.DOUBLE_INT], [want, MPI.DOUBLE_INT], MPI.MAXLOC)
    comm.Allreduce([pairs, MPI.DOUBLE_INT], [got, MPI.DOUBLE_INT], MPI.MAXLOC)
    agree(np.array_equal(got, want), "MAXLOC")


def test_user_op_passes_through(comm, n):
    op = MPI.Op.Create(lambda a, b, t: np.add(np.frombuffer(a), np.frombuffer(b),
                                              out=np.frombuffer(b)), commute=True)
    try:
        send = make_data(np.float64, n, 37)
        want, got = np.zeros(n), np.zeros(n)
        PLAIN.Allreduce(send, want, op)
        comm.Allreduce(send, got, op)
        agree(np.allclose(got, want), "user op")
    finally:
        op.Free()


def test_count_beyond_buffer_is_refused():
    """Every rank names 16 doubles more than its buffers hold (the memory
    past them is the test's own).  Stock reads and writes past them; where
    the call takes the pool, cxlmpi refuses it on every rank before
    touching a byte; where it goes to MPI, it runs on scratch copies that
    reach that far: stock's values inside the buffer, nothing past it."""
    count = counts_for(np.float64)[-1]
    send = make_data(np.float64, count + 16, 38)
    got, want = np.zeros(count + 16), np.zeros(count + 16)
    comm = cxlmpi.wrap(PLAIN.Dup())   # (refused in the pool, its pool closes)
    try:
        comm.Allreduce([send[:count], count + 16, MPI.DOUBLE],
                       [got[:count], count + 16, MPI.DOUBLE])
        raised = None
    except ValueError as exc:
        raised = exc
    comm.Free()
    PLAIN.Allreduce([send[:count], count + 16, MPI.DOUBLE],
                    [want[:count], count + 16, MPI.DOUBLE])
    outcomes = PLAIN.allgather(raised is not None)
    if raised is not None:
        agree(all(outcomes) and "buffer holds" in str(raised), f"refused: {outcomes}")
    else:
        agree(not any(outcomes) and np.array_equal(got[:count], want[:count]),
              "as stock inside the buffer, through MPI")
    agree(not np.any(got[count:]), "nothing written past the buffer")


def _guarded(n: int, dtype=np.float64):
    """A buffer of n elements inside a larger one, and a check that nothing
    outside it changed."""
    whole = np.full(n + 32, 7, dtype)
    inner = whole[16:16 + n]
    before = whole.copy()

    def untouched() -> bool:
        return bool(np.array_equal(whole[:16], before[:16])
                    and np.array_equal(whole[16 + n:], before[16 + n:]))
    return inner, untouched


def test_freed_communicator(comm, n):
    """Also once used, and its handle perhaps given to a new communicator
    (MPICH reuses them): the call is refused, not run on the new one."""
    dup = comm.Dup()
    plain_dup = MPI.Intracomm(PLAIN.Dup())
    send = make_data(np.float64, n, 39)
    dup.Allreduce(send, np.zeros(n))
    plain_dup.Free()
    dup.Free()          # the last handle freed: MPICH gives it to the next one made
    newer = comm.Dup()
    recv, untouched = _guarded(n)
    _same_error(lambda: dup.Allreduce(send, recv), lambda: plain_dup.Allreduce(send, recv),
                "freed communicator")
    agree(untouched(), "nothing written around the receive buffer")
    newer.Free()


def test_non_contiguous_view(comm, n):
    base = make_data(np.float64, 2 * n, 40)
    view = base[::2]
    recv, untouched = _guarded(n)
    _same_error(lambda: comm.Allreduce(view, recv), lambda: PLAIN.Allreduce(view, recv),
                "strided send view")
    out = np.zeros(2 * n)
    _same_error(lambda: comm.Allreduce(make_data(np.float64, n, 41), out[::2]),
                lambda: PLAIN.Allreduce(make_data(np.float64, n, 41), out[::2]),
                "strided receive view")
    agree(untouched() and not out.any(), "nothing written")


def _aliased(n: int) -> dict:
    """Calls whose send and receive buffers share memory on every rank
    (`b`: SIZE x n doubles), each named as MPICH names it ("buffers must not
    be aliased"); the derived one stages both messages (separate copies:
    only the user's buffers show the aliasing).  Not Alltoallv: MPICH
    runs it aliased, with results that differ from run to run, or at one
    rank fails an assertion and aborts."""
    own = slice(RANK * n, (RANK + 1) * n)
    blocks = [n] * SIZE
    wide = MPI.DOUBLE.Create_resized(0, 16).Commit()
    return {
        "Allreduce": lambda c, b: c.Allreduce(b[:n], b[:n]),
        "Scan": lambda c, b: c.Scan(b[:n], b[:n]),
        "Exscan": lambda c, b: c.Exscan(b[:n], b[:n]),
        "Allgather": lambda c, b: c.Allgather(b[own], b),
        "Allgatherv": lambda c, b: c.Allgatherv(b[own], [b, blocks]),
        "Alltoall": lambda c, b: c.Alltoall(b, b),
        "Reduce_scatter_block": lambda c, b: c.Reduce_scatter_block(b, b[:n]),
        "Reduce_scatter": lambda c, b: c.Reduce_scatter(b, b[:n], blocks),
        "Alltoall, a derived datatype": lambda c, b: c.Alltoall([b, wide], [b, wide]),
    }, wide


def test_aliased_send_and_receive(comm, n):
    """The same memory as send and receive buffer without IN_PLACE: the
    call goes to MPI, which refuses it (MPICH: "buffers must not be
    aliased") or runs it (Open MPI, for most), so that cxlmpi raises what
    stock raises and, where it raises, leaves the buffer as stock does.  The pool once
    ran them all, reading a buffer while it wrote it."""
    calls, wide = _aliased(n)
    bad = []
    for what, call in calls.items():
        results = []
        for c in (comm, PLAIN):
            buf = make_data(np.float64, n * SIZE, 42)
            results.append((_raises(functools.partial(call, c, buf)), buf))
        (got, mine), (want, stock) = results
        # (where stock runs it, MPI leaves the result undefined)
        if got != want or (want is not None and not np.array_equal(mine, stock)):
            bad.append(f"{what}: cxlmpi {got}, stock {want}")
    wide.Free()
    agree(not bad, "; ".join(bad))


def _one_buffer(n: int) -> dict:
    """Calls where rank 0 sends from and receives into disjoint parts of one
    buffer -- by displacement, by count, by vector displacements, through a
    derived datatype -- and the other ranks use two arrays: legal, the same
    type signatures.  Each `call(comm, seed)` returns the received part."""
    wide = MPI.DOUBLE.Create_resized(0, 16).Commit()
    D = MPI.DOUBLE
    blocks = [n] * SIZE
    shared = RANK == 0

    def data(m, seed):   # (whole numbers: every order sums them alike)
        return (np.arange(m) % 1000 + 10 * seed + RANK).astype(np.float64)

    def displaced(c, seed):
        if shared:
            a = np.concatenate([data(n, seed), np.zeros(n)])
            c.Allreduce([a, (n, 0), D], [a, (n, n), D])
            return a[n:]
        r = np.zeros(n)
        c.Allreduce(data(n, seed), r)
        return r

    def counted(c, seed):
        if shared:
            a = np.concatenate([data(n, seed), np.zeros(n * SIZE)])
            c.Allgather([a, n, D], a[n:])
            return a[n:]
        r = np.zeros(n * SIZE)
        c.Allgather(data(n, seed), r)
        return r

    def vector(c, seed):
        if shared:
            a = np.concatenate([data(n * SIZE, seed), np.zeros(n * SIZE)])
            c.Alltoallv([a, (blocks, [q * n for q in range(SIZE)]), D],
                        [a, (blocks, [(SIZE + q) * n for q in range(SIZE)]), D])
            return a[n * SIZE:]
        r = np.zeros(n * SIZE)
        c.Alltoallv([data(n * SIZE, seed), blocks], [r, blocks])
        return r

    def derived(c, seed):
        # (the send only: MPICH's own Allgather truncates calls whose receive
        # datatypes differ between ranks, see test_derived.py)
        if shared:   # n doubles at a 16-byte stride, then the receive buffer
            a = np.zeros(2 * n + n * SIZE)
            a[:2 * n:2] = data(n, seed)
            c.Allgather([a, (n, 0), wide], a[2 * n:])
            return a[2 * n:]
        r = np.zeros(n * SIZE)
        c.Allgather(data(n, seed), r)
        return r

    return {"Allreduce, displacements": (displaced, "allreduce"),
            "Allgather, a count": (counted, "allgather"),
            "Alltoallv, vectors": (vector, "alltoallv"),
            "Allgather, a derived datatype": (derived, "allgather")}, wide


def test_disjoint_parts_of_one_buffer_are_not_aliased():
    """Send and receive messages in one buffer that do not overlap are no
    aliasing: on rank 0 alone, each collective's first call on a fresh
    communicator takes the path its peers take and gives stock's result
    (when the whole buffer counted, rank 0 went to MPI alone while its
    peers set the pool up: the job hung).  Only the bytes a message
    reaches count."""
    n = max(2 * CFG.threshold, 3 * CFG.chunk_size + 24) // 8

    def differs(got, want):
        return "" if np.array_equal(got, want) else "differs"

    calls, wide = _one_buffer(n)
    for what, (call, name) in calls.items():
        fresh_against_stock(f"{what} in one buffer on rank 0", call, differs, 3, name)
    wide.Free()


def test_mismatch_names_each_ranks_bytes(comm):
    """The signatures a mismatch error quotes give each rank's bytes
    whatever pool variant the call ran (the variant rides in the top byte
    of the size word: a 4 MiB Allreduce once read "576460752307617792
    bytes")."""
    from cxlmpi._pool import OP_CODES, TYPE_CODES, Pool, PoolFailure

    pool = cxlmpi.pools.state.pool_state(comm)
    if not isinstance(pool, Pool) or SIZE < 2:
        pytest.skip("needs one pool of several ranks")
    n = 64 if RANK == 0 else 32
    send, recv = make_data(np.float64, n, 44), np.empty(n)
    flat = 8   # V_FLAT
    try:
        pool.reduce(send.ctypes.data, recv.ctypes.data, n, 8, OP_CODES["SUM"],
                    TYPE_CODES["f64"], -1, flat)
        got = None
    except PoolFailure:
        got = [(c[0], c[4], c[5]) for c in pool.signatures()]
    want = [("Allreduce", 8 * (64 if q == 0 else 32), flat) for q in range(SIZE)]
    agree(got == want, f"signatures {got}, want {want}")


def test_calls_out_of_step_fail_every_rank():
    """A rank that finds the ranks' calls out of step (a peer's first step
    of a call it made no step of) raises, and so does every peer waiting
    for its step: rank 1 makes two pool calls alone (each times out), then
    every rank calls once more.  Rank 0 sees rank 1's step of a later call
    and raises the mismatch; rank 1, waiting for rank 0's step of its third
    call, raises it too (before the `broken` mark it waited out its
    timeout), or finds rank 0 gone from the pool, if it looks late.
    Pool-level: no program that keeps MPI's rules gets here any more
    (mpi4py's test_cco_buf once did, through a miscounted pass)."""
    from cxlmpi._pool import Pool, PoolFailure

    wrapped = cxlmpi.wrap(PLAIN.Dup())
    pool = cxlmpi.pools.state.pool_state(wrapped)
    if not isinstance(pool, Pool) or SIZE < 2:
        wrapped.Free()
        pytest.skip("needs one pool of several ranks")
    errors = []
    if RANK == 1:
        pool.timeout_s = 0.05
        for _ in range(2):
            try:
                pool.barrier()
            except PoolFailure as exc:
                errors.append("timed out" if exc.timed_out else "other")
        for q in range(SIZE):
            if q != 1:
                PLAIN.send(None, dest=q, tag=5)   # the others wait for that
    else:
        PLAIN.recv(source=1, tag=5)
    pool.timeout_s = 30
    try:
        pool.barrier()
        errors.append("returned")
    except PoolFailure as exc:
        # (a peer slow to look may find the rank that raised gone from the
        # pool first -- its communicator freed -- which says as much, at once)
        errors.append("mismatch" if exc.mismatch or exc.left else
                      "timed out" if exc.timed_out else "other")
    PLAIN.Barrier()   # every rank has raised, and marked its line
    found = pool.out_of_step()
    wrapped.Free()
    want = (["timed out"] * 2 if RANK == 1 else []) + ["mismatch"]
    # (which rank finds the calls out of step first is timing: rank 0, or
    # at 3 or more ranks any other peer of rank 1's; each that raised says so)
    agree(errors == want and found == list(range(SIZE)),
          f"rank {RANK}: {errors}, out of step: {found}")
    # the next communicator never takes that pool over (its calls were
    # counted apart: every call on it raised the mismatch)
    again = cxlmpi.wrap(PLAIN.Dup())
    fresh = cxlmpi.pools.state.pool_state(again)
    try:
        fresh.barrier()
        met = "met"
    except PoolFailure as exc:
        met = f"{exc}"
    again.Free()
    agree(met == "met", f"the next communicator's pool barrier: {met}")


def test_reduce_scatter_counts_not_a_sequence(comm, n):
    """An int recvcounts: stock mpi4py refuses it (TypeError); so does
    cxlmpi, straight path or pool, rather than taking it for every block."""
    send = make_data(np.float64, n * SIZE, 43)
    recv, untouched = _guarded(n)
    _same_error(lambda: comm.Reduce_scatter(send, recv, n),
                lambda: PLAIN.Reduce_scatter(send, recv, n), "int recvcounts")
    agree(untouched(), "nothing written around the receive buffer")


def test_counts_read_as_mpi4py_reads_them(comm, n):
    """Counts are read by len() and [i], as mpi4py reads them: a dict
    {rank: count} gives the counts in rank order (before: its keys, a
    silent wrong result), a generator is refused as by stock (TypeError)."""
    counts = {q: n + q for q in range(SIZE)}
    send = make_data(np.float64, counts[RANK], 44)
    want = np.full(sum(counts.values()), -7.0)
    got = want.copy()
    PLAIN.Allgatherv(send, [want, counts, MPI.DOUBLE])
    comm.Allgatherv(send, [got, counts, MPI.DOUBLE])
    agree(np.array_equal(got, want), "Allgatherv with counts in a dict")
    _same_error(lambda: comm.Allgatherv(send, [got, (n + q for q in range(SIZE)), MPI.DOUBLE]),
                lambda: PLAIN.Allgatherv(send, [want, (n + q for q in range(SIZE)),
                                                MPI.DOUBLE]), "counts in a generator")
