"""A collective of more than 2**31 elements (mpi4py supports large counts):
the wrapped Allreduce (MAX, int8) against stock on the same data (against a
numpy reference where the MPI refuses such counts).  Prints
``RESULT ok|mismatch <elements> <cxlmpi s> <reference s> stock|numpy``."""

from __future__ import annotations

import sys
import time

import numpy as np
from mpi4py import MPI

import cxlmpi


def main() -> None:
    n = (1 << 31) + 64
    plain = MPI.COMM_WORLD
    comm = cxlmpi.wrap(plain.Dup())
    rank = plain.Get_rank()
    send = np.empty(n, np.int8)
    send[:] = (rank * 37) % 101
    send[::4097] = rank  # vary the data along the whole buffer
    got = np.empty(n, np.int8)
    t0 = time.perf_counter()
    comm.Allreduce(send, got, MPI.MAX)
    t1 = time.perf_counter()
    del send  # memory: keep at most three buffers alive
    want = np.empty(n, np.int8)
    send = np.empty(n, np.int8)
    send[:] = (rank * 37) % 101
    send[::4097] = rank
    t2 = time.perf_counter()
    try:
        plain.Allreduce(send, want, MPI.MAX)
        stock = "stock"
    except MPI.Exception:
        # Open MPI 5.0 refuses counts above 2**31 (MPI_ERR_ARG): the data is
        # known on every rank, so the reference is computed here instead.
        del send
        size = plain.Get_size()
        want[:] = max((r * 37) % 101 for r in range(size))
        want[::4097] = size - 1
        stock = "numpy"
    t3 = time.perf_counter()
    ok = plain.allreduce(bool(np.array_equal(got, want)), op=MPI.LAND)
    if rank == 0:
        print(f"RESULT {'ok' if ok else 'mismatch'} {n} {t1 - t0:.2f} {t3 - t2:.2f} {stock}")
        sys.stdout.flush()
    comm.Free()


if __name__ == "__main__":
    main()
