"""Small messages on a pool whose ranks MPI sees on several hosts
(tests/test_collectives.py: MPIR_CVAR_NUM_CLIQUES makes MPICH see each
rank on a host of its own, and a file: pool that every rank maps).  Each
collective runs three times with 8-byte messages on a communicator made
from COMM_WORLD (`Split`, so that a derived one counts too), and its result
is compared with stock MPI's on the same data.  Rank 0 prints ``RESULT
<json>``: the nodes MPI's COMM_TYPE_SHARED split found, whether every result
matched on every rank, and per collective the calls that took the pool."""

from __future__ import annotations

import json
import sys

import numpy as np
from mpi4py import MPI

import cxlmpi

CALLS = 3


def main() -> None:
    plain = MPI.COMM_WORLD
    size, rank = plain.Get_size(), plain.Get_rank()
    node = plain.Split_type(MPI.COMM_TYPE_SHARED, rank)
    nodes = len(set(plain.allgather(node.bcast(rank, root=0))))
    node.Free()
    comm = cxlmpi.wrap(plain.Split(0, rank))
    base = plain.Dup()   # stock MPI on the same ranks, the same data
    one = np.array([rank * 1.5 + 1.0])
    many = np.arange(size, dtype=np.float64) + 10 * rank

    def allreduce(c):
        out = np.empty(1)
        c.Allreduce(one, out)
        return out

    def reduce(c):
        out = np.zeros(1)
        c.Reduce(one, out, root=size - 1)
        return out

    def bcast(c):
        out = one.copy()
        c.Bcast(out, root=size - 1)
        return out

    def allgather(c):
        out = np.empty(size)
        c.Allgather(one, out)
        return out

    def alltoall(c):
        out = np.empty(size)
        c.Alltoall(many, out)
        return out

    def allreduce_obj(c):
        return np.array([c.allreduce(rank + 1)], dtype=np.float64)

    tests = {"allreduce": allreduce, "reduce": reduce, "bcast": bcast,
             "allgather": allgather, "alltoall": alltoall, "allreduce(obj)": allreduce_obj}
    ok = True
    for call in tests.values():
        want = call(base)
        for _ in range(CALLS):
            ok = ok and np.array_equal(call(comm), want)
    stats = cxlmpi.stats()
    ok = all(plain.allgather(bool(ok)))
    pool = {name: int(stats.get(name, {}).get("pool_calls", 0)) for name in tests}
    comm.Free()
    base.Free()
    if rank == 0:
        sys.stdout.write("RESULT " + json.dumps({"ok": ok, "nodes": nodes, "pool": pool}) + "\n")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
