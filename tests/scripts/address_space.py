"""Run under ``ulimit -v`` (tests/test_alloc.py): a job whose address space
is too small for the node heap (CXLMPI_ARENA_SIZE per rank, times the
ranks) -- and, with a large CXLMPI_POOL_SIZE, for the pool too -- that
stock MPI runs.  8 MiB Allreduces and Bcasts, and a Bcast of a
cxlmpi.empty array, compared with the plain communicator's on the same
data (ASPACE_STOCK=1: the stock job, no cxlmpi at all).  Rank 0 prints
``ASPACE <json>`` with every rank's findings (its Allreduce calls through
the pool and to MPI)."""

from __future__ import annotations

import json
import os

import numpy as np
from mpi4py import MPI

stock = os.environ.get("ASPACE_STOCK") == "1"
if not stock:
    import cxlmpi

world = MPI.COMM_WORLD                       # patched by python -m cxlmpi
plain = MPI.Intracomm(world)
rank, size = world.Get_rank(), world.Get_size()
n = 1 << 20                                  # 8 MiB of float64
ok = True
for it in range(3):
    a = np.random.default_rng([it, rank]).standard_normal(n)
    got, want = np.empty(n), np.empty(n)
    world.Allreduce(a, got)
    plain.Allreduce(a, want)
    ok &= bool(np.array_equal(got, want))
    c = np.empty(n) if stock else cxlmpi.empty(n, comm=world)
    c[:] = a
    world.Bcast(c, it % size)
    d = a.copy()
    plain.Bcast(d, it % size)
    ok &= bool(np.array_equal(c, d))
stats = {} if stock else cxlmpi.stats()["allreduce"]
everyone = plain.gather({"ok": ok, "pool": int(stats.get("pool_calls", 0)),
                         "mpi": int(stats.get("passthrough_calls", 0))}, root=0)
if rank == 0:
    print("ASPACE " + json.dumps(everyone), flush=True)
