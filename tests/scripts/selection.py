"""Adaptive selection in a real job: every rank times its calls with its own
random noise (Selector.learned is fed made-up nanoseconds), so that only
the agreement through the header steps can keep the ranks' decisions
alike.  A mix of collectives and sizes, each compared with stock MPI on the
same data.

    mpiexec -n N python selection.py [seed]

Prints RESULT {"same": ranks' decisions equal, "wrong": calls whose result
differed from stock, "settled": classes settled, "learning": learning
calls, "pool": pool calls}.
"""

import json
import random
import sys

import numpy as np
from mpi4py import MPI

import cxlmpi
from cxlmpi import select
from cxlmpi.pools.state import _states

plain = MPI.COMM_WORLD.Dup()
comm = cxlmpi.wrap(plain.Dup())
stock = MPI.Intracomm(comm)   # plain mpi4py on the same handle
rank, size = comm.Get_rank(), comm.Get_size()
seed = int(sys.argv[1]) if len(sys.argv) > 1 else 0
noise = random.Random(1000 * seed + rank)
_learned = select.Selector.learned


def scrambled(self, which, nbytes, code, zerocopy, nanoseconds):
    """This rank's time, times a factor of 0.1 to 10 of its own (0, a run
    that timed no call, stays 0)."""
    factor = 10 ** noise.uniform(-1, 1)
    _learned(self, which, nbytes, code, zerocopy,
             max(1, int(nanoseconds * factor)) if nanoseconds > 0 else 0)


select.Selector.learned = scrambled
_delivered = select.Selector.delivered


_init = select.Selector.__init__


def cheaper(self, nanoseconds, spent_ns=0):
    """The overhead of a header call, a tenth of what was agreed (on every
    rank alike) or measured at set-up: on oversubscribed cores (a header
    step across pool groups took 0.3-3 ms) the small classes would wait
    for their budget past these 600 calls and never try the pool."""
    _delivered(self, nanoseconds, spent_ns // 10)


def cheaper_start(self, *args, overhead_s=select.LEARN_OVERHEAD_S, **kwargs):
    _init(self, *args, overhead_s=overhead_s / 10, **kwargs)


select.Selector.delivered = cheaper
select.Selector.__init__ = cheaper_start
calls = random.Random(seed)   # the same sequence on every rank
wrong = []


def same(name, a, b):
    if not np.array_equal(a, b):
        wrong.append(name)


def allreduce(n):
    a = np.arange(n, dtype=np.float64) * (rank + 1)
    b, c = np.empty_like(a), np.empty_like(a)
    comm.Allreduce(a, b)
    stock.Allreduce(a, c)
    same("Allreduce", b, c)


def bcast(n):
    b = np.arange(n, dtype=np.int64) if rank == 1 % size else np.zeros(n, np.int64)
    c = b.copy()
    comm.Bcast(b, root=1 % size)
    stock.Bcast(c, root=1 % size)
    same("Bcast", b, c)


def allgather(n):
    a = np.full(n, rank, np.int32)
    b, c = np.empty(n * size, np.int32), np.empty(n * size, np.int32)
    comm.Allgather(a, b)
    stock.Allgather(a, c)
    same("Allgather", b, c)


def alltoallv(n):
    counts = [n + d for d in range(size)]
    a = np.arange(sum(counts), dtype=np.float32) + rank
    rcounts = [n + rank] * size
    b, c = np.empty(sum(rcounts), np.float32), np.empty(sum(rcounts), np.float32)
    comm.Alltoallv([a, counts], [b, rcounts])
    stock.Alltoallv([a, counts], [c, rcounts])
    same("Alltoallv", b, c)


def reduce_scatter_block(n):
    a = np.arange(n * size, dtype=np.int64) + rank
    b, c = np.empty(n, np.int64), np.empty(n, np.int64)
    comm.Reduce_scatter_block(a, b)
    stock.Reduce_scatter_block(a, c)
    same("Reduce_scatter_block", b, c)


def barrier(n):
    comm.Barrier()


KINDS = [allreduce, bcast, allgather, alltoallv, reduce_scatter_block, barrier]
SIZES = [64, 1024, 16384]   # elements: 512 B to 128 KiB
for _ in range(600):
    kind = calls.choice(KINDS)
    kind(calls.choice(SIZES))

routes = _states[comm.handle].routes   # None: the path is pinned
mine = [] if routes is None else sorted(
    (k, v.best, v.runner_up, v.phase, v.explored) for k, v in routes.selector.learners.items())
everyone = plain.gather(mine, root=0)
stats = cxlmpi.stats()
learning = sum(int(row.get("learning_calls", 0)) for row in stats.values())
pool = sum(int(row.get("pool_calls", 0)) for row in stats.values())
bad = plain.gather(wrong, root=0)
if rank == 0:
    print("RESULT " + json.dumps({
        "same": all(e == everyone[0] for e in everyone),
        "wrong": sorted({w for ws in bad for w in ws}),
        "settled": sum(1 for e in everyone[0] if e[1] is not None),
        "learning": learning, "pool": pool,
        "bcast_pool": int(stats["bcast"]["pool_calls"])}), flush=True)
