"""A known mix of object (pickle) collectives for the stats tests
(tests/test_runner_info.py): every method called a different number of times
with a large object (64 KiB array: the pool with CXLMPI_OBJECTS=1) and with
a small one (passes through).  Rank 0 prints ``STATS <json of
cxlmpi.stats()>``, ``CALLS <json>``: per method [large calls, small calls],
and ``PAYLOAD <bytes of the large array>``."""

from __future__ import annotations

import json
import sys

import numpy as np
from mpi4py import MPI

NBYTES = 1 << 16


def main() -> None:
    import cxlmpi

    comm = MPI.COMM_WORLD
    size, rank = comm.Get_size(), comm.Get_rank()
    big = np.full(NBYTES // 8, float(rank + 1))
    calls = {
        "bcast": lambda obj: comm.bcast(obj, root=0),
        "gather": lambda obj: comm.gather(obj, root=0),
        "scatter": lambda obj: comm.scatter([obj] * size if rank == 0 else None, root=0),
        "allgather": lambda obj: comm.allgather(obj),
        "alltoall": lambda obj: comm.alltoall([obj] * size),
        "reduce": lambda obj: comm.reduce(obj, op=MPI.SUM, root=0),
        "allreduce": lambda obj: comm.allreduce(obj, op=MPI.SUM),
    }
    counts = {}
    for i, (name, call) in enumerate(calls.items()):
        large, small = 1 + i % 3, 1 + (i + 1) % 2
        for _ in range(large):
            call(big)
        for _ in range(small):
            call(rank + 1)
        counts[name] = [large, small]
    if rank == 0:
        sys.stdout.write(f"STATS {json.dumps(cxlmpi.stats())}\nCALLS {json.dumps(counts)}\n"
                         f"PAYLOAD {NBYTES}\n")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
