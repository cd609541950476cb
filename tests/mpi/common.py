"""Helpers for the MPI test bodies (each runs on every rank under mpiexec).

A test computes its verdict locally and then `agree()`s: every rank learns
whether any rank failed, so all ranks fail the same test together and none
is left waiting in a collective the others skipped.
"""

from __future__ import annotations

import functools
import os

import numpy as np
from mpi4py import MPI

import cxlmpi
from cxlmpi import config

PLAIN = MPI.COMM_WORLD
RANK = PLAIN.Get_rank()
SIZE = PLAIN.Get_size()
CFG = config.get()

# Every numeric type the kernels reduce, plus bool and bytes.
INT_TYPES = [np.int8, np.int16, np.int32, np.int64,
             np.uint8, np.uint16, np.uint32, np.uint64]
FLOAT_TYPES = [np.float32, np.float64]
COMPLEX_TYPES = [np.complex64, np.complex128]
NUMERIC_TYPES = INT_TYPES + FLOAT_TYPES + COMPLEX_TYPES

ARITH_OPS = [MPI.SUM, MPI.PROD]
ORDER_OPS = [MPI.MAX, MPI.MIN]
LOGICAL_OPS = [MPI.LAND, MPI.LOR, MPI.LXOR]
BITWISE_OPS = [MPI.BAND, MPI.BOR, MPI.BXOR]


def ops_for(dtype: type) -> list[MPI.Op]:
    """The predefined ops MPI defines on `dtype` (numpy uint8 is
    MPI.UNSIGNED_CHAR in mpi4py: all of an integer's)."""
    if dtype is np.bool_:
        return LOGICAL_OPS
    if dtype in INT_TYPES:
        return ARITH_OPS + ORDER_OPS + LOGICAL_OPS + BITWISE_OPS
    if dtype in FLOAT_TYPES:
        return ARITH_OPS + ORDER_OPS
    return ARITH_OPS


def slot_nbytes(nranks: int = SIZE) -> int:
    """Bytes of one data half of a rank's slot at the configured pool size."""
    from cxlmpi._pool import Pool

    return Pool.layout(nranks, CFG.pool_size)[1]


def sizes_bytes() -> list[int]:
    """Message sizes that matter: 0, tiny, odd, around the threshold, several
    chunks, and larger than a slot."""
    thr = CFG.threshold
    bthr = (CFG.windows()["bcast"] or (thr, None))[0]
    chunk = CFG.chunk_size
    cap = 3 << 20  # keeps the suite fast; larger windows are tested with the small pool
    sizes = {0, 1, 8, 56, thr - 8, thr, thr + 8, 3 * chunk + 24,
             min(slot_nbytes() + slot_nbytes() // 2 + 40, cap)}
    if bthr + 8 <= cap:
        sizes |= {bthr - 8, bthr, bthr + 8}
    return sorted(sizes)


def counts_for(dtype: type) -> list[int]:
    itemsize = np.dtype(dtype).itemsize
    return sorted({max(0, n // itemsize) for n in sizes_bytes()} | {1, 7})


def make_data(dtype: type, count: int, seed: int, op: MPI.Op | None = None,
              rank: int = RANK) -> np.ndarray:
    """Rank-dependent data that no op overflows differently across orders."""
    rng = np.random.default_rng([seed, rank, count])
    if dtype is np.bool_:
        return rng.integers(0, 2, count).astype(np.bool_)
    if np.issubdtype(dtype, np.integer):
        if op in (MPI.PROD,):
            vals = rng.choice([1, 1, 1, 2], count)
        else:
            # No sum overflows: MPIs differ there (Open MPI's AVX kernels
            # saturate int8/int16 sums, MPICH wraps around like C).
            vals = rng.integers(0, min(100, np.iinfo(dtype).max // max(SIZE, 1)), count)
        return vals.astype(dtype)
    if np.issubdtype(dtype, np.complexfloating):
        return (rng.standard_normal(count) + 1j * rng.standard_normal(count)).astype(dtype)
    return rng.standard_normal(count).astype(dtype)


def same(got: np.ndarray, want: np.ndarray, op: MPI.Op | None = None) -> bool:
    """Integers, bools and MAX/MIN bit-identical; SUM/PROD of floats within
    rounding (stock MPI may reduce in another order)."""
    if got.shape != want.shape or got.dtype != want.dtype:
        return False
    if np.issubdtype(got.dtype, np.inexact) and op in (MPI.SUM, MPI.PROD):
        tol = 1e-4 if got.dtype in (np.float32, np.complex64) else 1e-10
        return bool(np.allclose(got, want, rtol=tol, atol=tol))
    return bool(np.array_equal(got, want))


def agree(ok: bool, what: str = "") -> None:
    """Collective assertion: fails on every rank if it failed on any."""
    oks = PLAIN.allgather(bool(ok))
    if not all(oks):
        bad = [r for r, v in enumerate(oks) if not v]
        raise AssertionError(f"{what}: failed on ranks {bad}")


@functools.cache
def pool_groups() -> tuple[int, int]:
    """(pool groups, ranks in the largest) of a communicator of every rank
    in this job: CXLMPI_POOL_GROUPS splits a node's ranks, and the nodes
    MPI sees (MPICH's MPIR_CVAR_NUM_CLIQUES) have a pool each.  Collective
    on its first call."""
    from cxlmpi.pools.hierarchy import Hierarchy
    from cxlmpi.pools.state import pool_state

    comm = cxlmpi.wrap(PLAIN.Dup())
    try:
        pool = pool_state(comm)
        if isinstance(pool, Hierarchy):
            return len(pool.groups), max(len(g) for g in pool.groups)
        return (1, SIZE) if pool is not None else (SIZE, 1)
    finally:
        comm.Free()


def pool_expected(name: str) -> bool:
    """Whether large calls of collective `name` ("objects": the object
    collectives) should go through the pool in this job: with several pool
    groups, only those the hierarchy runs."""
    from cxlmpi.pools import hierarchy

    if SIZE < 2 or CFG.disable or pool_groups()[1] < 2:  # no two ranks share a pool
        return False
    if CFG.adaptive and name != "objects":
        return False   # the path is whatever measured fastest: not for a test to say
    if name == "barrier" and CFG.ordering:
        return False   # the MPI barrier that ends pool collectives does its work
    return pool_groups()[0] < 2 or name in hierarchy.ACROSS_GROUPS


def pool_calls(name: str) -> int:
    return int(cxlmpi.stats().get(name, {}).get("pool_calls", 0))


def fresh_against_stock(what: str, call, differs, calls: int, pool_name: str) -> None:
    """`call(comm, seed)` `calls` times on a fresh wrapped communicator --
    its first call sets the pool up -- and on a fresh plain one;
    `differs(got, want)` says how a result differs ("" where it does not).
    Every rank agrees on the verdict, and on whether collective
    `pool_name` used the pool where it should have."""
    comm = cxlmpi.wrap(PLAIN.Dup())
    plain = PLAIN.Dup()
    before = pool_calls(pool_name)
    why = ""
    try:
        for i in range(calls):
            why = differs(call(comm, 100 + i), call(plain, 100 + i))
            if why:
                why = f"call {i}: {why}"
                break
    finally:
        comm.Free()
        plain.Free()
    agree(not why, f"{what} {why}")
    if pool_expected(pool_name):
        agree(pool_calls(pool_name) > before, f"{what}: used the pool")


def expect_flush() -> bool:
    return os.environ.get("CXLMPI_EXPECT_FLUSH") == "1"
