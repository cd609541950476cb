"""Gather/scatter/all-to-all families, reduce-scatter and scans through the
pool against stock MPI on the same data: dtypes, roots, sizes (0, 1, uneven,
above a slot), IN_PLACE forms, v-variants with ranks contributing nothing."""

from __future__ import annotations

import numpy as np
import pytest
from common import (
    NUMERIC_TYPES,
    PLAIN,
    RANK,
    SIZE,
    agree,
    counts_for,
    make_data,
    ops_for,
    pool_calls,
    pool_expected,
    same,
)
from mpi4py import MPI

MOVE_TYPES = [np.float64, np.int8, np.complex64, np.int32, np.bool_]


def _block_counts(dtype) -> list[int]:
    """Per-rank block sizes: small, odd, around the threshold, large."""
    counts = counts_for(dtype)
    return sorted({0, 1, 7, *counts[len(counts) // 2:]})


def _uneven(total: int, seed: int) -> list[int]:
    """Per-rank counts summing to about `total`, some ranks contributing 0."""
    rng = np.random.default_rng([seed, total, SIZE])  # same on every rank
    counts = [int(c) for c in rng.integers(0, max(1, 2 * total // SIZE + 1), SIZE)]
    if SIZE > 1:
        counts[int(rng.integers(SIZE))] = 0
    return counts


@pytest.mark.parametrize("dtype", MOVE_TYPES, ids=lambda t: np.dtype(t).name)
def test_allgather_and_gather(comm, dtype):
    bad = []
    for n in _block_counts(dtype):
        mine = make_data(dtype, n, 50)
        want = np.zeros(n * SIZE, dtype)
        PLAIN.Allgather(mine, want)
        got = np.zeros(n * SIZE, dtype)
        comm.Allgather(mine, got)
        if not np.array_equal(got, want):
            bad.append(f"Allgather n={n}")
        inplace = np.zeros(n * SIZE, dtype)
        inplace[RANK * n:(RANK + 1) * n] = mine
        comm.Allgather(MPI.IN_PLACE, inplace)
        if not np.array_equal(inplace, want):
            bad.append(f"Allgather IN_PLACE n={n}")
        for root in range(SIZE):
            got = np.zeros(n * SIZE, dtype)
            comm.Gather(mine, got if RANK == root else None, root)
            if RANK == root and not np.array_equal(got, want):
                bad.append(f"Gather root={root} n={n}")
            inplace = want.copy() if RANK == root else None
            if RANK == root:
                inplace[:] = 0
                inplace[RANK * n:(RANK + 1) * n] = mine
            comm.Gather(MPI.IN_PLACE if RANK == root else mine, inplace, root)
            if RANK == root and not np.array_equal(inplace, want):
                bad.append(f"Gather IN_PLACE root={root} n={n}")
            # None at the root: no elements of its own (mpi4py), decided as
            # IN_PLACE (a root that passed alone hung the other pool groups)
            base = make_data(dtype, n * SIZE, 54)
            got, want_none = base.copy(), base.copy()
            PLAIN.Gather(None if RANK == root else mine, want_none if RANK == root else None,
                         root)
            comm.Gather(None if RANK == root else mine, got if RANK == root else None, root)
            if RANK == root and not np.array_equal(got, want_none):
                bad.append(f"Gather None at root={root} n={n}")
    agree(not bad, "; ".join(bad))


@pytest.mark.parametrize("dtype", MOVE_TYPES, ids=lambda t: np.dtype(t).name)
def test_scatter_and_alltoall(comm, dtype):
    bad = []
    for n in _block_counts(dtype):
        for root in range(SIZE):
            full = make_data(dtype, n * SIZE, 51, rank=root)
            want = np.zeros(n, dtype)
            PLAIN.Scatter(full if RANK == root else None, want, root)
            got = np.zeros(n, dtype)
            comm.Scatter(full if RANK == root else None, got, root)
            if not np.array_equal(got, want):
                bad.append(f"Scatter root={root} n={n}")
            if RANK == root:
                keep = full.copy()
                comm.Scatter(full, MPI.IN_PLACE, root)
                if not np.array_equal(full, keep):
                    bad.append(f"Scatter IN_PLACE root={root} n={n}")
            else:
                comm.Scatter(None, got, root)
            got, want = np.zeros(n, dtype), np.zeros(n, dtype)   # (None at the root)
            PLAIN.Scatter(full if RANK == root else None, None if RANK == root else want, root)
            comm.Scatter(full if RANK == root else None, None if RANK == root else got, root)
            if not np.array_equal(got, want):
                bad.append(f"Scatter None at root={root} n={n}")
        send = make_data(dtype, n * SIZE, 52)
        want = np.zeros(n * SIZE, dtype)
        PLAIN.Alltoall(send, want)
        got = np.zeros(n * SIZE, dtype)
        comm.Alltoall(send, got)
        if not np.array_equal(got, want):
            bad.append(f"Alltoall n={n}")
        inplace = send.copy()
        comm.Alltoall(MPI.IN_PLACE, inplace)
        if not np.array_equal(inplace, want):
            bad.append(f"Alltoall IN_PLACE n={n}")
    agree(not bad, "; ".join(bad))


@pytest.mark.parametrize("dtype", [np.float64, np.int16, np.complex128])
def test_vector_variants(comm, dtype):
    bad = []
    for total in (0, 5, counts_for(dtype)[-1]):
        counts = _uneven(total, 53)
        displs = list(np.cumsum([0] + counts[:-1]) + np.arange(SIZE))  # gaps
        length = displs[-1] + counts[-1] if SIZE else 0
        mine = make_data(dtype, counts[RANK], 54)
        # Allgatherv (counts known everywhere)
        want = np.zeros(length, dtype)
        PLAIN.Allgatherv(mine, [want, counts, displs, None])
        got = np.zeros(length, dtype)
        comm.Allgatherv(mine, [got, (counts, displs), None])
        if not np.array_equal(got, want):
            bad.append(f"Allgatherv total={total}")
        for root in range(SIZE):
            # Gatherv: only the root knows the counts
            want = np.zeros(length, dtype)
            got = np.zeros(length, dtype)
            PLAIN.Gatherv(mine, [want, counts, displs, None] if RANK == root else None, root)
            comm.Gatherv(mine, [got, counts, displs, None] if RANK == root else None, root)
            if RANK == root and not np.array_equal(got, want):
                bad.append(f"Gatherv root={root} total={total}")
            # Scatterv
            full = make_data(dtype, length, 55, rank=root)
            want = np.zeros(counts[RANK], dtype)
            got = np.zeros(counts[RANK], dtype)
            msg = [full, counts, displs, None] if RANK == root else None
            PLAIN.Scatterv(msg, want, root)
            comm.Scatterv(msg, got, root)
            if not np.array_equal(got, want):
                bad.append(f"Scatterv root={root} total={total}")
        # Alltoallv: every pair its own count
        rng = np.random.default_rng([56, total])
        matrix = rng.integers(0, max(1, total // SIZE + 1), (SIZE, SIZE))
        scounts = [int(c) for c in matrix[RANK]]
        rcounts = [int(c) for c in matrix[:, RANK]]
        send = make_data(dtype, sum(scounts), 57)
        want = np.zeros(sum(rcounts), dtype)
        got = np.zeros(sum(rcounts), dtype)
        PLAIN.Alltoallv([send, scounts], [want, rcounts])
        comm.Alltoallv([send, scounts], [got, rcounts])
        if not np.array_equal(got, want):
            bad.append(f"Alltoallv total={total}")
    agree(not bad, "; ".join(bad))


@pytest.mark.parametrize("dtype", [*NUMERIC_TYPES, np.bool_], ids=lambda t: np.dtype(t).name)
def test_reduce_scatter_and_scans(comm, dtype):
    bad = []
    before = pool_calls("reduce_scatter_block") + pool_calls("scan")
    for op in ops_for(dtype):
        for n in (1, counts_for(dtype)[-1] // SIZE):
            send = make_data(dtype, n * SIZE, 58, op)
            want = np.zeros(n, dtype)
            PLAIN.Reduce_scatter_block(send, want, op)
            got = np.zeros(n, dtype)
            comm.Reduce_scatter_block(send, got, op)
            if not same(got, want, op):
                bad.append(f"Reduce_scatter_block {op} n={n}")
            inplace = send.copy()
            comm.Reduce_scatter_block(MPI.IN_PLACE, inplace, op)
            if not same(inplace[:n], want, op):
                bad.append(f"Reduce_scatter_block IN_PLACE {op} n={n}")
            # largest count first: MPICH 5.0.2's own in-place Reduce_scatter
            # fails when a count exceeds the sum of the counts before it
            # (met when the shim passes it through, e.g. CXLMPI_DISABLE=1)
            counts = sorted(_uneven(n * SIZE, 59), reverse=True)
            send = make_data(dtype, sum(counts), 60, op)
            want = np.zeros(counts[RANK], dtype)
            got = np.zeros(counts[RANK], dtype)
            PLAIN.Reduce_scatter(send, want, counts, op)
            comm.Reduce_scatter(send, got, counts, op)
            if not same(got, want, op):
                bad.append(f"Reduce_scatter {op} counts={counts}")
            inplace = send.copy()
            comm.Reduce_scatter(MPI.IN_PLACE, inplace, counts, op)
            if not same(inplace[:counts[RANK]], want, op):
                bad.append(f"Reduce_scatter IN_PLACE {op}")
            data = make_data(dtype, n, 61, op)
            for name in ("Scan", "Exscan"):
                want = np.zeros(n, dtype)
                got = np.zeros(n, dtype)
                getattr(PLAIN, name)(data, want, op)
                getattr(comm, name)(data, got, op)
                inplace = data.copy()
                getattr(comm, name)(MPI.IN_PLACE, inplace, op)
                if name == "Exscan" and RANK == 0:
                    continue  # undefined on rank 0
                if not same(got, want, op) or not same(inplace, want, op):
                    bad.append(f"{name} {op} n={n}")
    agree(not bad, "; ".join(bad))
    largest = counts_for(dtype)[-1] // SIZE * np.dtype(dtype).itemsize * SIZE
    if pool_expected("reduce_scatter_block") and largest >= comm_threshold():
        agree(pool_calls("reduce_scatter_block") + pool_calls("scan") > before,
              "reduce-scatter and scans used the pool")


def comm_threshold() -> int:
    from common import CFG

    return CFG.threshold


def test_bad_vector_messages_write_nothing_past_the_buffer(comm):
    """Displacements past the end, or overlapping receive blocks, on every
    rank.  Where the call would take the pool, every rank raises a
    ValueError before writing; where it goes to MPI, MPI gets them on a
    scratch copy reaching as far as the blocks do (receive blocks that
    overlap, as given): what lands in the buffer is what stock puts there
    given room enough, and nothing lands past it."""
    counts = [4] * SIZE
    problems = []
    for displs in ([0] + [100] * (SIZE - 1), [0] * SIZE):
        if SIZE == 1 and displs == [0]:
            displs = [100]
        whole = np.zeros(4 * SIZE + 8)
        buf = whole[:4 * SIZE]
        mine = comm.Dup()   # (refused in the pool, its pool closes)
        try:
            mine.Allgatherv(np.ones(4) * (RANK + 1), [buf, counts, displs, MPI.DOUBLE])
            raised = None
        except ValueError as exc:
            raised = str(exc)
        mine.Free()
        roomy = np.zeros(4 * SIZE + 200)
        PLAIN.Allgatherv(np.ones(4) * (RANK + 1), [roomy, counts, displs, MPI.DOUBLE])
        everyone = PLAIN.allgather(raised is not None)
        if any(everyone) and not (all(everyone) and ("outside" in raised or
                                                     "overlap" in raised)):
            problems.append(f"{displs}: raised on some ranks only, or unclearly: {raised}")
        if np.any(whole[4 * SIZE:]):
            problems.append(f"{displs}: written past the buffer")
        if raised is None and not np.array_equal(buf, roomy[:4 * SIZE]):
            problems.append(f"{displs}: not stock's values")
    agree(not problems, f"bad vectors: {problems}")


def test_every_family_used_the_pool(comm):
    """The tests above ran through the pool, not only through MPI (with
    the test-sized pool, where the thresholds are tiny)."""
    from common import CFG

    if not pool_expected("allgather") or CFG.threshold > 64:
        return
    names = ["allgather", "allgatherv", "gather", "gatherv", "scatter", "scatterv",
             "alltoall", "alltoallv", "reduce_scatter_block", "reduce_scatter",
             "scan", "exscan"]
    unused = [name for name in names if pool_expected(name) and pool_calls(name) == 0]
    agree(not unused, f"never through the pool: {unused}")


def test_v_variants_agree_when_one_rank_declines(comm):
    """One rank uses a derived datatype (legal: the type signatures match):
    the header step makes every rank take the MPI path together."""
    dt = MPI.DOUBLE.Create_contiguous(1).Commit()
    try:
        counts = [3 + q for q in range(SIZE)]
        total = sum(counts)
        mine = make_data(np.float64, counts[RANK], 62)
        want = np.zeros(total)
        got = np.zeros(total)
        for root in range(SIZE):
            PLAIN.Gatherv(mine, [want, counts, None, MPI.DOUBLE] if RANK == root else None,
                          root)
            rtype = dt if RANK == root else MPI.DOUBLE
            comm.Gatherv(mine, [got, counts, None, rtype] if RANK == root else None, root)
            agree(RANK != root or np.array_equal(got, want), f"Gatherv root={root}")
        scounts = [1 + (RANK + d) % 3 for d in range(SIZE)]
        rcounts = [1 + (q + RANK) % 3 for q in range(SIZE)]
        send = make_data(np.float64, sum(scounts), 63)
        want = np.zeros(sum(rcounts))
        got = np.zeros(sum(rcounts))
        PLAIN.Alltoallv([send, scounts], [want, rcounts])
        comm.Alltoallv([send, scounts, None, dt if RANK == 0 else MPI.DOUBLE],
                       [got, rcounts])
        agree(np.array_equal(got, want), "Alltoallv with one derived type")
    finally:
        dt.Free()
