"""A job whose selection cache was planted: beside a valid class (Allreduce
of 1 MiB, private buffers: "pool+flat"), classes of 2**64 and 2**14000
bytes (size classes past the compiled route table) and a NaN timing.

    mpiexec -n N python cache_job.py CACHE_FILE

Rank 0 writes CACHE_FILE first.  Prints RESULT {"wrong": Allreduce results
unlike stock's, "decision": what adaptive selection holds for the valid
class after the first call}.
"""

import json
import sys

import numpy as np
from mpi4py import MPI

import cxlmpi
from cxlmpi import config, select
from cxlmpi.select import cache

path = sys.argv[1]
world = MPI.COMM_WORLD
rank, size = world.Get_rank(), world.Get_size()
if rank == 0:
    fp = cache.fingerprint(size, MPI.Get_library_version(), config.get())
    valid = {"best": "pool+flat", "runner_up": "mpi",
             "seconds": {"pool+flat": 1e-4, "mpi": 2e-4}}
    planted = {str(2 ** 64): {"private": valid}, str(2 ** 14000): {"private": valid},
               "1048576": {"private": valid}}
    nan = {"4096": {"private": dict(valid, seconds={"pool+flat": float("nan")})}}
    with open(path, "w") as f:
        json.dump({"machines": {cache._key(fp): {"machine": fp, "decisions": {
            "allreduce": planted, "bcast": nan}}}}, f)
world.Barrier()
comm = cxlmpi.wrap(world.Dup())
stock = MPI.Intracomm(comm)
n = (1 << 20) // 8
wrong = 0
decision = None
for call in range(10):
    a = np.arange(n, dtype=np.float64) * (rank + 1) + call
    b, want = np.empty(n), np.empty(n)
    comm.Allreduce(a, b)
    stock.Allreduce(a, want)
    wrong += not np.array_equal(b, want)
    if call == 0:
        decision = select.decision(comm, "allreduce", 1 << 20)
comm.Free()
every = world.gather((wrong, decision), root=0)
if rank == 0:
    print("RESULT " + json.dumps({"wrong": sum(e[0] for e in every),
                                  "decision": every[0][1]}), flush=True)
