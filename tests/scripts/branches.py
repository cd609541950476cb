"""A rank that leaves a pool collective on another branch than its peers
(tests/test_branches.py): here, a timeout on one rank only -- rank 1 is
slower than rank 0's CXLMPI_TIMEOUT.  Stock MPI would just wait for it;
every rank must end the call (raising, clearly) well before its own
timeout, and MPI must still work.

    mpiexec -n N python branches.py late|groups|fold

late    2 ranks, one pool.  Rank 0 (CXLMPI_TIMEOUT=2) times out in a large
        Allreduce while rank 1 (CXLMPI_TIMEOUT=60) sleeps 4 s before it.
groups  3 ranks, CXLMPI_POOL_GROUPS=2 (groups {0, 1} and {2}): the same,
        ranks 0 and 2 with CXLMPI_TIMEOUT=2; rank 2, the other group's
        leader, waits for rank 0 in the leaders' MPI step.
fold    2 ranks, CXLMPI_OBJECTS=1: an object allreduce whose fold raises on
        rank 0 (arrays of two shapes), which then goes on to a Barrier
        (MPI) while rank 1 waits in the pool step of the allreduce's
        broadcast; rank 1 must say that the calls do not match (stock MPI
        leaves it in MPI_Bcast for ever), not that rank 0 died.

Each rank prints ``BRANCH <rank> <error class or ok> <seconds in the call>
<message>`` and, after an MPI Allreduce on COMM_WORLD, ``MPI <rank> <sum>``.
"""

import os
import sys
import time

from mpi4py import MPI

mode = sys.argv[1]
world = MPI.COMM_WORLD
rank = world.Get_rank()
os.environ["CXLMPI_TIMEOUT"] = "60" if rank == 1 else "2"
os.environ["CXLMPI_TUNING"] = "pool"
os.environ["CXLMPI_CACHE"] = "off"
if mode == "groups":
    os.environ["CXLMPI_POOL_GROUPS"] = "2"
if mode == "fold":
    os.environ["CXLMPI_OBJECTS"] = "1"

import numpy as np  # noqa: E402

import cxlmpi  # noqa: E402

comm = cxlmpi.wrap(world.Dup())
data = np.ones(1 << 15)
got = np.empty_like(data)
comm.Allreduce(data, got)          # sets the pool up
if rank == 1 and mode != "fold":
    time.sleep(4)
t0 = time.monotonic()
try:
    if mode == "fold":
        comm.allreduce(np.ones(4096 + rank))
    else:
        comm.Allreduce(data, got)
    what = "ok -"
except (cxlmpi.CXLMPIError, ValueError) as exc:
    what = f"{type(exc).__name__} {exc}"
if mode == "fold":
    comm.Barrier()
seconds = time.monotonic() - t0
sys.stdout.write(f"BRANCH {rank} {what.split()[0]} {seconds:.2f} {what.split(' ', 1)[1]}\n")
sys.stdout.flush()
total = np.zeros(1)
world.Allreduce(np.ones(1), total)
sys.stdout.write(f"MPI {rank} {total[0]:g}\n")
sys.stdout.flush()
