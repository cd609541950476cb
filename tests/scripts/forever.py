"""Pool collectives in an endless loop, until a signal ends the job
(tests/test_reliability.py).

Run under ``python -m cxlmpi``: COMM_WORLD is the wrapped communicator.
After the first round of pool collectives, rank 0 prints one line
``READY <pid of rank 0> <pid of rank 1> ...`` (flushed); nothing else is
printed.  The loop checks its Allreduce against stock MPI on the same handle
every round, and raises if they ever differ.
"""

from __future__ import annotations

import os
import sys

import numpy as np
from mpi4py import MPI

N = 1 << 15  # 256 KiB of float64: several chunks, through the pool


def main() -> None:
    comm = MPI.COMM_WORLD
    plain = MPI.Intracomm(comm)
    rank, size = comm.Get_rank(), comm.Get_size()
    data = np.arange(N, dtype=np.float64) + rank
    got, want = np.empty(N), np.empty(N)
    block = np.full(N // size, float(rank))
    gathered = np.empty(block.size * size)
    first = True
    while True:
        comm.Allreduce(data, got)
        plain.Allreduce(data, want)
        if not np.array_equal(got, want):
            raise AssertionError("pool Allreduce differs from stock")
        comm.Bcast(got, 0)
        comm.Allgather(block, gathered)
        comm.Barrier()
        if first:
            pids = plain.gather(os.getpid(), root=0)
            if rank == 0:
                sys.stdout.write("READY " + " ".join(map(str, pids)) + "\n")
                sys.stdout.flush()
            first = False


if __name__ == "__main__":
    main()
