"""Run under ``python -m cxlmpi`` with CXLMPI_POOL=file:/dev/shm/... on a
small /dev/shm: after MPI_Init rank 0 fills /dev/shm (as another process
of the container would), leaving FULL_SHM_LEAVE bytes; with FULL_SHM=later
a communicator's pool is made first, so the pool file and its partition
table exist before it fills.  Then Allreduces on a new communicator,
compared with the plain communicator's on the same data: the pool cannot
be had, and the job must go on through MPI (never SIGBUS).  Rank 0 prints
``FULL <json>`` with every rank's findings."""

from __future__ import annotations

import json
import os

import numpy as np
from mpi4py import MPI

world = MPI.COMM_WORLD                       # patched by python -m cxlmpi
plain = MPI.Intracomm(world)
rank = world.Get_rank()
n = 1 << 18                                  # 2 MiB of float64: the pool's
ok = True


def check(comm: MPI.Intracomm, seed: int) -> bool:
    a = np.random.default_rng([seed, rank]).standard_normal(n)
    got, want = np.empty(n), np.empty(n)
    comm.Allreduce(a, got)
    plain.Allreduce(a, want)
    return bool(np.array_equal(got, want))


plain.Split_type(MPI.COMM_TYPE_SHARED).Free()   # MPI's own shared memory in use
check(plain, 0)                              # (Open MPI faults its pages in lazily)
if os.environ["FULL_SHM"] == "later":
    first = world.Dup()
    ok &= check(first, 0)                    # the table and a partition exist
filler = "/dev/shm/full_shm_filler"
if rank == 0:
    with open(filler, "wb") as f:            # fill it up...
        block = b"\1" * (1 << 20)
        try:
            while True:
                f.write(block)
                f.flush()
        except OSError:
            pass
    size = os.path.getsize(filler)           # ... but for a few pages
    os.truncate(filler, max(0, size - size % 4096 - int(os.environ["FULL_SHM_LEAVE"])))
plain.Barrier()
comm = world.Dup()
for it in range(1, 4):
    ok &= check(comm, it)
plain.Barrier()
if rank == 0:
    os.unlink(filler)
everyone = plain.gather({"ok": ok}, root=0)
if rank == 0:
    print("FULL " + json.dumps(everyone), flush=True)
