"""Ranks that wait in the pool get out of the way: they sleep on their
peer's control word and are woken, or back off where no futex can reach.

    mpiexec -n N python waiting.py SCENARIO

Every futex sleep is bounded by an hour here (by default 50 us at first,
growing to 1 ms), so that a lost wake-up hangs the job instead of costing
a millisecond, and every sleep ends by a wake-up.

- woken:      rank 0 computes (a fixed amount of work) while the other ranks
              wait for it in a pool Barrier, long enough to fall asleep
              (with more ranks than cores, after yielding for 1 ms).
- other-host: the same, but the last rank takes another host's identity
              before the pool is set up: its peers could not wake it through
              a futex, nor it them, so it backs off (the others, on one
              host, still sleep on rank 0).
- loop:       collectives of every family, several sizes and roots, with
              ranks arriving at different times; results against stock
              MPI's on the same data.
- apart, together: before the pool is set up, each rank binds itself to
              a CPU of its own (rank modulo the CPUs it may use), or all
              to the first of them; reports whether the pool's waiters
              busy-poll (`spin`), then an Allreduce against stock's.

Prints RESULT [...] on rank 0: per rank, whether its results equal stock's
and its wait counters (cxlmpi._pool.wait_counts(): in the pool Barrier that
waits for rank 0, or over the whole loop).
"""

import json
import os
import sys

import numpy as np
from mpi4py import MPI

import cxlmpi
from cxlmpi import _pool, _shim

scenario = sys.argv[1]
plain = MPI.COMM_WORLD
rank, size = plain.Get_rank(), plain.Get_size()
_pool.set_sleep_bounds(3600.0, 3600.0)
if scenario == "other-host" and rank == size - 1:
    _pool.set_host(0x0123456789ABCDEF)   # as if on another host
if scenario in ("apart", "together"):
    mine = sorted(os.sched_getaffinity(0))
    os.sched_setaffinity(0, {mine[rank % len(mine)] if scenario == "apart" else mine[0]})
comm = cxlmpi.wrap(plain.Dup())


def work(units: int) -> int:
    """A fixed amount of computation (no sleeping, no MPI)."""
    total = 0
    for i in range(units * 100_000):
        total += i * i
    return total


def same(call, send: np.ndarray, recv_like: np.ndarray) -> bool:
    """call(comm, send, recv) on the plain and on the wrapped communicator
    with the same data: equal results (and equally untouched where a rank
    receives nothing)?"""
    want = np.full_like(recv_like, -1)
    got = np.full_like(recv_like, -1)
    call(plain, send, want)
    call(comm, send, got)
    return bool(np.array_equal(want, got))


def bcast(c, send, recv, root):
    recv[...] = send if c.Get_rank() == root else 0
    c.Bcast(recv, root)


ok = True
data = np.arange(1 << 12, dtype=np.int64) * (rank + 1)
got = np.empty_like(data)
comm.Allreduce(data, got)                       # sets the pool up
if scenario in ("woken", "other-host"):
    plain.Barrier()
    before = _pool.wait_counts()
    if rank == 0:
        work(40)
    comm.Barrier()      # the others wait here, in the pool, for rank 0
    counts = {k: v - before[k] for k, v in _pool.wait_counts().items()}
    want = np.empty_like(data)
    plain.Allreduce(data, want)
    comm.Allreduce(data, got)
    ok = bool(np.array_equal(want, got))
elif scenario == "loop":
    for it in range(12):
        for n in (8, 1000, 9000):
            x = (np.arange(n, dtype=np.int64) + 7 * it) * (rank + 1)
            root = (it + n) % size
            work(5 * ((it + rank) % 3))         # arrive at different times
            blocks = np.repeat(x[:, None], size, axis=1).ravel()
            ok &= same(lambda c, s, r: c.Allreduce(s, r), x, x)
            ok &= same(lambda c, s, r, root=root: c.Reduce(s, r, op=MPI.MAX, root=root), x, x)
            ok &= same(lambda c, s, r, root=root: bcast(c, s, r, root), x, x)
            ok &= same(lambda c, s, r: c.Allgather(s, r), x, np.empty(n * size, np.int64))
            ok &= same(lambda c, s, r: c.Alltoall(s, r), blocks, blocks)
            ok &= same(lambda c, s, r: c.Reduce_scatter_block(s, r), blocks, x)
            ok &= same(lambda c, s, r: c.Scan(s, r), x, x)
            comm.Barrier()
    ok = ok and cxlmpi.stats()["allreduce"]["pool_calls"] > 0
    counts = _pool.wait_counts()
elif scenario in ("apart", "together"):
    want = np.empty_like(data)
    plain.Allreduce(data, want)
    ok = bool(np.array_equal(want, got))
    counts = {"spin": _shim.pool_of(comm).spin}
else:
    raise SystemExit(f"unknown scenario {scenario!r}")

every = plain.gather({"ok": bool(ok), **counts}, root=0)
if rank == 0:
    print("RESULT " + json.dumps(every), flush=True)
comm.Free()
