"""Distributed Jacobi iteration for a 2-D screened Poisson (Helmholtz) problem.

Solves ``A x = b`` where ``A`` is the 5-point finite-difference operator
``(4 + sigma) I - (sum of the 4 grid neighbours)`` on an ``ny x nx`` grid with
zero Dirichlet boundaries, and ``b`` is a seeded random right-hand side.  For
``sigma > 0`` the matrix is strictly diagonally dominant, so Jacobi converges.

The code uses a simple root-centred data layout that is common in
master/worker style MPI codes:

* rank 0 generates ``b`` and broadcasts it once (``comm.Bcast``);
* rank 0 owns the authoritative iterate ``x`` and broadcasts it at the start
  of every iteration (``comm.Bcast``, one full vector);
* every rank owns a contiguous block of grid rows, i.e. a block of *columns*
  of ``A``, and computes that block's contribution ``A[:, cols] @ x[cols]``
  into a full-length partial vector; the partials are summed with
  ``comm.Allreduce`` (one full vector);
* each rank forms the residual ``b - A x`` on its own rows and the squared
  residual norm is combined with a scalar ``comm.allreduce`` for the
  convergence test;
* rank 0 applies the Jacobi update ``x += (b - A x) / diag(A)``.

After the loop the true residual is recomputed once more with ``comm.Reduce``
to the root as a check.  The iterates do not depend on the number of ranks
(up to floating-point summation order).

Run::

    mpiexec -n 2 python examples/jacobi_solver.py
    mpiexec -n 4 python examples/jacobi_solver.py --nx 1024 --ny 1024 --tol 1e-10

Rank 0 prints optional progress lines starting with ``# ``, then exactly one
``RESULT jacobi_solver <checksum>`` line (the 2-norm of the solution) and one
``TIME <seconds>`` line (wall time of the iteration loop).
"""

from __future__ import annotations

import os

# One BLAS/OpenMP thread per MPI process (avoid oversubscribing the cores).
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import argparse
import math

import numpy as np
from mpi4py import MPI


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nx", type=int, default=1024, help="grid columns")
    parser.add_argument("--ny", type=int, default=512, help="grid rows")
    parser.add_argument("--sigma", type=float, default=0.1, help="screening shift (> 0)")
    parser.add_argument("--tol", type=float, default=1e-8, help="relative residual tolerance")
    parser.add_argument("--maxiter", type=int, default=5000)
    parser.add_argument("--seed", type=int, default=2024, help="random seed")
    parser.add_argument("--log-every", type=int, default=200, help="progress interval (0: off)")
    return parser.parse_args()


def split_range(n: int, size: int, rank: int) -> tuple[int, int]:
    """Return the half-open range of ``n`` items owned by ``rank``."""
    base, extra = divmod(n, size)
    lo = rank * base + min(rank, extra)
    return lo, lo + base + (1 if rank < extra else 0)


def column_block_matvec(
    x: np.ndarray,
    out: np.ndarray,
    nx: int,
    ny: int,
    diag: float,
    row0: int,
    row1: int,
) -> None:
    """Write ``A[:, cols] @ x[cols]`` into ``out`` (full length ``nx*ny``).

    ``cols`` are the unknowns of grid rows ``row0:row1``.  Their contribution
    reaches grid rows ``row0-1 .. row1`` (the 5-point stencil is symmetric);
    everything else in ``out`` is zero.
    """
    out.fill(0.0)
    if row1 <= row0:
        return
    grid_x = x.reshape(ny, nx)
    grid_y = out.reshape(ny, nx)
    blk = grid_x[row0:row1]
    mine = grid_y[row0:row1]
    np.multiply(blk, diag, out=mine)
    mine[:, 1:] -= blk[:, :-1]  # x[i, j-1] feeds row (i, j)
    mine[:, :-1] -= blk[:, 1:]  # x[i, j+1] feeds row (i, j)
    # x[i, j] feeds row (i+1, j): target grid rows row0+1 .. row1
    hi = min(row1 + 1, ny)
    grid_y[row0 + 1 : hi] -= blk[: hi - row0 - 1]
    # x[i, j] feeds row (i-1, j): target grid rows row0-1 .. row1-2
    lo = max(row0 - 1, 0)
    grid_y[lo : row1 - 1] -= blk[lo + 1 - row0 :]


def main() -> None:
    args = parse_args()
    comm = MPI.COMM_WORLD
    rank, size = comm.Get_rank(), comm.Get_size()

    nx, ny = args.nx, args.ny
    n = nx * ny
    diag = 4.0 + args.sigma
    row0, row1 = split_range(ny, size, rank)
    lo, hi = row0 * nx, row1 * nx  # my rows of A / unknowns (flat indices)

    b = np.empty(n, dtype=np.float64)
    x = np.zeros(n, dtype=np.float64)
    if rank == 0:
        b[:] = np.random.default_rng(args.seed).standard_normal(n)
        print(
            f"# ranks={size} grid={ny}x{nx} n={n} vector={n * 8 / 2**20:.1f}MiB sigma={args.sigma}",
            flush=True,
        )
    comm.Bcast([b, MPI.DOUBLE], root=0)
    bnorm = math.sqrt(comm.allreduce(float(np.dot(b[lo:hi], b[lo:hi]))))

    partial = np.empty(n, dtype=np.float64)
    ax = np.empty(n, dtype=np.float64)
    resid = np.empty(hi - lo, dtype=np.float64)
    rel = math.inf
    iters = 0

    comm.Barrier()
    t0 = MPI.Wtime()
    for it in range(args.maxiter):
        comm.Bcast(x, root=0)
        column_block_matvec(x, partial, nx, ny, diag, row0, row1)
        comm.Allreduce(partial, ax, op=MPI.SUM)
        np.subtract(b[lo:hi], ax[lo:hi], out=resid)
        rel = math.sqrt(comm.allreduce(float(np.dot(resid, resid)))) / bnorm
        iters = it
        if rank == 0 and args.log_every and it % args.log_every == 0:
            print(f"# iter {it} rel_residual {rel:.3e}", flush=True)
        if rel <= args.tol:
            break
        if rank == 0:
            ax -= b
            ax *= -1.0 / diag
            x += ax
        iters = it + 1
    comm.Barrier()
    elapsed = MPI.Wtime() - t0

    # Independent check of the final residual, reduced to the root only.
    comm.Bcast(x, root=0)
    column_block_matvec(x, partial, nx, ny, diag, row0, row1)
    comm.Reduce(partial, ax if rank == 0 else None, op=MPI.SUM, root=0)
    if rank == 0:
        check = float(np.linalg.norm(b - ax)) / bnorm
        print(f"# iterations {iters} rel_residual {rel:.3e} check {check:.3e}")
        print(f"RESULT jacobi_solver {np.linalg.norm(x):.6e}")
        print(f"TIME {elapsed:.6f}", flush=True)


if __name__ == "__main__":
    main()
