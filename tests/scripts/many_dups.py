"""Many communicators of the same ranks, each with one pool-sized call
(tests/test_alloc.py, on a small /dev/shm): MANY_DUPS Dups of COMM_WORLD,
all kept alive, each with one 64 KiB Allreduce compared with the plain
communicator's on the same data.  Stock MPI runs there with a few MiB of
/dev/shm; a communicator's pool must cost in proportion to what it
carries.  Rank 0 prints ``DUPS <json>``: whether every result equals
stock's, the most /dev/shm any rank saw the job's Dups take (MiB), and the
Allreduce calls that went through the pool and to MPI (all ranks)."""

from __future__ import annotations

import json
import os

import numpy as np
from mpi4py import MPI

import cxlmpi

world = MPI.COMM_WORLD
plain = MPI.Intracomm(world)
rank = world.Get_rank()


def used_mib() -> float:
    fs = os.statvfs("/dev/shm")
    return (fs.f_blocks - fs.f_bfree) * fs.f_frsize / (1 << 20)


before = used_mib()
plain.Barrier()
ok = True
dups = []
for it in range(int(os.environ["MANY_DUPS"])):
    comm = cxlmpi.wrap(world.Dup())
    dups.append(comm)
    a = np.random.default_rng([it, rank]).standard_normal(8192)   # 64 KiB
    got, want = np.empty_like(a), np.empty_like(a)
    comm.Allreduce(a, got)
    plain.Allreduce(a, want)
    ok &= bool(np.array_equal(got, want))
plain.Barrier()
taken = used_mib() - before
stats = cxlmpi.stats()["allreduce"]
found = plain.gather((ok, taken, int(stats["pool_calls"]), int(stats["passthrough_calls"])))
for comm in dups:
    comm.Free()
if rank == 0:
    print("DUPS " + json.dumps({"ok": all(f[0] for f in found),
                                "taken_mib": max(f[1] for f in found),
                                "pool": sum(f[2] for f in found),
                                "mpi": sum(f[3] for f in found)}), flush=True)
