"""A posted call returns without waiting for its peers, as MPI requires
(tests/test_nonblocking.py): rank 0 posts a nonblocking collective, then
sends each peer a message that the peer receives *before* it posts the
same call -- a legal program, which stock MPI runs.  Before, a posted call
on a communicator without a pool set up (or whose data halves were not
reserved yet) waited there for its peers, who waited in MPI_Recv: the job
hung.  Each form runs on a wrapped COMM_WORLD (its first call), on a
fresh wrapped communicator, on one whose pool
is set up (a Barrier), and on one whose pool has taken posted calls (a
posted call, then a blocking one: the posted calls after it take the
pool).

    mpiexec -n N python posted_first.py

Rank 0 prints ``RESULT {"ok": ..., "problems": [...], "posted": P, "by":
{...}}``: every value against stock MPI's blocking call on a plain
communicator, and P, the posted calls the pool took (some must, where it
is ready), by collective.
"""

from __future__ import annotations

import json

import numpy as np
from mpi4py import MPI

import cxlmpi
from cxlmpi import _shim

world = MPI.COMM_WORLD
rank, size = world.Get_rank(), world.Get_size()
plain = world.Dup()
problems: list[str] = []
N = 1 << 15


def data(k: int) -> np.ndarray:
    return (np.arange(N) % 1013 + 7 * rank + k).astype(np.float64)


def posted_then_sent(comm: MPI.Intracomm, label: str) -> None:
    """Rank 0 posts, then sends; the others receive, then post."""
    token = np.zeros(1)
    a, b, c = data(1), data(2), np.zeros(N)
    counts = [N // 2 + q for q in range(size)]
    v_out = np.zeros(sum(counts))
    v_in = data(3)[:counts[rank]].copy()

    def post() -> list[MPI.Request]:
        return [comm.Iallreduce(a, c), comm.Ibcast(b, root=0), comm.Ibarrier(),
                comm.Iallgatherv(v_in, [v_out, counts])]

    if rank == 0:
        reqs = post()
        for q in range(1, size):
            comm.Send(token, dest=q, tag=11)
    else:
        comm.Recv(token, source=0, tag=11)
        reqs = post()
    MPI.Request.Waitall(reqs)
    want_c, want_b, want_v = np.zeros(N), data(2) if rank == 0 else np.empty(N), \
        np.zeros(sum(counts))
    plain.Allreduce(a, want_c)
    plain.Bcast(want_b, root=0)
    plain.Allgatherv(v_in, [want_v, counts])
    for what, got, want in (("Iallreduce", c, want_c), ("Ibcast", b, want_b),
                            ("Iallgatherv", v_out, want_v)):
        if not np.array_equal(got, want):
            problems.append(f"{label}: {what} on rank {rank} differs from stock")


for state in ("COMM_WORLD", "fresh", "set up", "taking posted calls"):
    # (a wrapped COMM_WORLD: its first collective checks that the ranks
    # agree on the settings -- the first blocking one)
    comm = cxlmpi.wrap(world if state == "COMM_WORLD" else world.Dup())
    if state in ("set up", "taking posted calls"):
        comm.Barrier()   # (its first blocking collective: the pool set up)
    if state == "taking posted calls":
        comm.Iallreduce(data(0), np.zeros(N)).Wait()   # (found the halves missing)
        comm.Barrier()   # (reserved them)
    for k in range(2):
        posted_then_sent(comm, f"{state}, round {k}")
    if comm != world:
        comm.Free()

rows = _shim.nonblocking_rows()
posted = sum(r[0] for r in rows.values())
problems = [p for ps in plain.allgather(problems) for p in ps]
if rank == 0:
    print("RESULT " + json.dumps({"ok": not problems, "problems": problems[:10],
                                  "posted": posted,
                                  "by": {k: r[0] for k, r in rows.items() if r[0]}}),
          flush=True)
