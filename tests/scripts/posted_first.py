"""A posted call returns without waiting for its peers, as MPI requires
(tests/test_nonblocking.py): rank 0 posts a nonblocking collective, then
sends each peer a message that the peer receives *before* it posts the
same call -- a legal program, which stock MPI runs.  Before, a posted call
on a communicator without a pool set up (or whose data halves were not
reserved yet, or a wrapped COMM_WORLD whose settings were not checked yet)
waited there for its peers, who waited in MPI_Recv: the job hung.

Each state below runs the pattern twice on its own communicator:

- COMM_WORLD: a wrapped COMM_WORLD, the pattern its first call;
- fresh: a fresh wrapped communicator;
- set up: its pool set up (a Barrier, its first blocking collective);
- ready by a barrier: a posted call found the pool's data halves missing,
  then a Barrier reserved them: the posted calls after it take the pool;
- ready by an object call: the same, reserved by ``comm.allreduce``;
- persistent: ``*_init`` on a fresh communicator (nonlocal in MPI: it sets
  the pool up and reserves its halves; every rank makes them first), then
  rank 0 starts them and sends.

    mpiexec -n N python posted_first.py

Rank 0 prints ``RESULT {"ok": ..., "problems": [...], "posted": P,
"by": {...}, "states": {state: calls the pool took}}``: every value
against stock MPI's blocking call on a plain communicator.
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
COUNTS = [N // 2 + q for q in range(size)]


def data(k: int) -> np.ndarray:
    return (np.arange(N) % 1013 + 7 * rank + k).astype(np.float64)


def taken() -> int:
    """The posted calls the pool took so far on this rank."""
    return sum(r[0] for r in _shim.nonblocking_rows().values())


def posted_then_sent(comm: MPI.Intracomm, label: str, persistent: bool) -> None:
    """Rank 0 posts (or starts), then sends; the others receive, then post."""
    token = np.zeros(1)
    a, b, c = data(1), data(2), np.zeros(N)
    v_out, v_in = np.zeros(sum(COUNTS)), data(3)[:COUNTS[rank]].copy()
    calls = (("Iallreduce", (a, c)), ("Ibcast", (b, 0)), ("Ibarrier", ()),
             ("Iallgatherv", (v_in, [v_out, COUNTS])))

    # (*_init is nonlocal in MPI: every rank makes them before the pattern;
    # Start is local)
    inits = [getattr(comm, name[1].upper() + name[2:] + "_init")(*args)
             for name, args in calls] if persistent else []

    def post() -> list[MPI.Request]:
        if not persistent:
            return [getattr(comm, name)(*args) for name, args in calls]
        MPI.Prequest.Startall(inits)
        return inits

    if rank == 0:
        reqs = post()
        for q in range(1, size):
            comm.Send(token, dest=q, tag=11)
    else:
        comm.Recv(token, source=0, tag=11)
        reqs = post()
    MPI.Request.Waitall(reqs)
    want_c, want_b = np.zeros(N), data(2) if rank == 0 else np.empty(N)
    want_v = np.zeros(sum(COUNTS))
    plain.Allreduce(a, want_c)
    plain.Bcast(want_b, root=0)
    plain.Allgatherv(v_in, [want_v, COUNTS])
    for what, got, want in (("Iallreduce", c, want_c), ("Ibcast", b, want_b),
                            ("Iallgatherv", v_out, want_v)):
        if not np.array_equal(got, want):
            problems.append(f"{label}: {what} on rank {rank} differs from stock")
    for req in reqs if persistent else ():
        req.Free()


states: dict[str, int] = {}
kept: list[MPI.Intracomm] = []
for state in ("COMM_WORLD", "fresh", "set up", "ready by a barrier",
              "ready by an object call", "persistent"):
    comm = cxlmpi.wrap(world if state == "COMM_WORLD" else world.Dup())
    if state.startswith(("set up", "ready")):
        comm.Barrier()   # (its first blocking collective: the pool set up)
    if state.startswith("ready"):
        send, recv = data(0), np.zeros(N)   # (held: MPI may still use them)
        comm.Iallreduce(send, recv).Wait()   # (found the halves missing)
        if state == "ready by a barrier":
            comm.Barrier()
        else:
            comm.allreduce(rank)
    before = taken()
    for k in range(2):
        posted_then_sent(comm, f"{state}, round {k}", state == "persistent")
    states[state] = taken() - before
    kept.append(comm)   # (freed at the end: a freed one's pool, ready, would be
    # taken over by the next state's communicator)
for comm in kept[1:]:
    comm.Free()

rows = _shim.nonblocking_rows()
problems = [p for ps in plain.allgather(problems) for p in ps]
if rank == 0:
    print("RESULT " + json.dumps({"ok": not problems, "problems": problems[:10],
                                  "posted": taken(), "states": states,
                                  "by": {k: r[0] for k, r in rows.items() if r[0]}}),
          flush=True)
