"""Posted calls of classes that no call has settled (adaptive selection).

    mpiexec -n N python tests/scripts/unsettled.py

A posted call cannot time its paths (its ranks do not meet), so where its
class has settled none, the builtin windows decide (as for a communicator
without routes) and a pool call runs the class's likeliest variant (the
selector's first pool candidate).  On a fresh communicator, with only
posted calls of each class: Ibcast of 1 MiB (the builtin window of Bcast
starts at 16 MiB) goes to MPI; Iallreduce of 1 MiB takes the pool with
its likeliest variant, also while a timed run of another variant is in
flight for its class; Iallgather takes the pool below the builtin
window's 512 KiB (all blocks together) and MPI above.  Every result is
compared with stock's.  Rank 0 prints one line ``RESULT {json}``.
"""

from __future__ import annotations

import json

import numpy as np
from mpi4py import MPI
from posting import ready

import cxlmpi
from cxlmpi import _shim, config, select

world = MPI.COMM_WORLD
rank, size = world.Get_rank(), world.Get_size()
plain = world.Dup()
problems: list[str] = []
comm = ready(cxlmpi.wrap(world.Dup()))
routes = _shim.states[comm.handle].routes


def data(n: int) -> np.ndarray:
    return (np.arange(n) % 13 + rank + 1).astype(np.float64)


def posted(what: str, req, name: str, total: int, want_pool: bool) -> None:
    record = getattr(req, "_record", None)
    if (record is not None) != want_pool:
        problems.append(f"{what}: {'MPI' if record is None else 'the pool'} took it, "
                        f"not {'the pool' if want_pool else 'MPI'}")
    elif record is not None:
        which = config.COLLECTIVES.index(name)
        likely = routes.selector.likely(which, select.size_class(total), 0)
        if record.op.flags != likely - 1:
            problems.append(f"{what}: ran {select.code_name(1 + record.op.flags)}, not "
                            f"the likeliest {select.code_name(likely)}")


def check(what: str, got, want) -> None:
    if not np.array_equal(got, want):
        problems.append(f"{what}: rank {rank} differs from stock")


n = (1 << 20) // 8
buf = data(n) if rank == 0 else np.zeros(n)
want = data(n) if rank == 0 else np.zeros(n)
plain.Bcast(want, 0)
req = comm.Ibcast(buf, 0)
posted("Ibcast 1 MiB", req, "bcast", n * 8, False)
req.Wait()
check("Ibcast 1 MiB", buf, want)

a, got, want = data(n), np.zeros(n), np.zeros(n)
plain.Allreduce(a, want)
req = comm.Iallreduce(a, got)
posted("Iallreduce 1 MiB", req, "allreduce", n * 8, True)
req.Wait()
check("Iallreduce 1 MiB", got, want)

# A timed run of another variant in flight for the class (a blocking call's
# learning): posted calls keep what the policy settled (none here: the
# likeliest variant), never the run's candidate.
allreduce, sc = config.COLLECTIVES.index("allreduce"), select.size_class(n * 8)
routes.start_run(allreduce, sc, 0, 1 + select.RSAG, 1 << 62)
got = np.zeros(n)
req = comm.Iallreduce(a, got)
posted("Iallreduce 1 MiB beside a timed run", req, "allreduce", n * 8, True)
req.Wait()
check("Iallreduce 1 MiB beside a timed run", got, want)

for block, in_window in ((1 << 13, True), (1 << 16, False)):   # 64 KiB, 512 KiB a rank
    a, got, want = data(block), np.zeros(block * size), np.zeros(block * size)
    plain.Allgather(a, want)
    req = comm.Iallgather(a, got)
    posted(f"Iallgather {block * 8 >> 10} KiB", req, "allgather", block * 8 * size, in_window)
    req.Wait()
    check(f"Iallgather {block * 8 >> 10} KiB", got, want)

comm.Free()
rows = _shim.nonblocking_rows()
problems = [p for ps in plain.allgather(problems) for p in ps]
if rank == 0:
    print("RESULT " + json.dumps({"ok": not problems, "problems": problems[:10],
                                  "by": {k: r[0] for k, r in rows.items() if r[0]},
                                  "passed": {k: r[1] for k, r in rows.items() if r[1]}}),
          flush=True)
