"""A peer that leaves a pool collective on another branch after its pool
steps (it raised there) while this rank finished it: this rank's MPI
barrier after the collective (CXLMPI_ORDERING) must not wait for it for
ever (tests/test_progress.py).

    mpiexec -n 2 python order_branch.py

Rank 1 runs the pool steps of an Allreduce by itself (Pool.reduce, as the
shim would) and skips the barrier that ends it, as a rank that raised
right there would; rank 0 makes the Allreduce.  Each rank prints
``BRANCH <rank> <what happened>``; both leave without MPI_Finalize (rank
0's barrier is still pending).
"""

import os
import sys

import numpy as np
from cxlmpi._pool import OP_CODES, TYPE_CODES
from mpi4py import MPI

import cxlmpi
from cxlmpi.state import pool_for

plain = MPI.COMM_WORLD
comm = cxlmpi.wrap(plain.Dup())
rank = comm.Get_rank()
data = np.arange(1 << 15, dtype=np.float64) + rank
got = np.empty_like(data)
comm.Allreduce(data, got)          # sets the pool up
if rank == 0:
    try:
        comm.Allreduce(data, got)
        what = "returned"
    except cxlmpi.CXLMPITimeoutError as exc:
        what = f"raised CXLMPITimeoutError {exc}"
else:
    pool_for(comm).reduce(data.ctypes.data, got.ctypes.data, data.size, 8,
                          OP_CODES["SUM"], TYPE_CODES["f64"], -1)
    what = "skipped the barrier"
sys.stdout.write(f"BRANCH {rank} {what}\n")
sys.stdout.flush()
plain.Barrier()
os._exit(0)
