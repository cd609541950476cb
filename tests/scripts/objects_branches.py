"""Object collectives whose data moved but whose result the program's own
code cannot make on one rank (tests/test_branches.py): an op that raises
(only the root folds a reduce), an object that does not unpickle on rank 1.
Stock mpi4py raises on that rank after the collective; the others return.
Under cxlmpi (CXLMPI_OBJECTS=1, objects large enough for the pool) the same
must hold, at once -- not the others waiting out CXLMPI_TIMEOUT in the MPI
barrier that ends the collective (CXLMPI_ORDERING), which the rank that
raised never reached.  And the scatter and alltoall of objects end with
that barrier too: eager messages sent before them are there after them,
as under stock.

    mpiexec -n N python objects_branches.py

Prints RESULT {case: [[outcome, stock's outcome, seconds], ...]} from rank
0, one entry per rank (outcome: "ok" or the error's class), and ORDER
{pattern: {"cxlmpi": missing, "stock": missing}}.
"""

import json
import sys
import time

import numpy as np
from mpi4py import MPI

import cxlmpi

world = MPI.COMM_WORLD
comm = cxlmpi.wrap(world.Dup())
plain = MPI.Intracomm(comm)          # the same MPI communicator, unwrapped
rank, size = comm.Get_rank(), comm.Get_size()
X = np.ones(8192)                    # 64 KiB pickles: through the pool


def refuse(a, b):
    """An op that refuses the last rank's contribution (the last the root
    folds: stock mpi4py's tree has received every other by then, up to 3
    ranks -- where it refused an earlier one, stock left a sender in MPI)."""
    if b[0] == size - 1:
        raise ValueError("the op refuses")
    return a + b


def rebuild(arr):
    if MPI.COMM_WORLD.Get_rank() == 1:
        raise RuntimeError("this rank cannot unpickle it")
    return arr


class Payload:
    def __init__(self, arr):
        self.arr = arr

    def __reduce__(self):
        return (rebuild, (self.arr,))


CASES = {
    "reduce: the root's op raises": lambda c: c.reduce(X * rank, op=refuse, root=0),
    "bcast: rank 1 cannot unpickle": lambda c: c.bcast(Payload(X), root=0),
    "gather: the root (1) cannot unpickle": lambda c: c.gather(Payload(X), root=1),
    "allgather: rank 1 cannot unpickle": lambda c: c.allgather(Payload(X)),
    "scatter: rank 1 cannot unpickle": lambda c: c.scatter([Payload(X)] * size, root=0),
    "alltoall: rank 1 cannot unpickle": lambda c: c.alltoall([Payload(X)] * size),
}


def outcome(c, call) -> tuple[str, float]:
    t0 = time.monotonic()
    try:
        call(c)
        what = "ok"
    except Exception as exc:  # noqa: BLE001 - what stock raises is the reference
        what = type(exc).__name__
    seconds = time.monotonic() - t0
    plain.Barrier()
    return what, seconds


def misses(c, name: str, reps: int = 50) -> int:
    """Eager messages from the left neighbour not yet probeable after each
    of `reps` object scatters or alltoalls on `c`."""
    right, left = (rank + 1) % size, (rank - 1) % size
    big = [np.full(8192, q, dtype=np.float64) for q in range(size)]
    missing = 0
    buf = np.empty(4, "i")
    for rep in range(reps):
        reqs = [plain.Isend(np.full(4, rep, "i"), right, tag=4 * rep + k) for k in range(4)]
        got = c.scatter(big, root=0) if name == "scatter" else c.alltoall(big)
        assert (got[0] if name == "scatter" else got[0][0]) == rank
        for k in range(4):
            if not plain.Iprobe(left, 4 * rep + k):
                missing += 1
            plain.Recv(buf, left, 4 * rep + k)
        MPI.Request.Waitall(reqs)
    return missing


comm.allgather(X)                    # the pool is set up
result = {}
for name, call in CASES.items():
    mine, seconds = outcome(comm, call)
    stock, _ = outcome(plain, call)
    result[name] = plain.allgather([mine, stock, round(seconds, 2)])
order = {name: {"cxlmpi": plain.allreduce(misses(comm, name)),
                "stock": plain.allreduce(misses(plain, name))}
         for name in ("scatter", "alltoall")}
if rank == 0:
    sys.stdout.write("RESULT " + json.dumps(result) + "\n")
    sys.stdout.write("ORDER " + json.dumps(order) + "\n")
    sys.stdout.flush()
