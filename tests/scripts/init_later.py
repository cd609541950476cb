"""A program that starts MPI itself: ``mpi4py.rc.initialize = False``, then
``MPI.Init_thread(level)``, INIT_LEVEL (``multiple`` or ``funneled``, also
set as ``mpi4py.rc.thread_level``, which stock ignores here).  INIT_LATER=import imports cxlmpi
before that (and wraps COMM_WORLD); =runner expects ``python -m cxlmpi``
(COMM_WORLD patched); =stock uses no cxlmpi.  An Allreduce of 2 MiB on
COMM_WORLD, compared with a plain communicator's on the same data; rank 0
prints ``LATER <json>``: every rank's thread level from Init_thread,
whether its COMM_WORLD is cxlmpi's, and the comparison."""

from __future__ import annotations

import json
import os

import mpi4py

mpi4py.rc.initialize = False
mpi4py.rc.thread_level = os.environ["INIT_LEVEL"]

import numpy as np  # noqa: E402
from mpi4py import MPI  # noqa: E402

mode = os.environ["INIT_LATER"]
if mode == "import":
    import cxlmpi
provided = MPI.Init_thread(getattr(MPI, "THREAD_" + os.environ["INIT_LEVEL"].upper()))
comm = cxlmpi.wrap(MPI.COMM_WORLD) if mode == "import" else MPI.COMM_WORLD
plain = MPI.Intracomm(MPI.COMM_WORLD)
a = np.random.default_rng([7, comm.Get_rank()]).standard_normal(1 << 18)
got, want = np.empty_like(a), np.empty_like(a)
comm.Allreduce(a, got)
plain.Allreduce(a, want)
wrapped = type(comm).__module__.startswith("cxlmpi")
everyone = plain.gather({"provided": provided, "wrapped": wrapped,
                         "equal": bool(np.array_equal(got, want))}, root=0)
if plain.Get_rank() == 0:
    print("LATER " + json.dumps(everyone), flush=True)
MPI.Finalize()
