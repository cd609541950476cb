"""A program that sets ``mpi4py.rc`` before importing mpi4py.MPI, from its
arguments (``errors=fatal``, ``initialize=false``, ``thread_level=single``,
...), as mpi4py's demo/init-fini does.  Where ``initialize`` is false it
checks that MPI is not started and starts it itself.  Rank 0 prints
``RC <json>``: per rank, whether MPI was started by the import, the error
handler of COMM_WORLD, of COMM_SELF and of a Dup of COMM_WORLD, the thread
level, whether COMM_WORLD is cxlmpi's, and whether a 1 MiB Allreduce on it
equals a plain communicator's on the same data.  Run without cxlmpi and
under ``python -m cxlmpi``: everything but "wrapped" must be the same."""

from __future__ import annotations

import json
import sys

from mpi4py import rc

for arg in sys.argv[1:]:
    key, value = arg.split("=")
    setattr(rc, key, {"true": True, "false": False}.get(value, value))

import numpy as np  # noqa: E402
from mpi4py import MPI  # noqa: E402

started_by_import = MPI.Is_initialized()
if not started_by_import:
    MPI.Init_thread() if rc.threads else MPI.Init()

HANDLERS = {"fatal": MPI.ERRORS_ARE_FATAL, "return": MPI.ERRORS_RETURN,
            "abort": MPI.ERRORS_ABORT}


def handler(comm: MPI.Comm) -> str:
    eh = comm.Get_errhandler()
    try:
        return next((name for name, known in HANDLERS.items() if eh == known), "other")
    finally:
        eh.Free()


comm = MPI.COMM_WORLD
dup = comm.Dup()
plain = MPI.Intracomm(comm)
a = np.random.default_rng([3, comm.Get_rank()]).standard_normal(1 << 17)
got, want = np.empty_like(a), np.empty_like(a)
comm.Allreduce(a, got)
plain.Allreduce(a, want)
mine = {"started_by_import": started_by_import, "world": handler(comm),
        "self": handler(MPI.COMM_SELF), "dup": handler(dup),
        "level": MPI.Query_thread(), "wrapped": type(comm).__module__.startswith("cxlmpi"),
        "equal": bool(np.array_equal(got, want))}
dup.Free()
everyone = plain.gather(mine, root=0)
if plain.Get_rank() == 0:
    print("RC " + json.dumps(everyone), flush=True)
if not started_by_import:   # (mpi4py finalizes only the MPI it started)
    MPI.Finalize()
