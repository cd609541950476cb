"""The node heap's partition handed to another job while its own job still
uses it (what a claimer on another host does to a job that stood still past
its lease; here rank 0 plays that claimer between two calls), the pool's
own partition left alone: a pool call on arrays in the heap (used in place)
stops with an error on every rank before it reads or writes them, a new
pool-resident array is refused with the same story (its wipe would write
there), and the other job's bytes stay as they were (tests/test_liveness.py).

    CXLMPI_POOL=file:PATH mpiexec -n 2 python -m mpi4py handed_heap.py

Prints ``RESULT {"before": bool, "errors": [...], "allocations": [...],
"intact": bool}`` on rank 0: whether the pool call before the handover
equals stock MPI's, each rank's error of the one after it and of
cxlmpi.empty, whether the other job's bytes are intact.
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
small = np.ones(4)
comm.Allreduce(small.copy(), small)       # sets the pool (and the node heap) up
n = 1 << 15
data = cxlmpi.empty(n)
got = cxlmpi.empty(n)
data[:] = np.arange(n) * (rank + 1)
comm.Allreduce(data, got)
want = np.empty(n)
world.Allreduce(np.asarray(data), want)
before = bool(np.array_equal(got, want))
heap = pool_state(comm).heap
assert heap is not pool_state(comm), "the pool shares a node heap"
offset = heap.file_offset
nbytes = hand_over(world, offset)
error = None
try:
    comm.Allreduce(data, got)
except cxlmpi.CXLMPIError as exc:
    error = f"{type(exc).__name__}: {exc}"
fresh = None
try:
    cxlmpi.empty(1 << 12)   # (its wipe would write there)
except cxlmpi.CXLMPIError as exc:
    fresh = f"{type(exc).__name__}: {exc}"
kept = intact(world, offset, nbytes)
everyone = world.gather((before, error, fresh), root=0)
if rank == 0:
    print("RESULT " + json.dumps({"before": all(e[0] for e in everyone),
                                  "errors": [e[1] for e in everyone],
                                  "allocations": [e[2] for e in everyone],
                                  "intact": kept}), flush=True)
