"""A peer that reaches the end of a pool collective late, or never (it
raised right after its pool steps), while this rank finished them: this
rank's MPI barrier after the collective (CXLMPI_ORDERING) must neither wait
for ever nor take a core while it waits (tests/test_progress.py).

    mpiexec -n 2 python order_branch.py skip|late [--without-library]

Rank 1 runs the pool steps of an Allreduce by itself (Pool.reduce, as the
shim would); then `skip` leaves the barrier that ends it out, as a rank
that raised right there would, and `late` computes for 2 s of CPU time
before it makes that barrier (`_shim.order_calls`).  Rank 0 makes the
Allreduce.  `--without-library`: both ranks behave as where the MPI
library's functions were not found (the barrier then goes through
mpi4py).  Each rank prints ``BRANCH <rank> <what happened>``, with the
share of the time it waited (rank 0) or computed (rank 1) it spent on the
CPU; with `skip` both leave without MPI_Finalize (rank 0's barrier is still
pending).
"""

import os
import sys
import time

import numpy as np
from cxlmpi._pool import OP_CODES, TYPE_CODES
from mpi4py import MPI

import cxlmpi
from cxlmpi import _shim
from cxlmpi.pools.state import pool_for

mode = sys.argv[1]
if "--without-library" in sys.argv:
    _shim._without_library()
plain = MPI.COMM_WORLD
comm = cxlmpi.wrap(plain.Dup())
rank = comm.Get_rank()
data = np.arange(1 << 15, dtype=np.float64) + rank
got = np.empty_like(data)
comm.Allreduce(data, got)          # sets the pool up
if rank == 0:
    wall, cpu = time.perf_counter(), time.process_time()
    try:
        comm.Allreduce(data, got)
        what = "returned"
    except cxlmpi.CXLMPITimeoutError as exc:
        what = f"raised CXLMPITimeoutError {exc}"
    share = (time.process_time() - cpu) / (time.perf_counter() - wall)
    what += f" cpu share {share:.2f}"
else:
    pool_for(comm).reduce(data.ctypes.data, got.ctypes.data, data.size, 8,
                          OP_CODES["SUM"], TYPE_CODES["f64"], -1)
    what = "skipped the barrier"
    if mode == "late":
        wall, start = time.perf_counter(), time.process_time()
        while time.process_time() - start < 2.0:
            sum(range(10000))
        share = 2.0 / (time.perf_counter() - wall)
        _shim.order_calls(comm)
        what = f"made the barrier late cpu share {share:.2f}"
sys.stdout.write(f"BRANCH {rank} {what}\n")
sys.stdout.flush()
if mode == "skip":
    plain.Barrier()
    os._exit(0)
comm.Free()
