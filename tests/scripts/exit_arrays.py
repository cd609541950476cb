"""Run under a plain ``mpiexec python exit_arrays.py`` (no ``-m cxlmpi``)
with a ``file:``/``dax:`` pool: pool arrays are still alive when the
interpreter exits.  Rank 0 prints ``EXIT <json>``, every rank's verdict on
the Allreduce of pool arrays against the plain communicator's; the driver
then checks that the
partition was given back and that nothing was raised at exit."""

from __future__ import annotations

import json

import numpy as np
from mpi4py import MPI

import cxlmpi

comm = cxlmpi.wrap(MPI.COMM_WORLD)
plain = MPI.Intracomm(comm)
rank = comm.Get_rank()
a = cxlmpi.empty(1 << 16, comm=comm)          # module globals: alive at exit
a[:] = np.arange(a.size) * (rank + 1)
b = cxlmpi.zeros_like(a, comm=comm)
want = np.empty_like(a)
comm.Allreduce(a, b)
plain.Allreduce(a, want)
everyone = plain.gather(bool(np.array_equal(b, want)) and cxlmpi.is_resident(a, comm=comm))
if rank == 0:
    print(f"EXIT {json.dumps(everyone)}", flush=True)
