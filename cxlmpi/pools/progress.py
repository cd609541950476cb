"""MPI progress for ranks that wait in the pool.

A rank waiting in a pool collective may be the one a peer waits for in MPI:
the target of passive-target RMA, the receiver of a rendezvous send it posted
earlier, a participant of a pending nonblocking collective.  MPI libraries
move such operations only while the process is inside MPI, so a pool waiter
calls MPI_Iprobe now and then (cxl_kernels.h: every 256 polls while it
spins, every 8th once it yields, before every futex sleep), as MPICH's own
shared-memory collectives poll and then call progress.  A call that found
work (it took clearly longer than an idle engine's) means a peer moves
traffic through this rank, packet by packet: the waiter then keeps yielding
and progressing instead of sleeping, until a millisecond passes with no
work (one call per sleep of up to 1 ms made a 1 MiB Accumulate onto a
waiting rank take 0.14 s).  The probe is on a
private duplicate of the pool's communicator that nothing is ever sent to,
so it never matches (MPICH does not run its progress engine for a probe
on a one-rank communicator such as COMM_SELF).  It is made from the thread
that called the collective, inside that MPI call, which every MPI thread
level allows, and without the GIL, so MPI callbacks that need it can run.

cxlmpi links no MPI library (one build serves MPICH and Open MPI), so the
address of MPI_Iprobe is looked up in the library mpi4py loaded.
"""

from __future__ import annotations

import ctypes
import os
from typing import Any

from mpi4py import MPI

__all__ = ["attach", "iprobe_address"]

_found: list[int] = []


def _loaded_libraries() -> list[str]:
    """Shared objects mapped into this process, MPI-looking ones first."""
    paths: list[str] = []
    try:
        with open("/proc/self/maps") as maps:
            for line in maps:
                parts = line.split()
                if len(parts) >= 6 and ".so" in parts[5] and parts[5] not in paths:
                    paths.append(parts[5])
    except OSError:
        pass
    return sorted(paths, key=lambda p: "mpi" not in os.path.basename(p))


def iprobe_address() -> int:
    """The address of MPI_Iprobe in this process's MPI library, or 0."""
    if not _found:
        address = 0
        for path in [None, *_loaded_libraries()]:
            try:
                lib = ctypes.CDLL(path, mode=os.RTLD_NOLOAD | os.RTLD_LAZY) \
                    if path else ctypes.CDLL(None)
                address = ctypes.cast(lib.MPI_Iprobe, ctypes.c_void_p).value or 0
            except (OSError, AttributeError):
                continue
            if address:
                break
        _found.append(address)
    return _found[0]


def attach(pool: Any, comm: MPI.Intracomm, *, calls: bool = True,
           ordering: bool = True) -> MPI.Intracomm | None:
    """Collective over `comm`: a private duplicate of `comm` for `pool` (a
    Pool or a Hierarchy; None: no duplicate), which the caller frees with
    the pool.  `calls`: the pool's waits call MPI progress, probing it
    (where MPI_Iprobe can be found: the same on every rank, one MPI
    library).  `ordering`: the shim ends each pool collective with a
    barrier on it (see cxlmpi._shim `order`).  None when neither applies."""
    address = iprobe_address() if calls else 0
    if pool is None or not (address or ordering):
        return None
    # Every rank duplicates (collective), even one alone in its pool group
    # (a Hierarchy without a pool), which has no waits to make progress in.
    probe = comm.Dup()
    probe.Set_name("cxlmpi-progress")
    local = getattr(pool, "pool", pool)
    if local is not None and address:
        handle_is_int = MPI._sizeof(MPI.Comm) == ctypes.sizeof(ctypes.c_int)
        local.set_progress(address, probe.handle, MPI.ANY_SOURCE, MPI.ANY_TAG, handle_is_int)
    return probe
