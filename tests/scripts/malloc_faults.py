"""Page faults of a NumPy loop after a large Allreduce (tests/test_collectives.py):
argv[1] ``stock`` runs it on COMM_WORLD, ``cxlmpi`` on a wrapped duplicate
(CXLMPI_TUNING=pool: through the pool).  Then the loop allocates and touches
three 1 MiB arrays and frees them, as a program's temporaries; rank 0 prints ``RESULT
<json>``: the minor page faults of the loop on every rank, and whether the
Allreduce gave stock MPI's result."""

from __future__ import annotations

import json
import resource
import sys

import numpy as np
from mpi4py import MPI

NBYTES = 8 << 20
LOOPS = 50


def faults() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


def main() -> None:
    plain = MPI.COMM_WORLD
    send = np.full(NBYTES // 8, plain.Get_rank() + 1.0)
    got = np.empty_like(send)
    if sys.argv[1] == "cxlmpi":
        import cxlmpi

        comm = cxlmpi.wrap(plain.Dup())
    else:
        comm = plain
    want = np.empty_like(send)
    comm.Allreduce(send, got)
    before = faults()
    for _ in range(LOOPS):
        temps = [np.ones((1 << 20) // 8) for _ in range(3)]
        del temps
    loop = faults() - before
    # (stock MPI's check after the loop: its own call adapts malloc too)
    plain.Allreduce(send, want)
    ok = all(plain.allgather(bool(np.array_equal(got, want))))
    counts = plain.gather(loop)
    if plain.Get_rank() == 0:
        sys.stdout.write("RESULT " + json.dumps({"ok": ok, "faults": counts}) + "\n")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
