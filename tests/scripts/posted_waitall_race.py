"""Posted calls completed by MPI (``MPI.Request.Waitall``), back to back:
MPI may free such a request inside the worker's MPI_Grequest_complete (the
program's Waitall let go of it first), calling the request's free function
there, while the program's next post starts a request.  ITERATIONS calls,
each result checked against stock's; rank 0 prints ``RACE <json>``: per
rank, the calls that differed.  MPI's own Waitall, as mpi4py has it
before cxlmpi routes it (the routed one lets the call end first, so MPI
then finds the request complete and frees it in this thread)."""

from __future__ import annotations

import json
import sys

import numpy as np
from mpi4py import MPI

STOCK_WAITALL = MPI.Request.Waitall   # (before cxlmpi's first post routes it)

from posting import ready  # noqa: E402

import cxlmpi  # noqa: E402

ITERATIONS = int(sys.argv[1])
comm = ready(cxlmpi.wrap(MPI.COMM_WORLD.Dup()))
plain = MPI.Intracomm(comm)
rank = comm.Get_rank()
a = np.arange(1024, dtype=np.float64) * (rank + 1)
want = np.empty_like(a)
plain.Allreduce(a, want)
b = np.empty_like(a)
wrong = 0
for _ in range(ITERATIONS):
    b[:] = 0
    STOCK_WAITALL([comm.Iallreduce(a, b)])
    wrong += not np.array_equal(b, want)
taken = cxlmpi.stats()["iallreduce"]["pool_calls"]
everyone = plain.gather({"wrong": wrong, "pool": taken}, root=0)
if rank == 0:
    print("RACE " + json.dumps(everyone), flush=True)
