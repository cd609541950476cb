"""A job whose selection cache was planted: beside a valid class (Allreduce
of 1 MiB, private buffers: "pool+flat"), classes of 2**64 and 2**14000
bytes (size classes past the compiled route table) and a NaN timing.

    mpiexec -n N python cache_job.py CACHE_FILE

Rank 0 writes CACHE_FILE first.  Prints RESULT {"wrong": Allreduce results
unlike stock's, "decision": what adaptive selection holds for the valid
class after the first call, "later": the same on every rank for two more
communicators set up after rank 0 changed the class's entry to "mpi"}.
"""

import json
import os
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
n = (1 << 20) // 8
wrong = 0


kept = []   # (a freed communicator's pool, selection included, goes to the next)


def first_decision() -> str | None:
    """Ten Allreduce calls of 1 MiB on a new communicator, against stock;
    what selection held for the class after the first."""
    global wrong
    comm = cxlmpi.wrap(world.Dup())
    stock = MPI.Intracomm(comm)
    decision = None
    for call in range(10):
        a = np.arange(n, dtype=np.float64) * (rank + 1) + call
        b, want = np.empty(n), np.empty(n)
        comm.Allreduce(a, b)
        stock.Allreduce(a, want)
        wrong += not np.array_equal(b, want)
        if call == 0:
            decision = select.decision(comm, "allreduce", 1 << 20)
    kept.append(comm)
    return decision


decision = first_decision()
# the entry changed (a new file): the next communicators' set-up reads it,
# on every rank (rank 0 reads the file; the others keep what it sent last)
world.Barrier()
if rank == 0:
    with open(path) as f:
        data = json.load(f)
    (machine,) = data["machines"].values()
    machine["decisions"]["allreduce"]["1048576"]["private"] = {
        "best": "mpi", "runner_up": "pool+flat", "seconds": {"pool+flat": 2e-4, "mpi": 1e-4}}
    with open(path + ".new", "w") as f:
        json.dump(data, f)
    os.replace(path + ".new", path)
world.Barrier()
later = [first_decision(), first_decision()]
for comm in kept:
    comm.Free()
every = world.gather((wrong, decision, later), root=0)
if rank == 0:
    print("RESULT " + json.dumps({"wrong": sum(e[0] for e in every),
                                  "decision": every[0][1],
                                  "later": [e[2] for e in every]}), flush=True)
