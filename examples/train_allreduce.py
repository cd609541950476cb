"""Data-parallel training of a one-hidden-layer MLP with NumPy and mpi4py.

The program fits a tanh MLP regressor to a synthetic, seeded teacher-student
regression problem.  Training is plain synchronous data parallelism:

* rank 0 initialises the parameters and broadcasts them (``comm.Bcast``);
* the global mini-batch of every step is split across the ranks (uneven
  splits are fine, a rank may even get no samples);
* each rank computes the *summed* gradient of its samples into one flat
  gradient buffer, the buffers are summed in place with ``comm.Allreduce``
  and divided by the global batch size, and every rank applies the same
  SGD-with-momentum update, so the replicas stay identical.

The parameter vector is large (``--params``, default about 1 M float64, i.e.
an 8 MiB gradient Allreduce per step) while the per-step compute is small, so
the run time is dominated by the collectives.  Because the data and the
mini-batches depend only on the seed, the result does not depend on the
number of ranks (up to floating-point summation order).

Run::

    mpiexec -n 2 python examples/train_allreduce.py
    mpiexec -n 4 python examples/train_allreduce.py --steps 100 --params 4000000

Rank 0 prints optional progress lines starting with ``# ``, then exactly one
``RESULT train_allreduce <checksum>`` line (the 2-norm of the final parameter
vector) and one ``TIME <seconds>`` line (wall time of the training loop).
"""

from __future__ import annotations

import os

# One BLAS thread per MPI process: with several ranks per node, threaded BLAS
# oversubscribes the cores and makes every step (and every collective) slow.
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import argparse
import math

import numpy as np
from mpi4py import MPI

D_IN = 64  # input features
D_OUT = 16  # regression targets
TEACHER_HIDDEN = 32


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=500, help="SGD steps")
    parser.add_argument(
        "--params",
        type=int,
        default=1_000_000,
        help="approximate number of model parameters (sets the hidden width)",
    )
    parser.add_argument("--seed", type=int, default=1234, help="random seed")
    parser.add_argument("--samples", type=int, default=4096, help="size of the training set")
    parser.add_argument("--batch", type=int, default=16, help="global mini-batch size per step")
    parser.add_argument(
        "--lr",
        type=float,
        default=None,
        help="learning rate (default: 2 / hidden width)",
    )
    parser.add_argument("--momentum", type=float, default=0.9)
    parser.add_argument(
        "--bucket-mib",
        type=float,
        default=0.0,
        help="reduce the gradient in buckets of this many MiB (0: one Allreduce)",
    )
    parser.add_argument(
        "--overlap",
        action="store_true",
        help="overlap the gradient reduction with the update, as data-parallel "
        "frameworks do: one Iallreduce per bucket (2 MiB unless --bucket-mib), all "
        "posted at once, each bucket updated as soon as its own has completed",
    )
    parser.add_argument(
        "--skip-allreduce",
        action="store_true",
        help="a control, not training: skip the gradient Allreduce (the replicas "
        "drift apart) to time the compute alone, the bound of what any "
        "Allreduce could gain",
    )
    parser.add_argument("--log-every", type=int, default=0, help="progress interval (0: steps/5)")
    parser.add_argument(
        "--comm",
        choices=("world", "dup", "split"),
        default="world",
        help="train on COMM_WORLD, a Dup of it, or a Split (a framework's own "
        "data-parallel group); the result is the same",
    )
    return parser.parse_args()


def split_range(n: int, size: int, rank: int) -> tuple[int, int]:
    """Return the half-open range of ``n`` items owned by ``rank``."""
    base, extra = divmod(n, size)
    lo = rank * base + min(rank, extra)
    return lo, lo + base + (1 if rank < extra else 0)


