"""A pool that /dev/shm has no room for while a freed communicator's pool
is kept for reuse (tests/test_alloc.py, on a 64 MiB /dev/shm, with
CXLMPI_POOL_SIZE=40M and CXLMPI_TUNING=pool).

    mpiexec -n 2 python spare_room.py

A Dup's pool is set up and the Dup freed (its pool kept: 40 MiB); then a
communicator of the same ranks in the other order (another membership:
the kept pool cannot serve it) needs a pool of its own, which fits only
once the kept one is let go.  Rank 0 prints SPARE {"ok": results equal
stock's, "pool": Allreduce calls through the pool}.
"""

import json

import numpy as np
from mpi4py import MPI

import cxlmpi

world = MPI.COMM_WORLD
rank, size = world.Get_rank(), world.Get_size()
data = np.arange(1 << 16, dtype=np.float64) * (rank + 1)
want = np.empty_like(data)
world.Allreduce(data, want)
ok = True
first = cxlmpi.wrap(world.Dup())
got = np.empty_like(data)
first.Allreduce(data, got)
ok &= bool(np.array_equal(got, want))
first.Free()
other = cxlmpi.wrap(world.Split(0, size - rank))      # the ranks in the other order
got = np.empty_like(data)
other.Allreduce(data, got)
ok &= bool(np.array_equal(got, want))
other.Free()
pool = int(cxlmpi.stats()["allreduce"]["pool_calls"])
ok = all(world.allgather(ok))
if rank == 0:
    print("SPARE " + json.dumps({"ok": ok, "pool": pool}), flush=True)
