"""Stock MPI vs cxlmpi, same job: collectives of float64, side by side.

    mpiexec -n 2 python tools/bench.py [--ops Allreduce,Bcast,...]
                                       [--sizes 8,64K,1M,16M] [--iters N]

Collectives: Allreduce, Reduce, Bcast, Allgather, Gather, Scatter, Alltoall,
Reduce_scatter_block, Scan, Exscan (`--ops all`).  Sizes are the bytes of
the whole message (all blocks together for the block collectives).

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


def _time_calls(fn, iters: int) -> float:
    comm_plain = MPI.COMM_WORLD
    comm_plain.Barrier()
    t0 = perf_counter()
    for _ in range(iters):
        fn()
    elapsed = (perf_counter() - t0) / iters
    return comm_plain.allreduce(elapsed, op=MPI.MAX)


def _make_call(name: str, comm: MPI.Intracomm, n: int, rank: int, size: int):
    """A zero-argument call of collective `name` moving about n doubles in
    all (n per rank for the rooted and all-reduce ones, n // size per block
    for the block ones), and its buffers (refilled between rounds)."""
    block = max(1, n // size)
    if name in ("Allreduce", "Reduce", "Scan", "Exscan"):
        send, recv = np.empty(n), np.empty(n)
        fn = {"Allreduce": lambda: comm.Allreduce(send, recv),
              "Reduce": lambda: comm.Reduce(send, recv, MPI.SUM, 0),
              "Scan": lambda: comm.Scan(send, recv),
              "Exscan": lambda: comm.Exscan(send, recv)}[name]
    elif name == "Bcast":
        send = recv = np.empty(n)
        fn = lambda: comm.Bcast(send, 0)  # noqa: E731
    elif name in ("Allgather", "Gather"):
        send, recv = np.empty(block), np.empty(block * size)
        fn = (lambda: comm.Allgather(send, recv)) if name == "Allgather" else \
            (lambda: comm.Gather(send, recv, 0))
    elif name == "Scatter":
        send, recv = np.empty(block * size), np.empty(block)
        fn = lambda: comm.Scatter(send, recv, 0)  # noqa: E731
    elif name == "Alltoall":
        send, recv = np.empty(block * size), np.empty(block * size)
        fn = lambda: comm.Alltoall(send, recv)  # noqa: E731
    elif name == "Reduce_scatter_block":
        send, recv = np.empty(block * size), np.empty(block)
        fn = lambda: comm.Reduce_scatter_block(send, recv)  # noqa: E731
    else:
        raise SystemExit(f"bench: unknown collective {name}")
    return fn, send


def bench(name: str, nbytes: int, plain: MPI.Intracomm, wrapped: MPI.Intracomm,
          rounds: int, iters: int) -> dict:
    n = max(1, nbytes // 8)
    rank, size = plain.Get_rank(), plain.Get_size()
    calls = {label: _make_call(name, comm, n, rank, size)
             for label, comm in (("stock", plain), ("cxlmpi", wrapped))}
    times: dict[str, list[float]] = {"stock": [], "cxlmpi": []}
    for r in range(rounds):
        for label, (call, send) in calls.items():
            send[:] = rank + r  # data changes between rounds
            call()  # warm-up
            times[label].append(_time_calls(call, iters))
    ref = np.zeros(n)
    src = np.ones(n)
    t0 = perf_counter()
    for _ in range(iters):
        np.copyto(ref, src)
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
    if args.ops == "all":
        args.ops = ("Allreduce,Reduce,Bcast,Allgather,Gather,Scatter,Alltoall,"
                    "Reduce_scatter_block,Scan,Exscan")
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
                print(f"{r['op']:<20} {r['nbytes']:>10} B  stock {r['stock_us']:>10.1f} us"
                      f"  cxlmpi {r['cxlmpi_us']:>10.1f} us  ratio {r['ratio']:>5.2f}x"
                      f"  memcpy {r['memcpy_us']:>9.1f} us", flush=True)
    wrapped.Free()
    if plain.Get_rank() == 0:
        print(f"# {plain.Get_size()} ranks, {MPI.Get_library_version().splitlines()[0]}",
              file=sys.stderr)


if __name__ == "__main__":
    main()
