"""Nonblocking collectives still in flight when the program calls
MPI_Finalize (erroneous in MPI, done by real programs): cxlmpi's worker
must not run them -- progressing MPI, completing their requests -- after
MPI is gone ("Attempting to use an MPI routine after finalizing" from
MPICH, before).  cxlmpi ends them as MPI_Finalize begins and warns.

    mpiexec -n N python finalize_in_flight.py [implicit]

Each rank prints ``RESULT {"rank": r, "same": bool}``: whether what the
calls delivered equals stock MPI's blocking result, computed first.
`implicit`: the program does not call MPI_Finalize (mpi4py does, at exit);
each rank prints ``RESULT {"rank": r, "same": null}`` before it ends.
"""

import json
import sys

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
if sys.argv[1:] == ["implicit"]:
    print("RESULT " + json.dumps({"rank": rank, "same": None}), flush=True)
    sys.exit(0)
MPI.Finalize()
same = all(np.array_equal(outs[k], want * (k + 1)) for k in range(6))
print("RESULT " + json.dumps({"rank": rank, "same": same}), flush=True)
