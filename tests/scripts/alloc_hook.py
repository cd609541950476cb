"""Run under ``python -m cxlmpi [--alloc]``: NumPy's own allocations of
large arrays land in the pool (or not), collectives on them agree with
stock MPI, and they outlive a freed communicator.  Rank 0 prints
``ALLOC <json>`` with every rank's findings."""

from __future__ import annotations

import json

import numpy as np
from mpi4py import MPI

import cxlmpi
from cxlmpi.resident import alloc

world = MPI.COMM_WORLD                       # patched by python -m cxlmpi
plain = MPI.Intracomm(world)
rank, size = world.Get_rank(), world.Get_size()
n = 1 << 18                                  # 2 MiB of float64

a = np.arange(n, dtype=np.float64) * (rank + 1)   # NumPy's allocations ...
b = np.zeros(n)
small = np.ones(16)
got = {"active": alloc.active(), "a_in_pool": cxlmpi.is_resident(a, comm=world),
       "b_in_pool": cxlmpi.is_resident(b, comm=world),
       "small_in_pool": cxlmpi.is_resident(small, comm=world)}
want = np.empty(n)
plain.Allreduce(a, want)
world.Allreduce(a, b)                        # ... in the zero-copy path
got["allreduce_ok"] = bool(np.array_equal(b, want))
c = a * 2                                    # temporaries too
root = size - 1
world.Bcast(c, root)
got["bcast_ok"] = bool(np.array_equal(c, np.arange(n) * 2.0 * size))
dup = world.Dup()                            # a derived communicator ...
d = np.ones(n)
zc = cxlmpi.stats()["allreduce"]["zerocopy_calls"]
dup.Allreduce(MPI.IN_PLACE, d)               # ... uses NumPy's arrays in place too
got["dup_in_pool"] = cxlmpi.is_resident(d, comm=dup)
got["dup_zerocopy"] = cxlmpi.stats()["allreduce"]["zerocopy_calls"] - zc
dup.Free()
d += 1
got["after_free_ok"] = bool(np.all(d == size + 1))
stats = alloc.stats()
got["pool_allocs"] = stats["pool_allocs"]
del a, b, c, d, want
# NumPy's arrays may take the whole arena (7/8 of it here), not a share
arena = alloc.stats()["arena_bytes"]
many = [np.ones(1 << 19) for _ in range(arena * 7 // 8 // (4 << 20))] if arena else []
got["arena_bytes"] = arena
got["most_of_arena_in_pool"] = bool(many) and all(cxlmpi.is_resident(x) for x in many)
del many
got["live_after_del"] = alloc.stats()["live_arrays"]
everyone = plain.gather(got, root=0)
if rank == 0:
    print("ALLOC " + json.dumps(everyone), flush=True)
