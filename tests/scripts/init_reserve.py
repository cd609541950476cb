"""A persistent collective's *_init reserves the pool's data memory only
where some rank's plan would take the pool (tests/test_nonblocking.py).
On a fresh communicator (its pool set up by the first *_init, no data
memory yet): a Barrier_init (MPI's, always) and an Allreduce_init below
the posted calls' threshold reserve none -- before, every *_init reserved the data halves
(64 MiB of /dev/shm by default) whatever its size --; an Allreduce_init
above it reserves them, and the pool takes its runs.  Each request is
started three times, its values against stock MPI's blocking call.

    mpiexec -n N python init_reserve.py

Rank 0 prints ``RESULT {"ok": ..., "problems": [...], "steps": {case:
reservations made}, "taken": {case: runs the pool took}, "by": {collective:
posted calls the pool took}}``.
"""

from __future__ import annotations

import json

import numpy as np
from mpi4py import MPI

import cxlmpi
from cxlmpi import _pool, _shim, config

world = MPI.COMM_WORLD
rank = world.Get_rank()
plain = world.Dup()
problems: list[str] = []
floor = config.get().nonblocking_threshold


def counts() -> tuple[int, int]:
    """(reservations of data halves, posted runs the pool took) so far."""
    return (_pool.reserve_counts()["ready_steps"],
            sum(r[0] for r in _shim.nonblocking_rows().values()))


comm = cxlmpi.wrap(world.Dup())
steps: dict[str, int] = {}
taken: dict[str, int] = {}
for case, nbytes in (("Barrier_init", 0), ("small Allreduce_init", 64),
                     ("large Allreduce_init", floor + 64)):
    before = counts()
    n = nbytes // 8
    a = (np.arange(n) % 101 + rank).astype(np.float64)
    b, want = np.zeros(n), np.zeros(n)
    req = comm.Barrier_init() if nbytes == 0 else comm.Allreduce_init(a, b)
    for run in range(3):
        a += run
        req.Start()
        req.Wait()
        if nbytes:
            plain.Allreduce(a, want)
            if not np.array_equal(b, want):
                problems.append(f"{case}, run {run}: rank {rank}'s values differ from stock")
    req.Free()
    after = counts()
    steps[case], taken[case] = after[0] - before[0], after[1] - before[1]
comm.Free()

problems = [p for ps in plain.allgather(problems) for p in ps]
everyone = plain.gather((steps, taken), root=0)
if rank == 0:
    same = all(e == everyone[0] for e in everyone)
    by = {k: r[0] for k, r in _shim.nonblocking_rows().items() if r[0]}
    print("RESULT " + json.dumps({"ok": not problems and same, "problems": problems[:10],
                                  "steps": steps, "taken": taken, "by": by}), flush=True)
