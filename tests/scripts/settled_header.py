"""Gather and Scatter whose class the cache settled on MPI (private
buffers): every rank must send them to MPI at once, as `take` sends the
other collectives' settled classes, not after a header step in the pool
each call (which cost the settled-MPI class what MPI's own call costs at
64 KiB on 2 ranks).

    mpiexec -n N python settled_header.py CACHE_FILE

Rank 0 writes CACHE_FILE first: Gather and Scatter of BLOCK bytes a rank,
private buffers, best "mpi" (runner-up "pool"), for this very machine.
Each rank runs 20 of each against stock on the same data, every root,
then one of each per root whose message on rank 1 runs past its buffer.
Prints RESULT {"steps": the most pool steps a rank took in the 40, "pool":
pool calls, "wrong": results unlike stock's (inside the buffers; and any
write past rank 1's)}.
"""

import json
import sys
import warnings

import numpy as np
from mpi4py import MPI

import cxlmpi
from cxlmpi import config, select
from cxlmpi.pools.state import pool_state
from cxlmpi.select import cache

BLOCK = 1 << 19
path = sys.argv[1]
world = MPI.COMM_WORLD
rank, size = world.Get_rank(), world.Get_size()
nbytes = BLOCK * size
if rank == 0:
    cfg = config.get()
    fp = cache.fingerprint(size, MPI.Get_library_version(), cfg)
    learners = {}
    for name in ("gather", "scatter"):
        learner = select.Learner(select.candidates(name, nbytes, size, False, cfg.chunk_size),
                                 samples={0: [1e-4], select.code_of("pool"): [2e-4]})
        learner.best, learner.runner_up, learner.phase = 0, select.code_of("pool"), 1
        learner.interval = select.MAX_INTERVAL
        learners[(config.COLLECTIVES.index(name), select.size_class(nbytes), 0)] = learner
    assert cache.save_cache(path, fp, learners)
world.Barrier()
comm = cxlmpi.wrap(world.Dup())
stock = MPI.Intracomm(world.Dup())
pool = pool_state(comm)
n = BLOCK // 8
mine = np.arange(n, dtype=np.float64) + 1000 * rank
whole = (np.arange(n * size, dtype=np.float64) * 3).reshape(size, n)
got, want = np.empty((size, n)), np.empty((size, n))
part, part_want = np.empty(n), np.empty(n)
wrong = 0
steps = pool.step
before = cxlmpi.stats()
for i in range(20):
    root = i % size
    comm.Gather(mine, got, root)
    stock.Gather(mine, want, root)
    wrong += rank == root and not np.array_equal(got, want)
    comm.Scatter(whole + i, part, root)
    stock.Scatter(whole + i, part_want, root)
    wrong += not np.array_equal(part, part_want)
steps = pool.step - steps
after = cxlmpi.stats()
pooled = sum(after[c]["pool_calls"] - before[c]["pool_calls"] for c in ("gather", "scatter"))
# Rank 1's message runs past its buffer (an explicit count n on a view 16
# doubles shorter; the memory past it is the script's own, zeros): it goes
# to MPI with its peers, on a scratch copy (before, it raised alone and the
# root waited in MPI_Gather for ever); stock reads and writes past the view.
short = n - 16 if rank == 1 else n
for root in range(size):
    mem, mem_want = np.zeros(n + 16), np.zeros(n + 16)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        mem[:short] = mine[:short]
        comm.Gather([mem[:short], n, MPI.DOUBLE], got, root)
        mem_want[:short] = mine[:short]
        stock.Gather([mem_want[:short], n, MPI.DOUBLE], want, root)
        wrong += rank == root and not np.array_equal(got, want)
        comm.Scatter(whole, [mem[:short], n, MPI.DOUBLE], root)
        stock.Scatter(whole, [mem_want[:short], n, MPI.DOUBLE], root)
        wrong += not np.array_equal(mem[:short], mem_want[:short]) or np.any(mem[short:])
every = world.gather((steps, pooled, int(wrong)), root=0)
comm.Free()
stock.Free()
if rank == 0:
    print("RESULT " + json.dumps({"steps": max(e[0] for e in every),
                                  "pool": max(e[1] for e in every),
                                  "wrong": sum(e[2] for e in every)}), flush=True)
