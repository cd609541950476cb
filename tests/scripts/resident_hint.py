"""A class whose cached decision for private buffers is MPI, called with
pool-resident arrays: the ranks must find out (in a header step) that every
rank's buffers are in the pool and learn the zero-copy class, instead of
staying with MPI until a re-check.

    mpiexec -n N python resident_hint.py CACHE_FILE

Rank 0 writes CACHE_FILE first: Allreduce of 1 MiB, private buffers, best
"mpi" (runner-up "pool+flat"), for this very machine.  Prints RESULT
{"pool": pool calls of the 20 Allreduces, "wrong": results unlike stock's,
"private_pool": pool calls of 20 more with private buffers}.
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
n = (1 << 20) // 8
if rank == 0:
    cfg = config.get()
    fp = cache.fingerprint(size, MPI.Get_library_version(), cfg)
    which = config.COLLECTIVES.index("allreduce")
    learner = select.Learner(select.candidates("allreduce", 1 << 20, size, False,
                                               cfg.chunk_size),
                             samples={0: [1e-4], select.code_of("pool+flat"): [2e-4]})
    learner.best, learner.runner_up, learner.phase = 0, select.code_of("pool+flat"), 1
    learner.interval = select.MAX_INTERVAL
    assert cache.save_cache(path, fp, {(which, select.size_class(1 << 20), 0): learner})
world.Barrier()
comm = cxlmpi.wrap(world.Dup())
stock = MPI.Intracomm(comm)
a = cxlmpi.empty(n, np.float64, comm=comm)
b = cxlmpi.empty(n, np.float64, comm=comm)
a[:] = np.arange(n) + rank
want = np.empty(n)
stock.Allreduce(a, want)
before = cxlmpi.stats()["allreduce"]["pool_calls"]
wrong = 0
for _ in range(20):
    comm.Allreduce(a, b)
    wrong += not np.array_equal(b, want)
pool = cxlmpi.stats()["allreduce"]["pool_calls"] - before
p, q = np.array(a), np.empty(n)
before = cxlmpi.stats()["allreduce"]["pool_calls"]
for _ in range(20):
    comm.Allreduce(p, q)
    wrong += not np.array_equal(q, want)
private_pool = cxlmpi.stats()["allreduce"]["pool_calls"] - before
every = world.gather((pool, wrong, private_pool), root=0)
if rank == 0:
    print("RESULT " + json.dumps({"pool": min(e[0] for e in every),
                                  "wrong": sum(e[1] for e in every),
                                  "private_pool": max(e[2] for e in every)}), flush=True)