def hidden_width(params: int) -> int:
    """Hidden width giving roughly ``params`` parameters in total."""
    return max(1, (params - D_OUT) // (D_IN + 1 + D_OUT))


def buckets(n: int, bucket_mib: float, itemsize: int) -> list[slice]:
    """Split ``range(n)`` into gradient buckets of about ``bucket_mib`` MiB."""
    if bucket_mib <= 0:
        return [slice(0, n)]
    step = max(1, int(bucket_mib * 2**20) // itemsize)
    return [slice(i, min(i + step, n)) for i in range(0, n, step)]


def param_count(hidden: int) -> int:
    return D_IN * hidden + hidden + hidden * D_OUT + D_OUT


def unpack(flat: np.ndarray, hidden: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Views (W1, b1, W2, b2) into a flat parameter or gradient vector."""
    i = 0
    w1 = flat[i : i + D_IN * hidden].reshape(D_IN, hidden)
    i += D_IN * hidden
    b1 = flat[i : i + hidden]
    i += hidden
    w2 = flat[i : i + hidden * D_OUT].reshape(hidden, D_OUT)
    i += hidden * D_OUT
    b2 = flat[i : i + D_OUT]
    return w1, b1, w2, b2


def make_dataset(samples: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Synthetic teacher-student regression data, identical on every rank."""
    rng = np.random.default_rng([seed, 1])
    x = rng.standard_normal((samples, D_IN))
    a = rng.standard_normal((D_IN, TEACHER_HIDDEN)) / math.sqrt(D_IN)
    b = rng.standard_normal((TEACHER_HIDDEN, D_OUT)) / math.sqrt(TEACHER_HIDDEN)
    y = np.tanh(x @ a) @ b + 0.01 * rng.standard_normal((samples, D_OUT))
    return x, y


def init_params(flat: np.ndarray, hidden: int, seed: int) -> None:
    """Glorot-style initialisation, written into ``flat`` in place."""
    rng = np.random.default_rng([seed, 2])
    w1, b1, w2, b2 = unpack(flat, hidden)
    w1[...] = rng.standard_normal(w1.shape) / math.sqrt(D_IN)
    b1[...] = 0.0
    w2[...] = rng.standard_normal(w2.shape) / math.sqrt(hidden)
    b2[...] = 0.0


def local_gradient(
    params: np.ndarray,
    grad: np.ndarray,
    x: np.ndarray,
    y: np.ndarray,
    hidden: int,
) -> float:
    """Write the summed gradient of 0.5*||f(x)-y||^2 over the rows of ``x``
    into ``grad`` and return the summed loss."""
    w1, b1, w2, b2 = unpack(params, hidden)
    gw1, gb1, gw2, gb2 = unpack(grad, hidden)
    if x.shape[0] == 0:
        grad.fill(0.0)
        return 0.0
    h = np.tanh(x @ w1 + b1)
    err = h @ w2 + b2 - y
    np.matmul(h.T, err, out=gw2)
    np.sum(err, axis=0, out=gb2)
    dh = (err @ w2.T) * (1.0 - h * h)
    np.matmul(x.T, dh, out=gw1)
    np.sum(dh, axis=0, out=gb1)
    return 0.5 * float(np.sum(err * err))


def update(params: np.ndarray, grad: np.ndarray, velocity: np.ndarray, momentum: float,
           scale: float) -> None:
    """SGD with momentum, in place: velocity = momentum * velocity + grad;
    params -= scale * velocity (grad is scratch afterwards)."""
    velocity *= momentum
    velocity += grad
    np.multiply(velocity, scale, out=grad)
    params -= grad


def main() -> None:
    args = parse_args()
    comm = MPI.COMM_WORLD
    if args.comm == "dup":
        comm = comm.Dup()
    elif args.comm == "split":
        comm = comm.Split(0, comm.Get_rank())
    rank, size = comm.Get_rank(), comm.Get_size()

    hidden = hidden_width(args.params)
    nparams = param_count(hidden)
    lr = args.lr if args.lr is not None else 2.0 / hidden
    log_every = args.log_every or max(1, args.steps // 5)

    x_all, y_all = make_dataset(args.samples, args.seed)

    params = np.empty(nparams, dtype=np.float64)
    if rank == 0:
        init_params(params, hidden, args.seed)
        print(
            f"# ranks={size} hidden={hidden} params={nparams} "
            f"grad={nparams * 8 / 2**20:.1f}MiB lr={lr:.3g} "
            f"buckets={len(buckets(nparams, args.bucket_mib or (2.0 if args.overlap else 0), 8))}"
            f"{' overlapped' if args.overlap else ''}",
            flush=True,
        )
    comm.Bcast(params, root=0)

    grad = np.empty_like(params)
    velocity = np.zeros_like(params)
    bucket_mib = args.bucket_mib or (2.0 if args.overlap else 0.0)
    grad_buckets = buckets(nparams, bucket_mib, grad.itemsize)
    batches_per_epoch = args.samples // args.batch

    comm.Barrier()
    t0 = MPI.Wtime()
    for step in range(args.steps):
        start = (step % batches_per_epoch) * args.batch
        lo, hi = split_range(args.batch, size, rank)
        loss = local_gradient(
            params,
            grad,
            x_all[start + lo : start + hi],
            y_all[start + lo : start + hi],
            hidden,
        )
        if args.overlap and not args.skip_allreduce:
            # the backward pass yields the last buckets first: post them in
            # that order, then update each once its reduction has completed
            order = grad_buckets[::-1]
            requests = [comm.Iallreduce(MPI.IN_PLACE, grad[sl], op=MPI.SUM) for sl in order]
            for sl, request in zip(order, requests):
                request.Wait()
                update(params[sl], grad[sl], velocity[sl], args.momentum, lr / args.batch)
        else:
            for sl in grad_buckets if not args.skip_allreduce else ():
                comm.Allreduce(MPI.IN_PLACE, grad[sl], op=MPI.SUM)
            update(params, grad, velocity, args.momentum, lr / args.batch)
        if (step + 1) % log_every == 0 or step == 0:
            total = comm.allreduce(loss, op=MPI.SUM) / args.batch
            if rank == 0:
                print(f"# step {step + 1} batch_loss {total:.6f}", flush=True)
    comm.Barrier()
    elapsed = MPI.Wtime() - t0

    if rank == 0:
        print(f"RESULT train_allreduce {np.linalg.norm(params):.6e}")
        print(f"TIME {elapsed:.6f}", flush=True)


if __name__ == "__main__":
    main()
