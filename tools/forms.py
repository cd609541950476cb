"""Small calls in each message form, stock MPI against cxlmpi, in one job:
what a call costs that passes through (the pool's windows start higher).

    mpiexec -n 2 python tools/forms.py [--calls N] [--rounds R]

One 8-byte element per rank in every form a program may use: a bare numpy
array, a list message (``[buf, MPI.DOUBLE]``), and the v-collectives'
vector messages.  Each round times N calls of each form on a stock
duplicate of COMM_WORLD, then on a wrapped one; rank 0 prints the medians
over the rounds and their ratio (stock time / cxlmpi time).
"""

from __future__ import annotations

import argparse
import time
from typing import Callable

import numpy as np
from mpi4py import MPI

import cxlmpi


def forms(size: int) -> dict[str, Callable[[MPI.Intracomm], None]]:
    a, b = np.ones(1), np.empty(1)
    v = np.empty(size)
    counts, displs = [1] * size, list(range(size))
    return {
        "Allreduce, arrays": lambda c: c.Allreduce(a, b),
        "Allreduce, [buf, MPI.DOUBLE]": lambda c: c.Allreduce([a, MPI.DOUBLE], [b, MPI.DOUBLE]),
        "Bcast, array": lambda c: c.Bcast(b, 0),
        "Bcast, [buf, MPI.DOUBLE]": lambda c: c.Bcast([b, MPI.DOUBLE], 0),
        "Allgatherv": lambda c: c.Allgatherv(a, [v, counts, displs, MPI.DOUBLE]),
        "Gatherv": lambda c: c.Gatherv(a, [v, counts, displs, MPI.DOUBLE], 0),
        "Scatterv": lambda c: c.Scatterv([v, counts, displs, MPI.DOUBLE], b, 0),
        "Alltoallv": lambda c: c.Alltoallv([v, counts, displs, MPI.DOUBLE],
                                           [v.copy(), counts, displs, MPI.DOUBLE]),
        "Reduce_scatter": lambda c: c.Reduce_scatter(v, b, counts),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--calls", type=int, default=20000, help="timed calls per batch")
    ap.add_argument("--rounds", type=int, default=5, help="stock/cxlmpi alternations")
    args = ap.parse_args()
    world = MPI.COMM_WORLD
    plain, wrapped = world.Dup(), cxlmpi.wrap(world.Dup())
    times: dict[tuple[str, str], list[float]] = {}
    calls = forms(world.Get_size())
    for _ in range(args.rounds):
        for side, comm in (("stock", plain), ("cxlmpi", wrapped)):
            for name, call in calls.items():
                for _ in range(args.calls // 10):   # warm-up (and adaptive selection)
                    call(comm)
                comm.Barrier()
                t0 = time.perf_counter()
                for _ in range(args.calls):
                    call(comm)
                times.setdefault((side, name), []).append(
                    (time.perf_counter() - t0) / args.calls * 1e6)
    if world.Get_rank() == 0:
        print(f"{'call (8 B per rank)':<30} {'stock us':>9} {'cxlmpi us':>10} {'speedup':>8}")
        for name in calls:
            s = float(np.median(times["stock", name]))
            x = float(np.median(times["cxlmpi", name]))
            print(f"{name:<30} {s:>9.2f} {x:>10.2f} {s / x:>7.2f}x")
        print(f"# {world.Get_size()} ranks, {MPI.Get_library_version().splitlines()[0]}; "
              f"median of {args.rounds} rounds of {args.calls} calls")
    wrapped.Free()
    plain.Free()


if __name__ == "__main__":
    main()
