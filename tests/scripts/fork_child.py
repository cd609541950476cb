"""Run under ``python -m cxlmpi --alloc`` (any pool): a child made by
``os.fork()`` (as multiprocessing's fork start method makes them) allocates,
frees inherited pool arrays and closes the pools, and the parent's arrays,
arena and control lines are untouched.  Rank 0 prints ``FORK <json>`` with
every rank's findings."""

from __future__ import annotations

import json
import os

import numpy as np
from mpi4py import MPI

import cxlmpi
from cxlmpi.memory import backends
from cxlmpi.pools.state import _close_at_exit
from cxlmpi.resident import alloc, arrays

world = MPI.COMM_WORLD                       # patched by python -m cxlmpi
plain = MPI.Intracomm(world)
rank, size = world.Get_rank(), world.Get_size()
n = 1 << 17                                  # 1 MiB of float64
inherited = np.arange(n, dtype=np.float64)   # in the pool (NumPy hook)
resident = cxlmpi.empty(n, comm=world)
resident[:] = rank
got = {"hooked": alloc.active() and cxlmpi.is_resident(inherited, comm=world)}

go_read, go_write = os.pipe()
done_read, done_write = os.pipe()
pid = os.fork()
if pid == 0:                                 # the child: no MPI here
    os.close(go_write)
    os.close(done_read)
    os.read(go_read, 1)                      # the parent has allocated
    mine = np.full(n, 7.0)                   # the hook: private memory here
    other = cxlmpi.empty(n, comm=world)      # a plain numpy array here
    other[:] = 7
    report = {"child_hook_private": not cxlmpi.is_resident(mine, comm=world),
              "child_empty_private": not cxlmpi.is_resident(other, comm=world),
              "child_sees_inherited": bool(np.array_equal(inherited, np.arange(n)))}
    del inherited, resident                  # frees of the parent's blocks: no-ops
    alloc.disable()
    _close_at_exit()                         # what exiting would do: must not detach
    os.write(done_write, json.dumps(report).encode())
    os._exit(0)
os.close(go_read)
os.close(done_write)
later = np.full(n, 1.0)                      # the parent's next pool arrays
later_resident = cxlmpi.empty(n, comm=world)
later_resident[:] = 1
os.write(go_write, b"x")
with os.fdopen(done_read, "rb") as f:
    got.update(json.loads(f.read() or b"{}"))
os.waitpid(pid, 0)
got["parent_arrays_intact"] = bool(np.all(later == 1) and np.all(later_resident == 1)
                                   and np.array_equal(inherited, np.arange(n))
                                   and np.all(resident == rank))
got["later_in_pool"] = bool(cxlmpi.is_resident(later, comm=world)
                            and cxlmpi.is_resident(later_resident, comm=world))
pool = arrays.arena_pool(world)
spec = backends.parse_spec(os.environ.get("CXLMPI_POOL", "shm"))
if pool is not None and spec.shared_file:    # both ranks still attached
    dev = backends.open_device(spec)
    entry = int(pool.name.rsplit("#", 1)[1])
    [e] = [e for e in dev.entries() if e["index"] == entry]
    got["attached"] = dev.attached_ranks(e["offset"], e["nranks"])
total = np.empty(n)
world.Allreduce(later * (rank + 1), total)   # still works, and equals stock
want = np.empty(n)
plain.Allreduce(later * (rank + 1), want)
got["allreduce_ok"] = bool(np.array_equal(total, want))
everyone = plain.gather(got, root=0)
if rank == 0:
    print("FORK " + json.dumps(everyone), flush=True)
