"""Stock MPI vs cxlmpi, same job: Allreduce and Bcast of float64.

    mpiexec -n 2 python tools/bench.py [--sizes 8,64K,1M,16M] [--iters N]

For each size the plain and the wrapped communicator alternate (A B A B ...)
over rounds; each round times `iters` back-to-back calls after a warm-up, the
data changes between rounds, and the slowest rank's time counts.  The table
gives the median per-call time of each and the ratio stock / cxlmpi (above 1:
cxlmpi is faster), plus one memcpy of the same size as the physical reference.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from time import perf_counter

import numpy as np
from mpi4py import MPI

import cxlmpi
from cxlmpi.config import parse_size


def _time_calls(comm: MPI.Intracomm, fn, iters: int) -> float:
    comm_plain = MPI.COMM_WORLD
    comm_plain.Barrier()
    t0 = perf_counter()
    for _ in range(iters):
        fn()
    elapsed = (perf_counter() - t0) / iters
    return comm_plain.allreduce(elapsed, op=MPI.MAX)


def bench(name: str, nbytes: int, plain: MPI.Intracomm, wrapped: MPI.Intracomm,
          rounds: int, iters: int) -> dict:
    n = max(1, nbytes // 8)
    rank = plain.Get_rank()
    send = np.empty(n)
    recv = np.empty(n)
    times: dict[str, list[float]] = {"stock": [], "cxlmpi": []}
    for r in range(rounds):
        send[:] = rank + r  # data changes between rounds
        for label, comm in (("stock", plain), ("cxlmpi", wrapped)):
            if name == "Allreduce":
                def call(comm=comm):
                    comm.Allreduce(send, recv)
            else:
                def call(comm=comm):
                    comm.Bcast(send, 0)
            call()  # warm-up
            times[label].append(_time_calls(comm, call, iters))
    ref = np.zeros_like(send)
    t0 = perf_counter()
    for _ in range(iters):
        np.copyto(ref, send)
    memcpy = (perf_counter() - t0) / iters
    stock = statistics.median(times["stock"])
    shim = statistics.median(times["cxlmpi"])
    return {"op": name, "nbytes": n * 8, "stock_us": stock * 1e6,
            "cxlmpi_us": shim * 1e6, "ratio": stock / shim,
            "memcpy_us": memcpy * 1e6}


def _iters_for(nbytes: int) -> int:
    return max(5, min(2000, (64 << 20) // max(nbytes, 1) // 4))


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="8,64K,1M,16M")
    ap.add_argument("--ops", default="Allreduce,Bcast")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--iters", type=int, default=0,
                    help="calls per round (default: by size)")
    args = ap.parse_args(argv)
    plain = MPI.COMM_WORLD
    wrapped = cxlmpi.wrap(plain.Dup())
    rows = []
    for op in args.ops.split(","):
        for text in args.sizes.split(","):
            nbytes = parse_size(text)
            iters = args.iters or _iters_for(nbytes)
            rows.append(bench(op, nbytes, plain, wrapped, args.rounds, iters))
            if plain.Get_rank() == 0:
                r = rows[-1]
                print(f"{r['op']:<10} {r['nbytes']:>10} B  stock {r['stock_us']:>10.1f} us"
                      f"  cxlmpi {r['cxlmpi_us']:>10.1f} us  ratio {r['ratio']:>5.2f}x"
                      f"  memcpy {r['memcpy_us']:>9.1f} us", flush=True)
    wrapped.Free()
    if plain.Get_rank() == 0:
        print(f"# {plain.Get_size()} ranks, {MPI.Get_library_version().splitlines()[0]}",
              file=sys.stderr)


if __name__ == "__main__":
    main()
