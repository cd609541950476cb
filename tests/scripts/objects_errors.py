"""Object collectives where one rank's objects cannot be sent (a scatter or
alltoall list of the wrong length, an object that does not pickle).  Stock
mpi4py raises on that rank before anything moves, and the other ranks wait
in MPI.  Under cxlmpi (CXLMPI_OBJECTS=1, objects large enough for the pool)
the same must hold: that rank raises stock's error, and the others wait in
MPI -- where the raising rank's repeat of the call on the plain communicator
releases them with its data -- not in the pool for a rank that has left.

    mpiexec -n N python objects_errors.py

Prints RESULT {case: [[error, stock's error, what the rank got], ...]} from
rank 0, one entry per rank (None where nothing was raised).
"""

import json

from mpi4py import MPI

import cxlmpi

world = MPI.COMM_WORLD
comm = cxlmpi.wrap(world.Dup())
plain = MPI.Intracomm(comm)          # the same MPI communicator, unwrapped
rank, size = comm.Get_rank(), comm.Get_size()
last = size - 1
BIG = 65536                          # bytes: the objects go through the pool


def item(i: int) -> bytes:
    return bytes([i % 251]) * BIG


def unpicklable():
    return lambda: None              # a local lambda: pickle refuses it


def run(bad: int, wrapped, stock, retry, normal):
    """On rank `bad`: the wrapped call (raises), the same call on the plain
    communicator (stock raises before anything moves), then `retry` on the
    plain one (releases the others); elsewhere `normal` (the wrapped call)."""
    if rank != bad:
        return [None, None, normal()]
    errors = []
    for call in (wrapped, stock):
        try:
            call()
            errors.append(None)
        except Exception as exc:  # noqa: BLE001 - what stock raises is the reference
            errors.append(f"{type(exc).__name__}: {exc}")
    return [*errors, retry()]


def summary(got):
    """What a rank received, small enough to print."""
    if isinstance(got, (bytes, bytearray)):
        return [len(got), got[:1].hex()]
    if isinstance(got, list):
        return [summary(g) for g in got]
    return got


CASES = {
    "scatter: root's list one too long": lambda: run(
        0,
        lambda: comm.scatter([item(0)] * (size + 1), root=0),
        lambda: plain.scatter([item(0)] * (size + 1), root=0),
        lambda: plain.scatter([item(q) for q in range(size)], root=0),
        lambda: comm.scatter(None, root=0)),
    "alltoall: one rank's list one too short": lambda: run(
        last,
        lambda: comm.alltoall([item(rank)] * (size - 1)),
        lambda: plain.alltoall([item(rank)] * (size - 1)),
        lambda: plain.alltoall([item(rank)] * size),
        lambda: comm.alltoall([item(rank)] * size)),
    "gather: one rank's object does not pickle": lambda: run(
        last,
        lambda: comm.gather(unpicklable(), root=0),
        lambda: plain.gather(unpicklable(), root=0),
        lambda: plain.gather(item(rank), root=0),
        lambda: comm.gather(item(rank), root=0)),
    "bcast: the root's object does not pickle": lambda: run(
        0,
        lambda: comm.bcast(unpicklable(), root=0),
        lambda: plain.bcast(unpicklable(), root=0),
        lambda: plain.bcast(item(7), root=0),
        lambda: comm.bcast(None, root=0)),
}

results = {}
for name, case in CASES.items():
    error, stock_error, got = case()
    results[name] = world.gather([error, stock_error, summary(got)], root=0)
# the communicator still works, through the pool
check = comm.allgather(item(rank))
ok = check == [item(q) for q in range(size)]
results["allgather after"] = world.gather(ok, root=0)
if rank == 0:
    print("RESULT " + json.dumps(results), flush=True)
comm.Free()
