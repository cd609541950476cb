"""Run under ``python -m cxlmpi --alloc`` with /dev/shm far smaller than the
job's arrays (a container's 64 MiB): 32 MiB arrays, collectives on them
compared with the plain communicator's on the same data.  Never SIGBUS:
what the pool cannot reserve falls back to private memory (or the pool to
MPI).  Rank 0 prints ``SMALL <json>`` with every rank's findings."""

from __future__ import annotations

import json

import numpy as np
from mpi4py import MPI

import cxlmpi

world = MPI.COMM_WORLD                       # patched by python -m cxlmpi
plain = MPI.Intracomm(world)
rank, size = world.Get_rank(), world.Get_size()
n = 4 << 20                                  # 32 MiB of float64
ok = True
for it in range(3):
    a = np.random.default_rng([it, rank]).standard_normal(n)
    b = np.empty(n)
    want = np.empty(n)
    world.Allreduce(a, b)
    plain.Allreduce(a, want)
    ok &= bool(np.allclose(b, want, rtol=1e-12, atol=1e-12))
    c = cxlmpi.empty(n, comm=world)          # explicit pool arrays too
    c[:] = a
    world.Bcast(c, it % size)
    d = a.copy()
    plain.Bcast(d, it % size)
    ok &= bool(np.array_equal(c, d))
    del a, b, c, d, want
everyone = plain.gather({"ok": ok}, root=0)
if rank == 0:
    print("SMALL " + json.dumps(everyone), flush=True)
