"""The status a posted call's request gives, against a stock generalized
request's (``MPI.Grequest``, whose query mpi4py fills: MPI's empty status,
which is what a request that carries no message reports; stock's own
nonblocking collectives leave it undefined -- MPICH fills it with internal
values).  Each pool request -- Iallreduce (no Python at its end), Ibcast of
a derived datatype (staged: its end copies back through Python),
Allreduce_init -- is completed by Wait(status), Test(status), Waitall with
statuses (beside stock point-to-point requests, whose statuses must be
stock's), mpi4py's waitall (beside stock object requests, whose messages
must be stock's), Testall with statuses, Waitany and mpi4py's waitsome one
request at a time beside stock ones, and Get_status, into statuses filled with marks first, and
compared with a stock generalized request completed the same way.  Every
result is checked against stock's on the same data.  Run under
CXLMPI_TUNING=pool (the pool takes every one).  Rank 0 prints
``STATUS <json>``: per rank, the failures found (none expected) and how
many calls the pool took."""

from __future__ import annotations

import json

import numpy as np
from mpi4py import MPI
from posting import ready

import cxlmpi

world = MPI.COMM_WORLD
rank, size = world.Get_rank(), world.Get_size()
comm = ready(cxlmpi.wrap(world.Dup()))
plain = MPI.Intracomm(comm)
N = 1 << 16       # 512 KiB of doubles: the pool's
failures: list[str] = []


def fields(status: MPI.Status) -> list:
    return [status.Get_source(), status.Get_tag(), status.Get_error(),
            status.Get_count(MPI.BYTE), status.Get_elements(MPI.BYTE), status.Is_cancelled()]


def marked() -> MPI.Status:
    """A status whose every field holds a mark (so a field left alone shows)."""
    status = MPI.Status()
    status.Set_source(12345)
    status.Set_tag(678)
    status.Set_error(MPI.ERR_OTHER)
    status.Set_elements(MPI.BYTE, 99)
    return status


def complete(request: MPI.Request, how: str) -> MPI.Status:
    """Complete `request` by `how`; the status it gave.  (Waitall: beside a
    stock receive and send, whose statuses must be stock's.)"""
    status = marked()
    if how == "Wait":
        request.Wait(status)
    elif how == "Test":
        while not request.Test(status):
            pass
    elif how == "get_status":
        while not request.Get_status(status):
            pass
        request.Wait()
    elif how == "Testall":   # (beside a stock receive and send, as Waitall)
        box, note = np.array([rank], "i"), np.empty(1, "i")
        stock = [plain.Irecv(note, source=(rank - 1) % size, tag=7),
                 plain.Isend(box, dest=(rank + 1) % size, tag=7)]
        statuses = [marked() for _ in range(3)]
        while not MPI.Request.Testall([stock[0], request, stock[1]], statuses):
            pass
        got = fields(statuses[0])
        if got != [(rank - 1) % size, 7, MPI.SUCCESS, 4, 4, False]:
            failures.append(f"Testall: the stock receive's status is {got}")
        status = statuses[1]
    elif how in ("Waitany", "waitsome"):   # (one by one, beside stock requests)
        stock = [plain.irecv(source=(rank - 1) % size, tag=8),
                 plain.isend({"from": rank}, dest=(rank + 1) % size, tag=8)]
        requests = [stock[0], request, stock[1]]
        found: dict[int, tuple] = {}
        while len(found) < 3:
            if how == "Waitany":
                status = marked()
                index = MPI.Request.Waitany(requests, status)
                found[index] = (status, None)
            else:
                statuses = [marked() for _ in range(3)]
                indices, messages = MPI.Request.waitsome(requests, statuses)
                for k, index in enumerate(indices):
                    found[index] = (statuses[k], messages[k])
        if how == "waitsome" and [found[i][1] for i in range(3)] \
                != [{"from": (rank - 1) % size}, None, None]:
            failures.append(f"waitsome: {found}, not stock's messages")
        status = found[1][0]
    elif how == "waitall":   # (mpi4py's: each request's message, or None)
        stock = [plain.irecv(source=(rank - 1) % size, tag=6),
                 plain.isend({"from": rank}, dest=(rank + 1) % size, tag=6)]
        statuses = [marked() for _ in range(3)]
        got = MPI.Request.waitall([stock[0], request, stock[1]], statuses)
        if got != [{"from": (rank - 1) % size}, None, None]:
            failures.append(f"waitall: {got}, not stock's messages")
        status = statuses[1]
    else:
        box, note = np.array([rank], "i"), np.empty(1, "i")
        stock = [plain.Irecv(note, source=(rank - 1) % size, tag=5),
                 plain.Isend(box, dest=(rank + 1) % size, tag=5)]
        statuses = [marked() for _ in range(3)]
        MPI.Request.Waitall([stock[0], request, stock[1]], statuses)
        got = fields(statuses[0])
        if got != [(rank - 1) % size, 5, MPI.SUCCESS, 4, 4, False]:
            failures.append(f"Waitall: the stock receive's status is {got}")
        status = statuses[1]
    return status


