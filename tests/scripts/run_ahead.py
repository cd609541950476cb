"""A rank that followed a peer's pass to MPI, then ran ahead through calls
that complete without a slow peer, must not take that slow peer's late
first step of the followed call for a mismatch (mpi4py's test_cco_buf hung
3 oversubscribed ranks that way: one rank raised CXLMPIMismatchError, the
others waited for it).

    mpiexec -n 3 python run_ahead.py [rounds] [ahead]

Each round, on a communicator whose pool is set up: a Scatter from rank 1
whose root names no receive buffer (valid in MPICH and Open MPI; cxlmpi
sends it to MPI at once on the root, its peers follow from the header
step); rank 0 follows at once, while rank 2 first waits for a message rank
0 sends only after `ahead` small Bcasts from rank 0 (below the threshold:
MPI, where they complete on the root without its peers) -- so rank 0 is at the next pool call, an
Allreduce, when rank 2 publishes its step of the Scatter.  The same
program on the plain communicator gives the reference.  Prints RESULT
{"errors": [...], "same": whether every value equals stock's}.
"""

import json
import sys

import numpy as np
from mpi4py import MPI

import cxlmpi

rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 20
ahead = int(sys.argv[2]) if len(sys.argv) > 2 else 3
plain = MPI.COMM_WORLD
rank, size = plain.Get_rank(), plain.Get_size()
assert size == 3, "run with 3 ranks"


def rounds_on(comm: MPI.Comm) -> list[float]:
    seen: list[float] = []
    a = np.full(4096, rank + 1.0)
    b = np.empty_like(a)
    comm.Allreduce(a, b)   # the pool is set up before the ranks part
    for i in range(rounds):
        if rank == 2:
            token = np.zeros(1)
            plain.Recv(token, source=0, tag=7)
        block = np.empty(64)
        if rank == 1:
            send = np.arange(3 * 64, dtype=float) + i
            comm.Scatter(send, None, root=1)
        else:
            comm.Scatter(None, block, root=1)
            seen.append(float(block.sum()))
        for k in range(ahead):
            note = np.full(8, float(i + k)) if rank == 0 else np.empty(8)
            comm.Bcast(note, root=0)
            seen.append(float(note.sum()))
        if rank == 0:
            plain.Send(np.ones(1), dest=2, tag=7)
        comm.Allreduce(a * (i + 1), b)
        seen.append(float(b.sum()))
    return seen


stock = rounds_on(plain.Dup())
errors: list[str] = []
try:
    shim = rounds_on(cxlmpi.wrap(plain.Dup()))
except cxlmpi.CXLMPIError as exc:
    errors.append(f"rank {rank}: {type(exc).__name__}: {exc}")
    shim = []
every = plain.gather((errors, shim == stock), root=0)
if rank == 0:
    print("RESULT " + json.dumps({"errors": [e for es, _ in every for e in es],
                                  "same": all(s for _, s in every)}), flush=True)
