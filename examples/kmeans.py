"""Mini-batch k-means clustering with NumPy and mpi4py.

The program clusters a seeded synthetic data set (Gaussian blobs around
``--clusters`` hidden centres) into ``--clusters`` clusters, the mini-batch
way (Sculley, "Web-scale k-means clustering", WWW 2010): every iteration
draws a small batch of points, assigns each to its nearest centroid, and
moves the centroids towards the points they won.  Distributed over the ranks:

* rank 0 picks the initial centroids and broadcasts them (``comm.Bcast``);
* every iteration each rank assigns its share of the global batch (the
  batch depends only on the seed and the iteration, not on the number of
  ranks) and sums, per cluster, the points it assigned and their count;
* the per-cluster sums and counts are combined with ``comm.Allreduce``;
* rank 0 updates the centroids (each moves towards the mean of its new
  points with a per-cluster learning rate 1 / points seen so far; a cluster
  with none keeps its place) and broadcasts them (``comm.Bcast``), and a
  scalar ``comm.allreduce`` of the batch's inertia is logged now and then.

The centroid table is large (``--clusters`` x ``--dim`` float64: 4 MiB by
default) while each rank's batch is small, so the run time is dominated by
the collectives.  The assignment uses the same arithmetic on every rank
count; only the order of the sums in the Allreduce may differ.

Run::

    mpiexec -n 2 python examples/kmeans.py
    mpiexec -n 4 python examples/kmeans.py --iters 100 --clusters 8192

Rank 0 prints optional progress lines starting with ``# ``, then exactly one
``RESULT kmeans <checksum>`` line (the 2-norm of the final centroids, to 6
significant digits) and one ``TIME <seconds>`` line (wall time of the
iteration loop).
"""

from __future__ import annotations

import os

# One BLAS thread per MPI process: with several ranks per node, threaded BLAS
# oversubscribes the cores and makes every step (and every collective) slow.
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import argparse

import numpy as np
from mpi4py import MPI


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clusters", type=int, default=4096, help="k")
    parser.add_argument("--dim", type=int, default=128, help="dimensions of a point")
    parser.add_argument("--batch", type=int, default=64, help="points per iteration (global)")
    parser.add_argument("--iters", type=int, default=200, help="mini-batch iterations")
    parser.add_argument("--seed", type=int, default=1234, help="random seed")
    parser.add_argument("--log-every", type=int, default=0, help="progress interval (0: iters/5)")
    return parser.parse_args()


def split_range(n: int, size: int, rank: int) -> tuple[int, int]:
    """Return the half-open range of ``n`` items owned by ``rank``."""
    base, extra = divmod(n, size)
    lo = rank * base + min(rank, extra)
    return lo, lo + base + (1 if rank < extra else 0)


def batch(it: int, args: argparse.Namespace, centres: np.ndarray) -> np.ndarray:
    """The global mini-batch of iteration ``it``: points drawn around the
    hidden centres, the same on every rank."""
    rng = np.random.default_rng([args.seed, 2, it])
    which = rng.integers(0, len(centres), args.batch)
    return centres[which] + 0.5 * rng.standard_normal((args.batch, args.dim))


def assign(points: np.ndarray, centroids: np.ndarray,
           sq_norms: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(nearest centroid of each point, its squared distance)."""
    if len(points) == 0:
        return np.empty(0, dtype=np.intp), np.empty(0)
    d2 = sq_norms[None, :] - 2.0 * (points @ centroids.T)
    labels = np.argmin(d2, axis=1)
    dist = d2[np.arange(len(points)), labels] + np.einsum("ij,ij->i", points, points)
    return labels, dist


def main() -> None:
    args = parse_args()
    comm = MPI.COMM_WORLD
    rank, size = comm.Get_rank(), comm.Get_size()
    log_every = args.log_every or max(1, args.iters // 5)
    k, d = args.clusters, args.dim

    centres = np.random.default_rng([args.seed, 1]).uniform(-10.0, 10.0, (k, d))
    centroids = np.empty((k, d))
    if rank == 0:
        init = np.random.default_rng([args.seed, 3])
        centroids[...] = centres[init.permutation(k)] + init.standard_normal((k, d))
        print(f"# ranks={size} clusters={k} dim={d} batch={args.batch} "
              f"centroids={centroids.nbytes / 2**20:.1f}MiB", flush=True)
    comm.Bcast(centroids, root=0)

    # Dense per-cluster tables, reduced whole; only the rows a batch touches
    # change, so only those are cleared (and their centroids' norms redone).
    sums = np.zeros((k, d))
    counts = np.zeros(k)
    seen = np.zeros(k)
    sq_norms = np.einsum("ij,ij->i", centroids, centroids)
    lo, hi = split_range(args.batch, size, rank)

    comm.Barrier()
    t0 = MPI.Wtime()
    for it in range(args.iters):
        mine = batch(it, args, centres)[lo:hi]
        labels, dist = assign(mine, centroids, sq_norms)
        np.add.at(sums, labels, mine)
        np.add.at(counts, labels, 1.0)
        comm.Allreduce(MPI.IN_PLACE, sums, op=MPI.SUM)
        comm.Allreduce(MPI.IN_PLACE, counts, op=MPI.SUM)
        won = np.flatnonzero(counts)   # the same on every rank
        if rank == 0:
            seen[won] += counts[won]
            rate = (counts[won] / seen[won])[:, None]
            centroids[won] += rate * (sums[won] / counts[won][:, None] - centroids[won])
        comm.Bcast(centroids, root=0)
        sq_norms[won] = np.einsum("ij,ij->i", centroids[won], centroids[won])
        sums[won] = 0.0
        counts[won] = 0.0
        if (it + 1) % log_every == 0 or it == 0:
            inertia = comm.allreduce(float(dist.sum()), op=MPI.SUM) / args.batch
            if rank == 0:
                print(f"# iter {it + 1} batch_inertia {inertia:.6f}", flush=True)
    comm.Barrier()
    elapsed = MPI.Wtime() - t0

    if rank == 0:
        print(f"RESULT kmeans {np.linalg.norm(centroids):.6e}")
        print(f"TIME {elapsed:.6f}", flush=True)


if __name__ == "__main__":
    main()
