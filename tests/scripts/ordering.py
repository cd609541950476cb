"""What a rank sent through MPI before a collective is there for its peers
after it, through the pool as under stock MPI (tests/test_progress.py).

Run under ``python -m cxlmpi`` (COMM_WORLD is wrapped): each pattern runs
REPS times on the wrapped communicator and REPS times on a stock Intracomm
of the same handle, alternating, and rank 0 prints ``RESULT <json>``:
per pattern, how often a message or an RMA epoch that stock MPI would have
delivered by the end of the collective was missing, under each.

    isend-barrier    4 eager Isends to the right neighbour, Barrier, Iprobe
                     each from the left one (an audit's pattern)
    isend-allreduce  the same around a pool-sized Allreduce (its result
                     compared with stock's)
    isend-bcast      the root's eager Isends to every rank, a pool-sized
                     Bcast from it, each rank's Iprobe
    pscw             mpi4py's test_rma testStartCompletePostTest: rank 0
                     Start, Barrier, Complete, Barrier; rank 1 Post, Test,
                     Barrier, Barrier, Test (must be True)
"""

from __future__ import annotations

import json
import sys

import numpy as np
from mpi4py import MPI

REPS = int(sys.argv[1]) if len(sys.argv) > 1 else 200
N = 1 << 15   # 256 KiB of float64: through the pool under the tests' settings


def isend_then(comm: MPI.Intracomm, collective, rep: int) -> int:
    """Messages from the left neighbour not yet probeable after `collective`."""
    rank, size = comm.Get_rank(), comm.Get_size()
    right, left = (rank + 1) % size, (rank - 1) % size
    reqs = [comm.Isend(np.full(4, rep, "i"), right, tag=4 * (rep % 1000) + k)
            for k in range(4)]
    collective()
    missing = 0
    buf = np.empty(4, "i")
    for k in range(4):
        tag = 4 * (rep % 1000) + k
        if not comm.Iprobe(left, tag):
            missing += 1
        comm.Recv(buf, left, tag)
        assert buf[0] == rep
    MPI.Request.Waitall(reqs)
    return missing


def root_isend_then(comm: MPI.Intracomm, collective, rep: int) -> int:
    """The root's messages not yet probeable after `collective` (rooted at 0)."""
    rank, size = comm.Get_rank(), comm.Get_size()
    reqs = [comm.Isend(np.full(2, rep, "i"), q, tag=rep % 1000) for q in range(1, size)] \
        if rank == 0 else []
    collective()
    missing = 0
    if rank != 0:
        buf = np.empty(2, "i")
        if not comm.Iprobe(0, rep % 1000):
            missing += 1
        comm.Recv(buf, 0, rep % 1000)
        assert buf[0] == rep
    MPI.Request.Waitall(reqs)
    return missing


def pscw(comm: MPI.Intracomm, win: MPI.Win) -> int:
    """1 when rank 1's access epoch test after the Barriers came back False."""
    rank = comm.Get_rank()
    group = win.Get_group()
    missing = 0
    if rank == 0:
        win.Start(group.Incl([1]))
        comm.Barrier()
        win.Complete()
        comm.Barrier()
    elif rank == 1:
        win.Post(group.Incl([0]))
        win.Test()
        comm.Barrier()
        comm.Barrier()
        if not win.Test():
            missing = 1
            win.Wait()
    else:
        comm.Barrier()
        comm.Barrier()
    group.Free()
    return missing


def main() -> None:
    comm = MPI.COMM_WORLD
    plain = MPI.Intracomm(comm)
    rank = comm.Get_rank()
    warm = np.ones(N)
    comm.Allreduce(MPI.IN_PLACE, warm)   # the communicator's pool is set up
    win = MPI.Win.Allocate(8, comm=plain)
    send = np.arange(N, dtype=np.float64) + rank
    out = {}
    for name in ("isend-barrier", "isend-allreduce", "isend-bcast", "pscw"):
        missing = {"stock": 0, "cxlmpi": 0}
        for rep in range(REPS):
            for label, c in (("stock", plain), ("cxlmpi", comm)):
                if name == "isend-barrier":
                    missing[label] += isend_then(c, c.Barrier, rep)
                elif name == "isend-allreduce":
                    got = np.empty(N)
                    missing[label] += isend_then(
                        c, lambda c=c, got=got: c.Allreduce(send, got), rep)
                    want = np.empty(N)
                    plain.Allreduce(send, want)
                    assert np.array_equal(got, want), (label, rep)
                elif name == "isend-bcast":
                    buf = send.copy() if rank == 0 else np.empty(N)
                    missing[label] += root_isend_then(c, lambda c=c, buf=buf: c.Bcast(buf, 0), rep)
                    assert np.array_equal(buf, np.arange(N, dtype=np.float64)), (label, rep)
                elif comm.Get_size() > 1:
                    missing[label] += pscw(c, win)
        out[name] = {k: plain.allreduce(v) for k, v in missing.items()}
    win.Free()
    if rank == 0:
        sys.stdout.write("RESULT " + json.dumps(out) + "\n")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
