"""Ranks that disagree on a setting every rank must share
(tests/test_runner_info.py): `disagree.py VAR VALUE HOW` sets VAR=VALUE in rank
0's environment only, before cxlmpi reads its settings, then makes the
calls HOW says -- ``patch`` (cxlmpi.patch(), then an object bcast),
``objects`` (a wrapped communicator's object bcast first), ``buffers``
(a wrapped communicator's large Allreduce first) or ``world`` (the same on
cxlmpi.wrap(MPI.COMM_WORLD)).  Each must fail on every
rank with a CXLMPIConfigError naming VAR, not hang; a rank that raises
prints ``RAISED <error>``, one that gets through ``FINISHED``."""

from __future__ import annotations

import os
import sys

import numpy as np
from mpi4py import MPI


def main() -> None:
    var, value, how = sys.argv[1:4]
    rank = MPI.COMM_WORLD.Get_rank()
    if rank == 0:
        os.environ[var] = value
    import cxlmpi

    if how == "patch":
        cxlmpi.patch()
        comm = MPI.COMM_WORLD
    elif how == "world":
        comm = cxlmpi.wrap(MPI.COMM_WORLD)
    else:
        comm = cxlmpi.wrap(MPI.COMM_WORLD.Dup())
    big = list(range(1 << 16))  # a pickle far above CXLMPI_THRESHOLD
    if how not in ("buffers", "world"):
        got = comm.bcast(big if rank == 0 else None, root=0)
        assert got == big
    data = np.arange(1 << 17, dtype=np.float64)
    out = np.empty_like(data)
    comm.Allreduce(data, out)
    got = comm.bcast(big if rank == 0 else None, root=0)
    assert got == big
    sys.stdout.write(f"FINISHED {rank}\n")


if __name__ == "__main__":
    try:
        main()
    except Exception as exc:
        # to stdout, one whole line in one write: on stderr the other rank's
        # traceback, written in pieces, could land in front of it
        sys.stdout.write(f"RAISED {type(exc).__name__}: {exc}\n")
        sys.stdout.flush()
        raise