def empty(how: str) -> list:
    """What a stock generalized request completed by `how` gives."""
    greq = MPI.Grequest.Start()
    greq.Complete()
    return fields(complete(greq, how))


def check(label: str, how: str, status: MPI.Status) -> None:
    got, want = fields(status), empty(how)
    if got != want:
        failures.append(f"{label} {how}: {got} != stock's {want}")


def same(label: str, got: np.ndarray, want: np.ndarray) -> None:
    if not np.array_equal(got, want):
        failures.append(f"{label}: result differs from stock's")


HOWS = ("Wait", "Test", "Waitall", "waitall", "Testall", "Waitany", "waitsome", "get_status")
a = np.random.default_rng([11, rank]).standard_normal(N)
want = np.empty_like(a)
plain.Allreduce(a, want)

# Iallreduce (no Python at its end), each way
for how in HOWS:
    got = np.empty_like(a)
    check("Iallreduce", how, complete(comm.Iallreduce(a, got), how))
    same(f"Iallreduce {how}", got, want)

# A copy of the request (mpi4py's Request(other): the handle alone),
# completed by MPI.Request.Waitall as stock completes one
got = np.empty_like(a)
request = comm.Iallreduce(a, got)
try:
    MPI.Request.Waitall([type(request)(request)])
except Exception as exc:   # (cxlmpi's routed Waitall took it for its own)
    failures.append(f"Waitall of a copy: {exc!r}")
    request.Wait()
same("Iallreduce Waitall of a copy", got, want)

# Ibcast of a strided datatype: staged, its end copies back through Python
every_other = MPI.DOUBLE.Create_vector(N // 2, 1, 2).Commit()
b_want = a.copy() if rank == 0 else np.zeros_like(a)
plain.Bcast([b_want, 1, every_other], root=0)
for how in HOWS:
    b = a.copy() if rank == 0 else np.zeros_like(a)
    check("Ibcast (staged)", how, complete(comm.Ibcast([b, 1, every_other], root=0), how))
    same(f"Ibcast (staged) {how}", b, b_want)
every_other.Free()

# Allreduce_init, started once per way
got = np.empty_like(a)
persistent = comm.Allreduce_init(a, got)
for how in HOWS:
    got[:] = 0
    persistent.Start()
    check("Allreduce_init", how, complete(persistent, how))
    same(f"Allreduce_init {how}", got, want)
persistent.Free()
taken = cxlmpi.stats()
report = {"failures": failures,
          "pool": {k: taken[k]["pool_calls"] for k in ("iallreduce", "ibcast")}}
everyone = plain.gather(report, root=0)
if rank == 0:
    print("STATUS " + json.dumps(everyone), flush=True)
