"""Pure NumPy compute on pool arrays against private ones (no communication):
what placing a program's arrays in the pool (``--alloc``) costs or gains
outside the collectives.

    mpiexec -n 2 python -m cxlmpi tools/pool_pages.py           # private
    mpiexec -n 2 python -m cxlmpi --alloc tools/pool_pages.py   # in the pool

Two loops, timed on rank 0 after a Barrier:

  temps  20 rounds of 64 MiB temporaries (``a * 0.5 + 0.25``): glibc maps
         and faults each afresh, the pool's arena hands the same blocks back;
  pages  200 passes touching one element per 4 KiB page of a 256 MiB array:
         bound by the TLB, so by the page size (NumPy asks for transparent
         huge pages for its own large arrays; shared memory gets them only
         where the kernel's shmem_enabled allows: ``python -m cxlmpi --info``).

Rank 0 prints ``POOL_PAGES alloc=<bool> resident=<bool> temps <s> pages <s>``.
"""

from __future__ import annotations

import time

import numpy as np
from mpi4py import MPI

import cxlmpi
import cxlmpi.alloc


def main() -> None:
    world = MPI.COMM_WORLD
    a = np.random.default_rng(world.Get_rank()).standard_normal(1 << 23)
    b = np.empty_like(a)
    world.Barrier()
    t0 = time.perf_counter()
    for _ in range(20):
        c = a * 0.5 + 0.25
        np.multiply(c, 0.9, out=b)
        a, b = b, a
    temps = time.perf_counter() - t0
    x = np.ones(1 << 25)
    x += 1
    t0 = time.perf_counter()
    for _ in range(200):
        x[::512] += 1.0
    pages = time.perf_counter() - t0
    resident = cxlmpi.is_resident(x)   # (collective the first time: every rank)
    if world.Get_rank() == 0:
        print(f"POOL_PAGES alloc={cxlmpi.alloc.active()} resident={resident} "
              f"temps {temps:.3f} pages {pages:.3f}", flush=True)


if __name__ == "__main__":
    main()
