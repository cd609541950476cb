"""A hierarchy whose multi-rank group's pool finds no room while a group of
one shares no node heap (tests/test_alloc.py, 3 ranks, CXLMPI_POOL_GROUPS=2,
CXLMPI_POOL_SIZE beyond /dev/shm, a small CXLMPI_ARENA_SIZE).

    mpiexec -n 3 python groups_short.py

Groups [0, 1] (with the node heap) and [2] (a group of one: no heap, so
arenas of its own were asked for); the pool of [0, 1] cannot be had.
Every rank must reach the same verdict (MPI alone) and the Allreduces must
equal stock MPI's on the same data.  Rank 0 prints GROUPS {"ok": results
equal stock's, "pool": Allreduce calls through the pool, "mpi": passed}.
"""

import json

import numpy as np
from mpi4py import MPI

import cxlmpi

world = MPI.COMM_WORLD
rank = world.Get_rank()
comm = cxlmpi.wrap(world.Dup())
stock = MPI.Intracomm(comm)
ok = True
for k in range(3):
    data = np.arange(1 << 17, dtype=np.float64) * (rank + 1) + k
    got, want = np.empty_like(data), np.empty_like(data)
    comm.Allreduce(data, got)
    stock.Allreduce(data, want)
    ok &= bool(np.array_equal(got, want))
row = cxlmpi.stats()["allreduce"]
ok = all(world.allgather(ok))
comm.Free()
if rank == 0:
    print("GROUPS " + json.dumps({"ok": ok, "pool": int(row["pool_calls"]),
                                  "mpi": int(row["passthrough_calls"])}), flush=True)
