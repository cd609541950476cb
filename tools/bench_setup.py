"""What a new communicator costs: its first collective, stock and cxlmpi.

    mpiexec -n 2 python tools/bench_setup.py [--count 50] [--nbytes 8] [--json FILE]

A communicator's pool is set up at its first blocking collective, whatever
its size (the order of calls is the same on every rank, a call's size need
not be).  For ``--count`` new communicators each (``COMM_WORLD.Dup()``;
cxlmpi's wrapped), the arms alternate: stock's first ``Allreduce`` of
``--nbytes``, then cxlmpi's, each after a plain ``Barrier``; the figure is
the slowest rank's time of that first call.  Two modes: the communicators
kept alive to the end (each cxlmpi one sets a pool up), and each freed
before the next (a freed one's pool is taken over by the next of the same
ranks).  Prints the medians (the first few calls of each mode, cold, left
out) and writes them with ``--json``.
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

WARM = 5   # first communicators of each mode, not counted


def first_call(comm: MPI.Intracomm, world: MPI.Intracomm, a: np.ndarray,
               b: np.ndarray) -> float:
    """The slowest rank's time of `comm`'s first Allreduce."""
    world.Barrier()
    t0 = time.perf_counter()
    comm.Allreduce(a, b)
    return world.allreduce(time.perf_counter() - t0, op=MPI.MAX)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--count", type=int, default=50, help="communicators per mode and arm")
    ap.add_argument("--nbytes", type=int, default=8, help="bytes of the first Allreduce")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    world = MPI.COMM_WORLD
    a = np.ones(max(1, args.nbytes // 8))
    b = np.empty_like(a)
    rows = []
    for mode in ("kept", "freed"):
        times: dict[str, list[float]] = {"stock": [], "cxlmpi": []}
        kept: list[MPI.Intracomm] = []
        for _ in range(args.count + WARM):
            for arm in ("stock", "cxlmpi"):
                comm = world.Dup() if arm == "stock" else cxlmpi.wrap(world.Dup())
                times[arm].append(first_call(comm, world, a, b))
                if mode == "kept":
                    kept.append(comm)
                else:
                    comm.Free()
        for comm in kept:
            comm.Free()
        med = {arm: statistics.median(ts[WARM:]) for arm, ts in times.items()}
        rows.append({"mode": mode, "communicators": args.count, "nbytes": args.nbytes,
                     "stock_us": round(med["stock"] * 1e6, 1),
                     "cxlmpi_us": round(med["cxlmpi"] * 1e6, 1)})
        if world.Get_rank() == 0:
            print(f"{mode:5s}  first Allreduce of {args.nbytes} B on a new communicator: "
                  f"stock {rows[-1]['stock_us']:9.1f} us  cxlmpi {rows[-1]['cxlmpi_us']:9.1f} us",
                  flush=True)
    if world.Get_rank() == 0 and args.json:
        from cxlmpi.select.cache import cache_path, cpu_model

        meta = {"tool": "tools/bench_setup.py", "ranks": world.Get_size(),
                "command": shlex.join(["mpiexec", "-n", str(world.Get_size()), "python",
                                       *sys.argv]),
                "date": datetime.datetime.now(datetime.timezone.utc)
                .isoformat(timespec="seconds"),
                "cpu": cpu_model(), "mpi": MPI.Get_library_version().splitlines()[0],
                "selection_cache": cache_path()}
        with open(args.json, "w") as f:
            json.dump({"metadata": meta, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
