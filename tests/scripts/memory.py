"""Resident memory and pool size stay bounded over many large collectives
(tests/test_reliability.py).

    memory.py [ITERATIONS] [BIG_MIB]

On a wrapped dup of COMM_WORLD, runs ITERATIONS back-to-back Allreduce,
Bcast, Allgather and Reduce_scatter_block calls of 64 KiB to 3 MiB
(several chunks; the largest beyond a slot of an 8 MiB pool), each repeated
on the plain communicator on the same handle and compared.  VmRSS
(/proc/self/status) is read after a warm-up (WARMUP iterations: every
collective at every size five times) and at the end.  Then one Allreduce of
BIG_MIB MiB, also compared, and the size of the
pool's mapping in /proc/self/maps.  Rank 0 prints ``MEMORY <json>``, one
report per rank.
"""

from __future__ import annotations

import json
import os
import sys

import numpy as np
from mpi4py import MPI

import cxlmpi

SIZES = [1 << 13, 3 << 14, 1 << 17, 3 << 17, 3 << 16]  # float64 elements: 64 KiB .. 3 MiB
WARMUP = 5 * 4 * len(SIZES)  # every (collective, size) pair five times


def say(line: str) -> None:
    """Print `line` in one write: ranks' lines never interleave."""
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def rss_bytes() -> int:
    """This process's resident set size (VmRSS)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS in /proc/self/status")


def pool_mapping_sizes() -> list[int]:
    """Sizes of this process's mappings of cxlmpi's segments (their files'
    inodes: the segments have no names)."""
    from cxlmpi.pools.state import _states

    inodes = {os.fstat(p.fd).st_ino for s in _states.values() if s.pool is not None
              for p in {s.pool, s.pool.heap}}
    sizes = []
    with open("/proc/self/maps") as f:
        for line in f:
            fields = line.split(maxsplit=5)
            if len(fields) == 6 and int(fields[4]) in inodes:
                start, end = (int(x, 16) for x in fields[0].split("-"))
                sizes.append(end - start)
    return sizes


def main() -> None:
    iterations = int(sys.argv[1]) if len(sys.argv) > 1 else 2000
    big_mib = int(sys.argv[2]) if len(sys.argv) > 2 else 64
    world = MPI.COMM_WORLD
    comm = cxlmpi.wrap(world.Dup())
    plain = MPI.Intracomm(comm)
    rank, size = comm.Get_rank(), comm.Get_size()
    top = max(SIZES) // size * size
    data = np.random.default_rng([5, rank]).standard_normal(top)
    got, want = np.empty(top), np.empty(top)
    ok = True
    rss = {}
    for it in range(iterations):
        if it == WARMUP:
            rss["warm"] = rss_bytes()
        n = SIZES[it % len(SIZES)] // size * size
        kind = it % 4
        if kind == 0:
            comm.Allreduce(data[:n], got[:n])
            plain.Allreduce(data[:n], want[:n])
            ok &= bool(np.allclose(got[:n], want[:n], rtol=1e-12, atol=1e-12))
        elif kind == 1:
            got[:n] = data[:n]
            want[:n] = data[:n]
            comm.Bcast(got[:n], it % size)
            plain.Bcast(want[:n], it % size)
            ok &= bool(np.array_equal(got[:n], want[:n]))
        elif kind == 2:
            comm.Allgather(data[:n // size], got[:n])
            plain.Allgather(data[:n // size], want[:n])
            ok &= bool(np.array_equal(got[:n], want[:n]))
        else:
            comm.Reduce_scatter_block(data[:n], got[:n // size])
            plain.Reduce_scatter_block(data[:n], want[:n // size])
            ok &= bool(np.allclose(got[:n // size], want[:n // size], rtol=1e-12, atol=1e-12))
    rss["end"] = rss_bytes()

    count = (big_mib << 20) // 8
    del got, want
    big = np.random.default_rng([6, rank]).standard_normal(count)
    got, want = np.empty(count), np.empty(count)
    comm.Allreduce(big, got)
    plain.Allreduce(big, want)
    big_ok = bool(np.allclose(got, want, rtol=1e-12, atol=1e-12))
    report = {
        "rank": rank,
        "ok": ok,
        "big_ok": big_ok,
        "big_nbytes": count * 8,
        "rss_warm": rss.get("warm"),
        "rss_end": rss["end"],
        "pool_mappings": pool_mapping_sizes(),
        "pool_calls": {name: row["pool_calls"] for name, row in cxlmpi.stats().items()
                       if name in ("allreduce", "bcast", "allgather",
                                   "reduce_scatter_block")},
    }
    everyone = world.gather(report, root=0)
    comm.Free()
    if rank == 0:
        say("MEMORY " + json.dumps(everyone))


if __name__ == "__main__":
    main()
