"""Run under ``ulimit -v`` (tests/test_alloc.py): a job whose address space
is too small for the node heap (CXLMPI_ARENA_SIZE per rank, times the
ranks) -- and, with a large CXLMPI_POOL_SIZE, for the pool too -- that
stock MPI runs.  8 MiB Allreduces and Bcasts, and a Bcast of a
cxlmpi.empty array, compared with the plain communicator's on the same
data.  Rank 0 prints ``ASPACE <json>`` with every rank's findings (its
Allreduce calls through the pool and to MPI)."""

from __future__ import annotations

import json

import numpy as np
from mpi4py import MPI

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
    c = cxlmpi.empty(n, comm=world)
    c[:] = a
    world.Bcast(c, it % size)
    d = a.copy()
    plain.Bcast(d, it % size)
    ok &= bool(np.array_equal(c, d))
stats = cxlmpi.stats()["allreduce"]
everyone = plain.gather({"ok": ok, "pool": int(stats["pool_calls"]),
                         "mpi": int(stats["passthrough_calls"])}, root=0)
if rank == 0:
    print("ASPACE " + json.dumps(everyone), flush=True)
