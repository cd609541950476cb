"""Which coherence a pool whose ranks MPI sees on several hosts runs
(tests/test_collectives.py, with MPIR_CVAR_NUM_CLIQUES making MPICH see
each rank on a host of its own, and a file: pool that every rank maps).
Rank 0 prints ``RESULT <json>``: whether an Allreduce through the pool gave
stock MPI's result, the lines software coherence flushed, the pool calls,
and how many nodes MPI's COMM_TYPE_SHARED split found."""

from __future__ import annotations

import json
import sys

import numpy as np
from mpi4py import MPI

import cxlmpi

N = 1 << 13  # float64: 64 KiB, through the pool (CXLMPI_TUNING=pool)


def main() -> None:
    plain = MPI.COMM_WORLD
    comm = cxlmpi.wrap(plain.Dup())
    node = plain.Split_type(MPI.COMM_TYPE_SHARED, plain.Get_rank())
    nodes = len(set(plain.allgather(node.bcast(plain.Get_rank(), root=0))))
    node.Free()
    send = np.random.default_rng(plain.Get_rank()).standard_normal(N)
    got, want = np.empty(N), np.empty(N)
    for _ in range(3):
        comm.Allreduce(send, got)
    plain.Allreduce(send, want)
    stats = cxlmpi.stats()
    ok = all(plain.allgather(bool(np.allclose(got, want, rtol=1e-12, atol=1e-12))))
    flushed = min(plain.allgather(stats["coherence"]["flushed_lines"]))
    comm.Free()
    if plain.Get_rank() == 0:
        sys.stdout.write("RESULT " + json.dumps(
            {"ok": ok, "flushed_lines": flushed, "nodes": nodes,
             "pool_calls": stats.get("allreduce", {}).get("pool_calls", 0)}) + "\n")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
