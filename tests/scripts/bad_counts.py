"""Absurd counts and displacements in every message form, every rank passing
the same bad message (tests/test_reliability.py): each wrapped call must
raise a clear ValueError (CXLMPIMessageError; where stock mpi4py itself
rejects the message, stock's own exception) before touching memory -- never
crash on a byte size that wrapped around -- and afterwards the communicator
must still be in step: a normal Allreduce equal to stock's.

Rank 0 prints ``CHECKS <json>``: per case, whether every rank passed."""

from __future__ import annotations

import json
import sys

import numpy as np
from mpi4py import MPI

import cxlmpi

N = 1024  # elements: 8 KiB of float64
D = MPI.DOUBLE
# x 8 bytes wraps a 64-bit byte size around to 8 KiB, which the buffer holds
HUGE = (1 << 61) + N
# x 2 blocks x 8 bytes wraps around to 8 KiB
HUGE_BLOCK = (1 << 60) + N // 2


def _raised(call, *args) -> BaseException | None:
    try:
        call(*args)
    except Exception as exc:  # noqa: BLE001 - the exception is the result
        return exc
    return None


def _named(case: str) -> bool:
    return any(part in case for part in sys.argv[1:])


def main() -> None:
    plain = MPI.COMM_WORLD
    comm = cxlmpi.wrap(plain.Dup())
    size, rank = plain.Get_size(), plain.Get_rank()
    a = np.arange(N, dtype=np.float64) + rank
    b = np.zeros(N)
    h = N // size  # a block per rank that fits
    cases = {
        # simple messages: count, (count, displ), count + displ
        "Allreduce count": lambda: comm.Allreduce([a, HUGE, D], [b, HUGE, D]),
        "Allreduce (count, displ)": lambda: comm.Allreduce([a, (HUGE, 0), D],
                                                           [b, (HUGE, 0), D]),
        "Allreduce displ": lambda: comm.Allreduce([a, (8, 1 << 61), D], [b, (8, 1 << 61), D]),
        "Allreduce count, displ": lambda: comm.Allreduce([a, HUGE, 0, D], [b, HUGE, 0, D]),
        "Allreduce huge count and displ": lambda: comm.Allreduce(
            [a, (1 << 62) - 8, (1 << 62) + 8, D], [b, (1 << 62) - 8, (1 << 62) + 8, D]),
        "Reduce": lambda: comm.Reduce([a, HUGE, D], [b, HUGE, D], MPI.SUM, 0),
        "Bcast": lambda: comm.Bcast([b, HUGE, D], 0),
        "Scan": lambda: comm.Scan([a, HUGE, D], [b, HUGE, D]),
        "Exscan": lambda: comm.Exscan([a, HUGE, D], [b, HUGE, D]),
        # one block per rank: count x nblocks x itemsize
        "Allgather": lambda: comm.Allgather([a, HUGE_BLOCK, D], [b, HUGE_BLOCK, D]),
        "Gather": lambda: comm.Gather([a, HUGE_BLOCK, D], [b, HUGE_BLOCK, D], 0),
        "Scatter": lambda: comm.Scatter([a, HUGE_BLOCK, D], [b, HUGE_BLOCK, D], 0),
        "Alltoall": lambda: comm.Alltoall([a, HUGE_BLOCK, D], [b, HUGE_BLOCK, D]),
        "Reduce_scatter_block": lambda: comm.Reduce_scatter_block(
            [a, HUGE_BLOCK * size, D], [b, HUGE_BLOCK, D]),
        "Reduce_scatter": lambda: comm.Reduce_scatter(
            [a, HUGE, D], [b, HUGE_BLOCK, D], [HUGE_BLOCK] * size),
        # vector messages: counts, displacements, their sums
        "Allgatherv counts": lambda: comm.Allgatherv(
            [a, HUGE_BLOCK, D], [b, [HUGE_BLOCK] * size, [0] * size, D]),
        "Allgatherv displs": lambda: comm.Allgatherv(
            [a, h, D], [b, [h] * size, [(1 << 61) + i * h for i in range(size)], D]),
        "Allgatherv negative displ": lambda: comm.Allgatherv(
            [a, h, D], [b, [h] * size, [-h] * size, D]),
        "Allgatherv negative count": lambda: comm.Allgatherv(
            [a, h, D], [b, [-1] * size, [0] * size, D]),
        "Gatherv": lambda: comm.Gatherv(
            [a, h, D], [b, [h] * size, [(1 << 61) + i * h for i in range(size)], D], 0),
        # only the root reads the vector message (as a real program writes it)
        "Gatherv at the root only": lambda: comm.Gatherv(
            [a, h, D], [b, [HUGE_BLOCK] * size, [0] * size, D] if rank == 0 else None, 0),
        "Scatterv at the root only": lambda: comm.Scatterv(
            [a, [h] * size, [(1 << 61)] * size, D] if rank == 0 else None, [b, h, D], 0),
        "Scatterv": lambda: comm.Scatterv(
            [a, [HUGE_BLOCK] * size, [0] * size, D], [b, HUGE_BLOCK, D], 0),
        "Alltoallv": lambda: comm.Alltoallv(
            [a, [HUGE_BLOCK] * size, [0] * size, D],
            [b, [HUGE_BLOCK] * size, [i * h for i in range(size)], D]),
        # one rank's own message only: the header step makes every rank raise
        "Alltoallv on rank 0 only": lambda: comm.Alltoallv(
            [a, [HUGE_BLOCK if rank == 0 else h] * size, [0] * size, D],
            [b, [h] * size, [i * h for i in range(size)], D]),
        "Alltoallv sum of counts": lambda: comm.Alltoallv(
            [a, ([(1 << 62)] * size, [0] * size), D], [b, ([h] * size, None), D]),
    }
    # Negative counts and displacements that stock mpi4py rejects itself:
    # the same exception as stock.
    stock_cases = {
        "Allreduce negative count": (
            lambda c: c.Allreduce([a, -1, D], [b, -1, D])),
        "Allreduce negative displ": (
            lambda c: c.Allreduce([a, (8, -2), D], [b, (8, -2), D])),
        "Bcast negative count": lambda c: c.Bcast([b, -5, D], 0),
        "Allgather negative count": (
            lambda c: c.Allgather([a, -1, D], [b, -1, D])),
        "Reduce_scatter huge recvcounts": (
            lambda c: c.Reduce_scatter(a, b[:h], [h] * (size - 1) + [HUGE])),
        "Reduce_scatter negative recvcounts": (
            lambda c: c.Reduce_scatter(a, b[:h], [h] * (size - 1) + [-1])),
    }
    if len(sys.argv) > 1:  # run only the cases named (by a part of the name)
        cases = {k: v for k, v in cases.items() if _named(k)}
        stock_cases = {k: v for k, v in stock_cases.items() if _named(k)}
    want = np.zeros(N)
    plain.Allreduce(a, want)
    checks: dict[str, bool] = {}

    def in_step() -> bool:
        got = np.zeros(N)
        comm.Allreduce(a, got)
        return bool(np.array_equal(got, want))

    for name, call in cases.items():
        keep = b.copy()
        exc = _raised(call)
        ok = isinstance(exc, cxlmpi.CXLMPIMessageError) and isinstance(exc, ValueError)
        if not ok:
            sys.stderr.write(f"rank {rank}: {name}: {exc!r}\n")
        checks[name] = ok and bool(np.array_equal(b, keep)) and in_step()
    for name, call in stock_cases.items():
        got_exc = _raised(call, comm)
        want_exc = _raised(call, plain)
        ok = want_exc is not None and type(got_exc) is type(want_exc)
        if not ok:
            sys.stderr.write(f"rank {rank}: {name}: {got_exc!r} vs stock {want_exc!r}\n")
        checks[name] = ok and in_step()
    everyone = plain.gather(checks, root=0)
    if rank == 0:
        merged = {k: all(c[k] for c in everyone) for k in checks}
        sys.stdout.write("CHECKS " + json.dumps(merged) + "\n")
        sys.stdout.flush()
    comm.Free()


if __name__ == "__main__":
    main()
