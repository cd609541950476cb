"""A known mix of pool and pass-through calls for the stats tests
(tests/test_runner_info.py); rank 0 prints ``STATS <json of cxlmpi.stats()>``
and ``EXPECT <json>``: the counts the mix must give.  It runs under
``python -m cxlmpi`` (COMM_WORLD patched)."""

from __future__ import annotations

import json
import sys

import numpy as np
from mpi4py import MPI

BIG = 1 << 15  # float64: 256 KiB, through the pool
SMALL = 16  # float64: 128 B, passes through


def say(line: str) -> None:
    """Print `line` in one write: ranks' lines never interleave."""
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def main() -> None:
    import cxlmpi

    comm = MPI.COMM_WORLD
    rank = comm.Get_rank()
    big, big_out = np.ones(BIG), np.empty(BIG)
    small, small_out = np.ones(SMALL), np.empty(SMALL)

    comm.Barrier()  # the first blocking collective: sets the pool up, runs there
    for _ in range(3):
        comm.Allreduce(big, big_out)
    for _ in range(2):
        comm.Allreduce(small, small_out)
    comm.Bcast(big, root=0)
    comm.Bcast(small, root=0)
    for _ in range(2):
        comm.Reduce(big, big_out if rank == 0 else None, root=0)
    comm.Barrier()
    # pool-resident arrays: these two use the ranks' buffers in place
    res, res_out = cxlmpi.empty(BIG), cxlmpi.empty(BIG)
    res[:] = 1.0
    for _ in range(2):
        comm.Allreduce(res, res_out)

    nbytes = BIG * 8
    expect = {  # pool calls, passed through, bytes, zero-copy calls
        "allreduce": [5, 2, 5 * nbytes, 2],
        "bcast": [1, 1, nbytes, 0],
        "reduce": [2, 0, 2 * nbytes, 0],
        "barrier": [2, 0, 0, 0],
    }
    if rank == 0:
        say("STATS " + json.dumps(cxlmpi.stats()))
        say("EXPECT " + json.dumps(expect))


if __name__ == "__main__":
    main()
