"""Arrays after an explicit MPI.Finalize(): NumPy's own allocation goes on
working there, and so must cxlmpi.empty & co. (private memory: no
collective can use the pool any more) and the NumPy allocation hook; a
pool set up before Finalize stays out of the way.  With AFTER_FINALIZE=
early, no pool was made before.  Prints ``AFTER <json>`` on every rank."""

from __future__ import annotations

import json
import os

import numpy as np
from mpi4py import MPI

import cxlmpi

comm = cxlmpi.wrap(MPI.COMM_WORLD)
rank = comm.Get_rank()
a = np.arange(1 << 18, dtype=np.float64) + rank
want = np.empty_like(a)
MPI.Intracomm(MPI.COMM_WORLD).Allreduce(a, want)
found = {}
if os.environ.get("AFTER_FINALIZE") != "early":
    got = np.empty_like(a)
    comm.Allreduce(a, got)
    found["allreduce"] = bool(np.array_equal(got, want))
    kept = cxlmpi.empty(1 << 18)
    kept[:] = want
MPI.Finalize()
x = cxlmpi.zeros(1 << 20)
x += 1.0
big = np.ones(1 << 22)
found.update(empty=float(x.sum()) == float(1 << 20) and not cxlmpi.is_resident(x),
             numpy=float(big.sum()) == float(1 << 22))
if "allreduce" in found:
    found["kept"] = bool(np.array_equal(kept, want))
print("AFTER " + json.dumps(found), flush=True)
