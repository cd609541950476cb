"""Communicators that find no room left on a pool file (tests/test_partitions.py):
COUNT duplicates of COMM_WORLD, all kept alive, each runs a 64 KiB
Allreduce; those whose pool the file cannot hold go to MPI with one warning.
Rank 0 prints ``RESULT <json>``: whether every result matched stock MPI's on
every rank, and the Allreduce calls that took the pool and passed through."""

from __future__ import annotations

import json
import sys

import numpy as np
from mpi4py import MPI

import cxlmpi

COUNT = 6


def main() -> None:
    plain = MPI.COMM_WORLD
    send = np.random.default_rng(plain.Get_rank()).standard_normal(8192)
    want = np.empty_like(send)
    plain.Allreduce(send, want)
    comms = [cxlmpi.wrap(plain.Dup()) for _ in range(COUNT)]
    ok = True
    for comm in comms:
        got = np.empty_like(send)
        comm.Allreduce(send, got)
        ok = ok and np.array_equal(got, want)
    ok = all(plain.allgather(bool(ok)))
    row = cxlmpi.stats()["allreduce"]
    for comm in comms:
        comm.Free()
    if plain.Get_rank() == 0:
        sys.stdout.write("RESULT " + json.dumps(
            {"ok": ok, "pool": int(row["pool_calls"]),
             "passed": int(row["passthrough_calls"])}) + "\n")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
