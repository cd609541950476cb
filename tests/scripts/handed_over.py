"""A partition handed to another job while its own job still uses it (what
a claimer on another host does to a job that stood still past its lease;
here rank 0 plays that claimer between two calls): every rank's next pool
call stops with an error before it writes anything, the calls it sends to
MPI write nothing into the pool either, the other job's bytes stay as it
wrote them, and the job ends cleanly (tests/test_liveness.py).

    CXLMPI_POOL=file:PATH mpiexec -n 2 python -m mpi4py handed_over.py

(``-m mpi4py``: a rank that fails aborts the job instead of leaving the
other in a barrier.)  Prints ``RESULT {"errors": [...], "small": [...],
"untouched": [...], "intact": bool}`` on rank 0: each rank's error of the
pool Allreduce after the handover, whether its small Allreduce (sent to
MPI) equals stock MPI's, whether the pool call left its receive buffer as
it was.
"""

import json

import numpy as np
from claimer import hand_over, intact
from mpi4py import MPI

import cxlmpi
from cxlmpi.pools.state import pool_state

world = MPI.COMM_WORLD
rank = world.Get_rank()
comm = cxlmpi.wrap(world.Dup())
data = np.arange(1 << 14, dtype=np.float64) * (rank + 1)
got = np.empty_like(data)
comm.Allreduce(data, got)                 # sets the pool up
pool = pool_state(comm)
offset = pool.file_offset
nbytes = hand_over(world, offset)
# a call below the pool's threshold goes to MPI (and used to mark the pool)
small, small_stock = np.empty(4), np.empty(4)
comm.Allreduce(data[:4] + 1, small)
world.Allreduce(data[:4] + 1, small_stock)
before = np.full_like(data, -1.0)
got[:] = before
error = None
try:
    comm.Allreduce(data + 1, got)
except cxlmpi.CXLMPIError as exc:
    error = f"{type(exc).__name__}: {exc}"
untouched = bool(np.array_equal(got, before))
kept = intact(world, offset, nbytes)
everyone = world.gather((error, bool(np.array_equal(small, small_stock)), untouched), root=0)
if rank == 0:
    print("RESULT " + json.dumps({"errors": [e[0] for e in everyone],
                                  "small": [e[1] for e in everyone],
                                  "untouched": [e[2] for e in everyone],
                                  "intact": kept}), flush=True)
