"""Allreduce and Reduce through the pool against stock MPI on the same data:
every dtype x op x root x size class, IN_PLACE, every message form."""

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

TYPES = [*NUMERIC_TYPES, np.bool_]


@pytest.mark.parametrize("dtype", TYPES, ids=lambda t: np.dtype(t).name)
def test_allreduce_exhaustive(comm, dtype):
    before = pool_calls("allreduce")
    for op in ops_for(dtype):
        for count in counts_for(dtype):
            send = make_data(dtype, count, 1, op)
            want = np.zeros(count, dtype)
            PLAIN.Allreduce(send, want, op)
            got = np.zeros(count, dtype)
            comm.Allreduce(send, got, op)
            agree(same(got, want, op), f"Allreduce {op} {dtype} n={count}")
            inplace = send.copy()
            comm.Allreduce(MPI.IN_PLACE, inplace, op)
            agree(same(inplace, want, op), f"Allreduce IN_PLACE {op} {dtype} n={count}")
    if pool_expected("allreduce"):
        agree(pool_calls("allreduce") > before, "large Allreduce used the pool")


@pytest.mark.parametrize("dtype", TYPES, ids=lambda t: np.dtype(t).name)
def test_reduce_exhaustive(comm, dtype):
    for op in ops_for(dtype):
        for root in range(SIZE):
            for count in counts_for(dtype)[::2] + counts_for(dtype)[-1:]:
                send = make_data(dtype, count, 2, op)
                want = np.zeros(count, dtype)
                PLAIN.Reduce(send, want if RANK == root else None, op, root)
                got = np.full(count, 3, dtype)
                sentinel = got.copy()
                comm.Reduce(send, got if RANK == root else None, op, root)
                ok = same(got, want, op) if RANK == root else \
                    bool(np.array_equal(got, sentinel))
                agree(ok, f"Reduce {op} {dtype} root={root} n={count}")
                inplace = send.copy()
                comm.Reduce(MPI.IN_PLACE if RANK == root else inplace,
                            inplace if RANK == root else None, op, root)
                ok = same(inplace, want, op) if RANK == root else \
                    bool(np.array_equal(inplace, send))
                agree(ok, f"Reduce IN_PLACE {op} {dtype} root={root} n={count}")


def test_message_forms(comm):
    count = counts_for(np.float64)[-1]
    send = make_data(np.float64, count, 3)
    want = np.zeros(count)
    PLAIN.Allreduce(send, want)
    forms = [
        lambda b: b,
        lambda b: [b, MPI.DOUBLE],
        lambda b: [b, "d"],
        lambda b: [b, count],
        lambda b: [b, count, MPI.DOUBLE],
        lambda b: (b, (count, 0), MPI.DOUBLE),
        lambda b: [b, count, 0, MPI.DOUBLE],
        lambda b: [memoryview(b).cast("B"), count, MPI.DOUBLE],
    ]
    for i, form in enumerate(forms):
        got = np.zeros(count)
        comm.Allreduce(form(send), form(got))
        agree(same(got, want, MPI.SUM), f"form {i}")
    # a displacement and a count inside a larger buffer; the rest untouched
    big_send = np.concatenate([np.full(5, -1.0), send, np.full(3, -2.0)])
    big_recv = np.full(count + 8, 9.0)
    comm.Allreduce([big_send, (count, 5), MPI.DOUBLE], [big_recv, (count, 5), MPI.DOUBLE])
    ok = same(big_recv[5:5 + count], want, MPI.SUM) and \
        bool(np.all(big_recv[:5] == 9.0) and np.all(big_recv[5 + count:] == 9.0))
    agree(ok, "displacement form")
    # a bytearray with an explicit datatype, and a different form per rank
    raw = bytearray(send.tobytes())
    out = np.zeros(count)
    comm.Allreduce([raw, MPI.DOUBLE] if RANK % 2 else send, out)
    agree(same(out, want, MPI.SUM), "mixed forms across ranks")


def test_aliased_types_agree(comm):
    """int64 as numpy 'l' on some ranks, MPI.INT64_T on others."""
    count = counts_for(np.int64)[-1]
    send = make_data(np.int64, count, 4)
    want = np.zeros(count, np.int64)
    PLAIN.Allreduce(send, want, MPI.MAX)
    got = np.zeros(count, np.int64)
    if RANK % 2:
        comm.Allreduce([send, MPI.INT64_T], [got, MPI.INT64_T], MPI.MAX)
    else:
        comm.Allreduce(send, got, MPI.MAX)
    agree(same(got, want, MPI.MAX), "aliased int64 types")


def test_results_identical_on_all_ranks(comm):
    """The pool reduces in rank order on every rank: bit-identical floats."""
    count = counts_for(np.float32)[-1]
    send = make_data(np.float32, count, 5)
    got = np.zeros(count, np.float32)
    comm.Allreduce(send, got)
    digests = PLAIN.allgather(got.tobytes())
    agree(all(d == digests[0] for d in digests), "identical float results")


def test_large_count_two_dimensional(comm):
    """Multi-dimensional and Fortran-ordered arrays are contiguous buffers."""
    send = np.asfortranarray(make_data(np.float64, 600, 6).reshape(20, 30))
    want = np.zeros((20, 30), order="F")
    PLAIN.Allreduce(send, want, MPI.MIN)
    got = np.zeros((20, 30), order="F")
    comm.Allreduce(send, got, MPI.MIN)
    agree(same(got, want, MPI.MIN), "2-D Fortran array")
