"""Nonblocking collectives still in flight when the program calls
MPI_Finalize (erroneous in MPI, done by real programs): cxlmpi's worker
must not run them -- progressing MPI, completing their requests -- after
MPI is gone ("Attempting to use an MPI routine after finalizing" from
MPICH, before).  cxlmpi ends them as MPI_Finalize begins and warns.

    mpiexec -n N python finalize_in_flight.py

Each rank prints ``RESULT {"rank": r, "same": bool}``: whether what the
calls delivered equals stock MPI's blocking result, computed first.
"""

import json

import numpy as np
from mpi4py import MPI

import cxlmpi

plain = MPI.COMM_WORLD
rank = plain.Get_rank()
comm = cxlmpi.wrap(plain.Dup())
n = 1 << 16
a = np.arange(n, dtype=float) + rank
want = np.empty(n)
plain.Allreduce(a, want)
comm.Allreduce(a, np.empty(n))   # the pool is set up
outs = [np.zeros(n) for _ in range(6)]
reqs = [comm.Iallreduce(a * (k + 1), outs[k]) for k in range(6)]
MPI.Finalize()
same = all(np.array_equal(outs[k], want * (k + 1)) for k in range(6))
print("RESULT " + json.dumps({"rank": rank, "same": same}), flush=True)
