"""Receive buffers larger than the message (tests/test_receive_counts.py):
mpi4py infers a receive count from the buffer, and MPICH takes a count
above what arrives.  Each case runs CALLS times on the wrapped communicator
and on a plain one, on fresh buffers filled with a marker: what arrives in
every receive buffer (the first n of each 2n elements) must equal stock's
bit for bit.  (Not the rest: MPICH's own algorithms fill it with what they
forward, which differs from call to call at 3 ranks.)  Sizes: one whose
sent bytes are below the pool's threshold and whose receive buffers are
above it, and one inside the pool's windows.

    mpiexec -n N python recv_larger.py [CALLS]

Rank 0 prints ``RESULT <json>``: per case, whether every rank matched."""

from __future__ import annotations

import json
import sys

import numpy as np
from mpi4py import MPI

import cxlmpi
from cxlmpi import config

CALLS = int(sys.argv[1]) if len(sys.argv) > 1 else 300
MARK = -7.0
D = MPI.DOUBLE
IN_PLACE = MPI.IN_PLACE


def cases(p: int, r: int, n: int) -> dict:
    """name -> call(comm, data) returning this rank's receive buffer (or
    None where MPI writes none); blocks of n doubles, received into 2n."""
    def gather(c, data):
        rb = np.full(2 * n * p, MARK)
        c.Gather(data[:n], rb if r == 0 else None, 0)
        return rb

    def gather_in_place(c, data):
        rb = np.full(2 * n * p, MARK)
        if r == 0:
            rb[:n] = data[:n]
            c.Gather(IN_PLACE, rb, 0)
        else:
            c.Gather(data[:n], None, 0)
        return rb

    def scatter(c, data):
        rb = np.full(2 * n, MARK)
        c.Scatter(data if r == 0 else None, rb, 0)
        return rb

    def scatter_in_place(c, data):
        rb = np.full(2 * n, MARK)
        if r == 0:
            c.Scatter(data, IN_PLACE, 0)
            return data
        c.Scatter(None, rb, 0)
        return rb

    def allgather(c, data):
        rb = np.full(2 * n * p, MARK)
        c.Allgather(data[:n], rb)
        return rb

    def alltoall(c, data):
        rb = np.full(2 * n * p, MARK)
        c.Alltoall(data, rb)
        return rb

    def alltoallv(c, data):
        rb = np.full(2 * n * p, MARK)
        c.Alltoallv([data, [n] * p, [i * n for i in range(p)], D],
                    [rb, [2 * n] * p, [2 * i * n for i in range(p)], D])
        return rb

    def gatherv(c, data):
        rb = np.full(2 * n * p, MARK)
        c.Gatherv(data[:n], [rb, [2 * n] * p, [2 * i * n for i in range(p)], D]
                  if r == 0 else None, 0)
        return rb

    def scatterv(c, data):
        rb = np.full(2 * n, MARK)
        c.Scatterv([data, [n] * p, [i * n for i in range(p)], D] if r == 0 else None, rb, 0)
        return rb

    return {f.__name__: f for f in (gather, gather_in_place, scatter, scatter_in_place,
                                    allgather, alltoall, alltoallv, gatherv, scatterv)}


def main() -> None:
    plain = MPI.COMM_WORLD
    p, r = plain.Get_size(), plain.Get_rank()
    threshold = config.get().threshold
    sizes = sorted({max(1, (threshold - 1) // (8 * p)), 1024})
    checks: dict[str, bool] = {}
    for n in sizes:
        for name, call in cases(p, r, n).items():
            # a fresh communicator per case: its first call sets the pool up
            comm = cxlmpi.wrap(plain.Dup())
            ref = plain.Dup()
            ok = True
            for it in range(CALLS):
                data = np.arange(n * p, dtype=np.float64) + 1000 * r + it
                got = call(comm, data.copy())
                want = call(ref, data.copy())
                if len(got) % (2 * n) == 0:   # what arrives: n of each 2n
                    got = got.reshape(-1, 2 * n)[:, :n]
                    want = want.reshape(-1, 2 * n)[:, :n]
                if not np.array_equal(got, want):
                    if ok:
                        bad = np.nonzero((got != want).ravel())[0]
                        sys.stderr.write(f"rank {r}: {name} n={n} call {it}: differs at "
                                         f"{bad[:4]} ({len(bad)} elements)\n")
                    ok = False
            checks[f"{name} n={n}"] = ok
            comm.Free()
            ref.Free()
    everyone = plain.gather(checks, root=0)
    if r == 0:
        merged = {k: all(c[k] for c in everyone) for k in checks}
        sys.stdout.write("RESULT " + json.dumps(merged) + "\n")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
