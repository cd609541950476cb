"""Nonblocking object collectives: the node heap against MPI, and stock.

    CXLMPI_OBJECTS=1 mpiexec -n 2 python tools/bench_objects.py [--json FILE]

For each call (``ibcast``, ``iallgather``, ``iallreduce``) and each size of
a numpy float64 array sent as the object, three arms alternate in one job,
``--rounds`` times, each round timing ``--reps`` calls posted and waited
back to back (the slowest rank's time per call): stock mpi4py's blocking
object collective on a plain communicator (stock has no nonblocking one),
cxlmpi's nonblocking call with its large frames in the node heap, and the
same call with every frame through MPI point-to-point (the heap hidden from
it: what CXLMPI_OBJECTS=0 does).  Prints the medians and the ratios
``stock/heap`` and ``mpi/heap`` (above 1: the heap is faster).
"""

from __future__ import annotations

import argparse
import datetime
import json
import shlex
import statistics
import sys
import time

import numpy as np
from mpi4py import MPI

import cxlmpi
from cxlmpi.communicator import objects_nb

SIZES = {"64K": 64 << 10, "256K": 256 << 10, "1M": 1 << 20, "8M": 8 << 20}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    if not cxlmpi.config.get().objects:
        sys.exit("bench_objects: set CXLMPI_OBJECTS=1 (without it no pickle takes the heap)")
    world = MPI.COMM_WORLD
    plain, comm = world.Dup(), cxlmpi.wrap(world.Dup())
    comm.Allreduce(np.zeros(1 << 16), np.zeros(1 << 16))   # (its pool set up)
    heap_of = objects_nb.heap_of
    calls = {
        "ibcast": (lambda c, x: c.bcast(x, 0), lambda c, x: c.ibcast(x, 0)),
        "iallgather": (lambda c, x: c.allgather(x), lambda c, x: c.iallgather(x)),
        "iallreduce": (lambda c, x: c.allreduce(x), lambda c, x: c.iallreduce(x)),
    }

    def timed(run, *args_of_run) -> float:
        plain.Barrier()
        t0 = time.perf_counter()
        for _ in range(args.reps):
            run(*args_of_run)
        return plain.allreduce((time.perf_counter() - t0) / args.reps, op=MPI.MAX)

    def waited(post, c, x) -> None:
        post(c, x).wait()

    rows = []
    for name, (blocking, posted) in calls.items():
        for label, nbytes in SIZES.items():
            x = np.arange(nbytes // 8, dtype=np.float64) + world.Get_rank()
            arms: dict[str, list[float]] = {"stock": [], "heap": [], "mpi": []}
            for _ in range(args.rounds):
                arms["stock"].append(timed(blocking, plain, x))
                arms["heap"].append(timed(waited, posted, comm, x))
                objects_nb.heap_of = lambda c: None
                arms["mpi"].append(timed(waited, posted, comm, x))
                objects_nb.heap_of = heap_of
            med = {arm: statistics.median(ts) for arm, ts in arms.items()}
            rows.append({"call": name, "size": label, "nbytes": nbytes,
                         **{f"{arm}_us": round(t * 1e6, 1) for arm, t in med.items()},
                         "stock_over_heap": round(med["stock"] / med["heap"], 2),
                         "mpi_over_heap": round(med["mpi"] / med["heap"], 2)})
            if world.Get_rank() == 0:
                r = rows[-1]
                print(f"{name:11s} {label:>4s}  stock {r['stock_us']:9.1f} us  heap "
                      f"{r['heap_us']:9.1f} us  mpi {r['mpi_us']:9.1f} us  stock/heap "
                      f"{r['stock_over_heap']:.2f}x  mpi/heap {r['mpi_over_heap']:.2f}x",
                      flush=True)
    pooled = cxlmpi.stats()["iallgather(obj)"]["pool_calls"]
    if world.Get_rank() == 0:
        print(f"iallgather(obj) pool calls: {pooled}")
        if args.json:
            from cxlmpi.select.cache import cpu_model
            meta = {"tool": "tools/bench_objects.py", "ranks": world.Get_size(),
                    "command": "CXLMPI_OBJECTS=1 " + shlex.join(
                        ["mpiexec", "-n", str(world.Get_size()), "python", *sys.argv]),
                    "date": datetime.datetime.now(datetime.timezone.utc)
                    .isoformat(timespec="seconds"),
                    "cpu": cpu_model(), "mpi": MPI.Get_library_version().splitlines()[0],
                    "rounds": args.rounds, "reps": args.reps}
            with open(args.json, "w") as f:
                json.dump({"metadata": meta, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
