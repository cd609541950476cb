"""Across pool groups, what one group meets at a header step every group
learns (run with CXLMPI_POOL_GROUPS=2, adaptive selection, 4 ranks):

1. A header step whose report differs on rank 0 only (as a selector out of
   step would publish): every rank raises a mismatch -- before, rank 0's
   group raised and the other group's leader waited in MPI for ever.
2. The communicator still works: an Allreduce equals stock's.
3. The last rank (not a leader) gives its first Bcast of a class (a learning
   call, with a header step) a derived datatype the pool does not take,
   and sends the call to MPI: every rank follows it there, and every
   rank's result equals stock's -- before, its group raised a mismatch and
   the other group hung.

Prints RESULT {"raised": [exception names per rank], "allreduce": ok,
"bcast": ok}.
"""

import json

import numpy as np
from cxlmpi._pool import PoolFailure
from mpi4py import MPI

import cxlmpi
from cxlmpi.pools.state import _fail, _states, pool_state

world = MPI.COMM_WORLD
rank, size = world.Get_rank(), world.Get_size()
comm = cxlmpi.wrap(world.Dup())
stock = MPI.Intracomm(comm)
pool = pool_state(comm)
assert type(pool).__name__ == "Hierarchy", pool

raised = "none"
try:
    pool.header(5, "Allgather", -1, 0, report=7 + (rank == 0), extra=rank)
except PoolFailure as exc:
    raised = type(_fail(comm, _states[comm.handle], exc)).__name__

a = np.arange(1000, dtype=np.float64) * (rank + 1)
got, want = np.empty_like(a), np.empty_like(a)
comm.Allreduce(a, got)
stock.Allreduce(a, want)
allreduce = bool(np.array_equal(got, want))

n = 4096                                      # int32: 16 KiB, a pool-sized Bcast
quad = MPI.INT.Create_contiguous(4).Commit()
results = []
for c in (comm, stock):
    buf = np.arange(n, dtype=np.int32) if rank == 0 else np.zeros(n, np.int32)
    c.Bcast([buf, n // 4, quad] if rank == size - 1 else buf, root=0)
    results.append(buf)
quad.Free()
bcast = bool(np.array_equal(*results))

everyone = world.gather((raised, allreduce, bcast), root=0)
if rank == 0:
    print("RESULT " + json.dumps({"raised": [e[0] for e in everyone],
                                  "allreduce": all(e[1] for e in everyone),
                                  "bcast": all(e[2] for e in everyone)}), flush=True)
