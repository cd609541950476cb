"""PageRank by power iteration on a synthetic web graph, root-centred.

A seeded random directed graph with ``--nodes`` pages is generated in fixed
chunks of source pages (so the graph does not depend on the number of
ranks); every rank owns a contiguous range of chunks, i.e. the out-links of
its pages (a block of *columns* of the link matrix).  Every page has at least
one out-link, so there are no dangling nodes.  Each iteration:

* rank 0 broadcasts the current rank vector ``p`` (``comm.Bcast``);
* every rank compares ``p`` with the previous vector on its own pages and the
  L1 change is combined with a scalar ``comm.allreduce`` (convergence test);
* every rank pushes ``p[j] / outdeg[j]`` along the out-links of its pages into
  a full-length partial vector, and the partials are summed onto the root
  with ``comm.Reduce``;
* rank 0 applies damping and teleportation: ``p = (1 - d) / n + d * sum``.

``--dtype float32`` runs the same algorithm on single-precision vectors
(the checksum is then printed with 4 significant digits, since float32
summation order differs between rank counts).

Run::

    mpiexec -n 2 python examples/pagerank.py
    mpiexec -n 4 python examples/pagerank.py --nodes 4000000 --dtype float32

Rank 0 prints optional progress lines starting with ``# ``, then exactly one
``RESULT pagerank <checksum>`` line (the 2-norm of the final rank vector) and
one ``TIME <seconds>`` line (wall time of the iteration loop).
"""

from __future__ import annotations

import os

# One BLAS/OpenMP thread per MPI process (avoid oversubscribing the cores).
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import argparse

import numpy as np
from mpi4py import MPI

CHUNK = 4096  # source pages per graph-generation chunk
LOCAL_FRACTION = 0.9  # share of links to nearby pages (same "site")
LOCAL_SPAN = 64  # how far a local link may reach


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=1 << 20, help="pages")
    parser.add_argument("--max-degree", type=int, default=6, help="out-degree is 1..max-degree")
    parser.add_argument("--damping", type=float, default=0.85)
    parser.add_argument(
        "--tol",
        type=float,
        default=None,
        help="L1 change tolerance (default: 1e-10 for float64, 1e-6 for float32)",
    )
    parser.add_argument("--maxiter", type=int, default=1000)
    parser.add_argument("--dtype", choices=("float64", "float32"), default="float64")
    parser.add_argument("--seed", type=int, default=7, help="random seed")
    parser.add_argument("--log-every", type=int, default=25, help="progress interval (0: off)")
    return parser.parse_args()


def split_range(n: int, size: int, rank: int) -> tuple[int, int]:
    """Return the half-open range of ``n`` items owned by ``rank``."""
    base, extra = divmod(n, size)
    lo = rank * base + min(rank, extra)
    return lo, lo + base + (1 if rank < extra else 0)


def make_links(
    nodes: int, chunk0: int, chunk1: int, max_degree: int, seed: int
) -> tuple[np.ndarray, np.ndarray]:
    """Out-degrees and link targets of the pages in chunks ``chunk0:chunk1``.

    Each chunk has its own generator, so the graph is the same however the
    chunks are distributed.  Most links go to nearby pages (like links within
    one site); the rest are skewed towards low page numbers, giving a few
    heavily linked hubs.
    """
    degrees = []
    targets = []
    for k in range(chunk0, chunk1):
        rng = np.random.default_rng([seed, k])
        count = min(CHUNK, nodes - k * CHUNK)
        deg = rng.integers(1, max_degree + 1, size=count)
        m = int(deg.sum())
        src = np.repeat(np.arange(k * CHUNK, k * CHUNK + count), deg)
        local = (src + rng.integers(-LOCAL_SPAN, LOCAL_SPAN + 1, size=m)) % nodes
        hub = np.minimum((nodes * rng.random(m) ** 3).astype(np.int64), nodes - 1)
        degrees.append(deg)
        targets.append(np.where(rng.random(m) < LOCAL_FRACTION, local, hub))
    if not degrees:
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
    return np.concatenate(degrees), np.concatenate(targets)


def main() -> None:
    args = parse_args()
    comm = MPI.COMM_WORLD
    rank, size = comm.Get_rank(), comm.Get_size()
    dtype = np.dtype(args.dtype)
    tol = args.tol if args.tol is not None else (1e-10 if dtype == np.float64 else 1e-6)
    n = args.nodes

    nchunks = -(-n // CHUNK)
    chunk0, chunk1 = split_range(nchunks, size, rank)
    lo, hi = min(chunk0 * CHUNK, n), min(chunk1 * CHUNK, n)  # my source pages
    outdeg, dst = make_links(n, chunk0, chunk1, args.max_degree, args.seed)
    inv_outdeg = 1.0 / outdeg
    edges = comm.allreduce(int(dst.size))

    p = np.empty(n, dtype=dtype)
    p_prev = np.zeros(hi - lo, dtype=dtype)
    partial = np.empty(n, dtype=dtype)
    total = np.empty(n, dtype=dtype) if rank == 0 else None
    if rank == 0:
        p.fill(1.0 / n)
        print(
            f"# ranks={size} nodes={n} edges={edges} dtype={dtype} "
            f"vector={n * dtype.itemsize / 2**20:.1f}MiB",
            flush=True,
        )

    delta = float("inf")
    iters = 0
    comm.Barrier()
    t0 = MPI.Wtime()
    for it in range(args.maxiter):
        comm.Bcast(p, root=0)
        mine = p[lo:hi]
        delta = comm.allreduce(float(np.abs(mine - p_prev).sum(dtype=np.float64)))
        iters = it
        if rank == 0 and args.log_every and it % args.log_every == 0:
            print(f"# iter {it} l1_change {delta:.3e}", flush=True)
        if it > 0 and delta < tol:
            break
        p_prev[:] = mine
        weights = np.repeat(mine * inv_outdeg, outdeg)
        np.copyto(partial, np.bincount(dst, weights=weights, minlength=n))
        comm.Reduce(partial, total, op=MPI.SUM, root=0)
        if total is not None:
            np.multiply(total, args.damping, out=p)
            p += (1.0 - args.damping) / n
        iters = it + 1
    comm.Barrier()
    elapsed = MPI.Wtime() - t0

    if rank == 0:
        digits = 6 if dtype == np.float64 else 4
        top = np.argsort(p)[::-1][:3]
        print(f"# iterations {iters} l1_change {delta:.3e} sum {p.sum():.6f} top {top.tolist()}")
        norm = float(np.linalg.norm(p.astype(np.float64)))
        print(f"RESULT pagerank {norm:.{digits}e}")
        print(f"TIME {elapsed:.6f}", flush=True)


if __name__ == "__main__":
    main()
