"""A rank that sends a call to MPI and goes straight on to a pool call,
while its peer is still at its first step of the call that was passed (the
peer has to see the pass mark, take its step back and follow), many times
over: the peer's stale step must never be taken for the next call.

    mpiexec -n N python follow_race.py [rounds]

Run with CXLMPI_TUNING=pool and a 1 KiB threshold: rank 0 broadcasts 64
KiB as 1024 elements of a derived datatype (which the pool does not take:
MPI), the others receive 64 KiB of bytes (the pool, then MPI by
following) -- the same type signature, a valid MPI program.  Prints RESULT
{"errors": [...], "wrong": calls whose result differed}.
"""

import json
import sys

import numpy as np
from mpi4py import MPI

import cxlmpi

plain = MPI.COMM_WORLD
comm = cxlmpi.wrap(plain.Dup())
rank, size = comm.Get_rank(), comm.Get_size()
rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 300
a = np.ones(4096)
b = np.empty_like(a)
comm.Allreduce(a, b)   # the pool is set up (collective) before the ranks disagree
errors, wrong = [], 0
block = MPI.BYTE.Create_contiguous(64).Commit()
for i in range(rounds):
    buf = np.full(1 << 16, (i % 251) + 1 if rank == 0 else 0, np.uint8)
    try:
        comm.Bcast([buf, 1024, block] if rank == 0 else buf, 0)   # MPI, all of it
        wrong += not (buf == (i % 251) + 1).all()
        comm.Allreduce(a, b)      # the pool, straight after
        wrong += not (b == size).all()
    except cxlmpi.CXLMPIError as exc:
        errors.append(f"{i}: {type(exc).__name__}")
        break
block.Free()
every = plain.gather((errors, wrong), root=0)
if rank == 0:
    print("RESULT " + json.dumps({"errors": [e for es, _ in every for e in es],
                                  "wrong": sum(w for _, w in every)}), flush=True)
