"""cxlmpi.wrap(COMM_WORLD) is no collective step: rank 0 wraps it and
sends to rank 1 before a plain broadcast, rank 1 receives and broadcasts
first and wraps afterwards.  Then an Allreduce on the wrapped COMM_WORLD
(its first collective, where the settings are checked) against the plain
one's on the same data.  Rank 0 prints ``ORDER <json>``."""

from __future__ import annotations

import json

import numpy as np
from mpi4py import MPI

import cxlmpi

world = MPI.COMM_WORLD
rank = world.Get_rank()
if rank == 0:
    comm = cxlmpi.wrap(world)
    comm.send(b"before", dest=1, tag=5)
    got_bcast = world.bcast("plain", root=0)
else:
    got_send = world.recv(source=0, tag=5) if rank == 1 else b"before"
    got_bcast = world.bcast(None, root=0)
    comm = cxlmpi.wrap(world)
a = np.random.default_rng([3, rank]).standard_normal(1 << 18)
got, want = np.empty_like(a), np.empty_like(a)
comm.Allreduce(a, got)
world.Allreduce(a, want)
ok = bool(np.array_equal(got, want)) and got_bcast == "plain"
everyone = world.gather(ok, root=0)
if rank == 0:
    print("ORDER " + json.dumps(everyone), flush=True)
