"""A pool whose ranks cannot all open its unnamed segment through the
creator's /proc (run with rank 1 in a pid namespace of its own:
tests/test_reliability.py): the creator names it for them, every rank maps
it, the Allreduce through it equals stock MPI's on the same data.

Prints ``RESULT {"locators": [...], "pids": [...], "ok": bool,
"pool_calls": [...]}`` on rank 0: the locator each rank mapped the segment
by (a name after the fallback), each rank's pid as it sees it.
"""

import json
import os

import numpy as np
from mpi4py import MPI

import cxlmpi
from cxlmpi.pools.state import pool_state

world = MPI.COMM_WORLD
comm = cxlmpi.wrap(world.Dup())
data = np.arange(4096, dtype=np.float64) * (world.Get_rank() + 1)
got, want = np.empty_like(data), np.empty_like(data)
comm.Allreduce(data, got)
MPI.Intracomm(comm).Allreduce(data, want)
pool = pool_state(comm)
mine = (pool.locator, os.getpid(), bool(np.array_equal(got, want)),
        cxlmpi.stats()["allreduce"]["pool_calls"])
everyone = world.gather(mine, root=0)
comm.Free()
if world.Get_rank() == 0:
    print("RESULT " + json.dumps({"locators": [e[0] for e in everyone],
                                  "pids": [e[1] for e in everyone],
                                  "ok": all(e[2] for e in everyone),
                                  "pool_calls": [e[3] for e in everyone]}), flush=True)
