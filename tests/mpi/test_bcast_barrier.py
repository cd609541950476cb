"""Bcast and Barrier through the pool against stock MPI."""

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
    pool_calls,
    pool_expected,
)
from mpi4py import MPI


@pytest.mark.parametrize("dtype", [*NUMERIC_TYPES, np.bool_],
                         ids=lambda t: np.dtype(t).name)
def test_bcast_exhaustive(comm, dtype):
    before = pool_calls("bcast")
    for root in range(SIZE):
        for count in counts_for(dtype):
            data = make_data(dtype, count, 10, rank=root)
            want = data.copy() if RANK == root else np.zeros(count, dtype)
            PLAIN.Bcast(want, root)
            got = data.copy() if RANK == root else np.zeros(count, dtype)
            comm.Bcast(got, root)
            agree(np.array_equal(got, want) and np.array_equal(got, data),
                  f"Bcast {dtype} root={root} n={count}")
    if pool_expected("bcast"):
        agree(pool_calls("bcast") > before, "large Bcast used the pool")


def test_bcast_forms_and_bytes(comm):
    n = counts_for(np.uint8)[-1]
    root = SIZE - 1
    src = bytes(make_data(np.uint8, n, 11, rank=root))
    buf = bytearray(src) if RANK == root else bytearray(n)
    comm.Bcast([buf, MPI.BYTE], root)
    agree(bytes(buf) == src, "bytearray Bcast")
    # a read-only buffer is fine at the root
    got = np.zeros(n, np.uint8)
    comm.Bcast(src if RANK == root else got, root)
    agree(RANK == root or bytes(got) == src, "read-only root buffer")
    # char data: movement only
    arr = np.frombuffer(src, dtype="S1").copy() if RANK == root else np.zeros(n, "S1")
    comm.Bcast([arr, MPI.CHAR], root)
    agree(arr.tobytes() == src, "MPI.CHAR Bcast")


def test_barrier(comm):
    big = make_data(np.float64, counts_for(np.float64)[-1], 12)
    comm.Allreduce(MPI.IN_PLACE, big)  # a pool call: the pool exists from here on
    before = pool_calls("barrier")
    for _ in range(20):
        comm.Barrier()
    if pool_expected("barrier"):
        agree(pool_calls("barrier") >= before + 20, "Barrier in the pool")
    # A barrier really separates: a value written before it by every rank
    # is seen after it by all (through the pool's own memory ordering).
    token = np.array([RANK + 1.0] * 1024)
    out = np.zeros_like(token)
    comm.Allreduce(token, out)
    comm.Barrier()
    agree(bool(np.all(out == SIZE * (SIZE + 1) / 2)), "Allreduce then Barrier")
