"""Rank 1 raises before the program imports mpi4py (its rank from the
launcher's environment); the others start MPI and wait in a Barrier for it.
A survivor that gets past the Barrier prints ``SURVIVED <rank>``."""

import os
import sys

rank = os.environ.get("PMI_RANK") or os.environ.get("OMPI_COMM_WORLD_RANK")
if rank == "1":
    raise RuntimeError("rank 1 fails before it starts MPI")

from mpi4py import MPI  # noqa: E402

MPI.COMM_WORLD.Barrier()
sys.stdout.write(f"SURVIVED {MPI.COMM_WORLD.Get_rank()}\n")
