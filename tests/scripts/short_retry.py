"""A communicator whose pool's data halves find no room on a small, mostly
full /dev/shm (tests/test_alloc.py: a 64 MiB tmpfs with a 40 MiB filler,
CXLMPI_POOL_SIZE=32M, CXLMPI_ARENA_SIZE=0, CXLMPI_TUNING=pool).

    mpiexec -n 2 python short_retry.py

CALLS 1 MiB Allreduces and Bcasts on a Dup, each compared with the plain
communicator's on the same (changing) data.  The first call's ready step
finds no room on any rank, and every later call goes to MPI without
another.  Rank 0 prints SHORT [per rank: {"ok": results equal stock's,
"ready_steps": reservations of data halves tried, "refused": of those,
refused before fallocate (the tmpfs had not the room), "pool": calls
through the pool}].
"""

import json

import numpy as np
from mpi4py import MPI

import cxlmpi
from cxlmpi import _pool

CALLS = 20
world = MPI.COMM_WORLD
rank = world.Get_rank()
comm = cxlmpi.wrap(world.Dup())
stock = MPI.Intracomm(comm)
ok = True
for k in range(CALLS):
    data = np.arange(1 << 17, dtype=np.float64) * (rank + 1) + k
    got, want = np.empty_like(data), np.empty_like(data)
    comm.Allreduce(data, got)
    stock.Allreduce(data, want)
    ok &= bool(np.array_equal(got, want))
    got = data.copy() if rank == k % 2 else np.zeros_like(data)
    want = got.copy()
    comm.Bcast(got, root=k % 2)
    stock.Bcast(want, root=k % 2)
    ok &= bool(np.array_equal(got, want))
stats = cxlmpi.stats()
mine = dict(_pool.reserve_counts(), ok=ok,
            pool=int(stats["allreduce"]["pool_calls"] + stats["bcast"]["pool_calls"]))
comm.Free()
everyone = world.gather(mine)
if rank == 0:
    print("SHORT " + json.dumps(everyone), flush=True)
