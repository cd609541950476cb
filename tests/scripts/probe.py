"""An ordinary mpi4py program (it never imports cxlmpi itself) for
tests/test_runner.py and tests/test_runner_info.py: large collectives on
MPI.COMM_WORLD checked against stock mpi4py on the same MPI handle.

Run it as a file, as the module `probe` or via `-c "from probe import main;
main()"`; rank 0 prints one line ``PROBE <json>``: a report per rank.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys

import numpy as np
from mpi4py import MPI
from mpi4py.MPI import COMM_WORLD

N = 1 << 17  # 1 MiB of int64 / float64: far above the threshold, several chunks


def say(line: str) -> None:
    """Print `line` in one write: ranks' lines never interleave."""
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def _name(obj: object) -> str:
    return f"{type(obj).__module__}.{type(obj).__qualname__}"


def main() -> None:
    comm = MPI.COMM_WORLD
    plain = MPI.Intracomm(comm)  # a stock Intracomm on the same handle
    rank, size = comm.Get_rank(), comm.Get_size()
    rng = np.random.default_rng([7, rank])
    ints = rng.integers(-1000, 1000, N, dtype=np.int64)
    floats = rng.standard_normal(N)

    got_i, want_i = np.empty_like(ints), np.empty_like(ints)
    comm.Allreduce(ints, got_i, op=MPI.SUM)
    plain.Allreduce(ints, want_i, op=MPI.SUM)
    got_f, want_f = np.empty_like(floats), np.empty_like(floats)
    comm.Allreduce(floats, got_f, op=MPI.SUM)
    plain.Allreduce(floats, want_f, op=MPI.SUM)

    got_b = floats.copy()
    want_b = floats.copy()
    comm.Bcast(got_b, root=size - 1)
    plain.Bcast(want_b, root=size - 1)

    got_r = np.zeros_like(ints) if rank == 0 else None
    want_r = np.zeros_like(ints) if rank == 0 else None
    comm.Reduce(ints, got_r, op=MPI.MAX, root=0)
    plain.Reduce(ints, want_r, op=MPI.MAX, root=0)
    comm.Barrier()

    cxl = sys.modules.get("cxlmpi")
    report = {
        "rank": rank,
        "pid": os.getpid(),
        "argv": sys.argv,
        "name": __name__,
        "comm_type": _name(comm),
        "from_import_type": _name(COMM_WORLD),
        "plain_type": _name(plain),
        "is_cxlcomm": cxl is not None and isinstance(comm, cxl.CXLComm),
        "same_handle": plain.handle == comm.handle,
        "allreduce_int_equal": bool(np.array_equal(got_i, want_i)),
        "allreduce_float_close": bool(np.allclose(got_f, want_f, rtol=1e-12, atol=1e-12)),
        "bcast_equal": bool(np.array_equal(got_b, want_b)),
        "reduce_equal": rank != 0 or bool(np.array_equal(got_r, want_r)),
        "checksum": hashlib.sha256(got_i.tobytes()).hexdigest(),
        "pool_calls": None if cxl is None else {
            k: v["pool_calls"] for k, v in cxl.stats().items() if "pool_calls" in v},
    }
    reports = plain.gather(report, root=0)
    if rank == 0:
        say("PROBE " + json.dumps(reports))


if __name__ == "__main__":
    main()
