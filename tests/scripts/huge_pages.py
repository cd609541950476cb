"""Run by tests/test_alloc.py under `python -m cxlmpi` (2 ranks): whether a
pool array's memory is mapped in huge pages (the kernel's own account, in
/proc/self/smaps), beside what `python -m cxlmpi --info` reports for the
pool, and whether NumPy's arrays went to the pool (the hook, on by default
where pool memory gets huge pages); an Allreduce of a NumPy array against
stock MPI's.  Prints ``HUGE {"mapped": bool, "reported": bool, "hook": bool,
"placed": bool, "same": bool}`` for every rank, in a list."""

from __future__ import annotations

import json

import numpy as np
from mpi4py import MPI

import cxlmpi
import cxlmpi.alloc
from cxlmpi import config
from cxlmpi.memory import pages


def pmd_mapped(address: int) -> int:
    """ShmemPmdMapped (kB) of the mapping that holds `address`."""
    inside = False
    with open("/proc/self/smaps") as f:
        for line in f:
            head = line.split()[0]
            if "-" in head and not head.endswith(":"):
                lo, hi = (int(x, 16) for x in head.split("-"))
                inside = lo <= address < hi
            elif inside and head == "ShmemPmdMapped:":
                return int(line.split()[1])
    return 0


comm = MPI.COMM_WORLD            # the wrapped one (python -m cxlmpi)
stock = MPI.Intracomm(comm)      # the same handle, stock methods
a = cxlmpi.empty(32 << 20, dtype=np.uint8)
assert cxlmpi.is_resident(a), "the array is not in the pool"
a[:] = 1
x = np.full(1 << 18, comm.Get_rank() + 1.0)   # 2 MiB: the hook's, where it is on
got, want = np.zeros_like(x), np.zeros_like(x)
comm.Allreduce(x, got)
stock.Allreduce(x, want)
row = {"mapped": pmd_mapped(a.ctypes.data) > 0,
       "reported": pages.huge_pages(config.get().pool)[0],
       "hook": cxlmpi.alloc.active(),
       "placed": bool(cxlmpi.is_resident(x)),
       "same": bool(np.array_equal(got, want))}
rows = stock.gather(row, root=0)
if comm.Get_rank() == 0:
    print("HUGE " + json.dumps(rows), flush=True)
