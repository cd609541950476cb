"""Pool groups: which ranks of a communicator share a pool, and setting up
the pool they share.

The pool group of a communicator is the set of ranks MPI puts in one
shared-memory split (MPI.COMM_TYPE_SHARED).  This version runs the pool path
only when that is the whole communicator (a one-node job, or a communicator
inside one node); a communicator that spans nodes passes every call through.
Every rank reaches the same verdict, because either all ranks are in one
split or none is.
"""

from __future__ import annotations

import os

from mpi4py import MPI

from . import config
from ._pool import Pool
from .errors import CXLMPIConfigError, CXLMPIPoolError

__all__ = ["create_pool"]


def _settings_key(cfg: config.Config) -> tuple:
    # The settings the layout and the dispatch rules depend on.
    return (cfg.pool, cfg.pool_size, cfg.chunk_size, cfg.rsag_threshold,
            cfg.coherence, cfg.disable, sorted(cfg.windows().items()))


def create_pool(comm: MPI.Intracomm) -> Pool | None:
    """Collective over `comm`: the pool its ranks share, or None when they
    cannot share one.  Raises the same error on every rank if setup fails."""
    size = comm.Get_size()
    if size < 2:
        return None
    node = comm.Split_type(MPI.COMM_TYPE_SHARED)
    try:
        whole = node.Get_size() == size
    finally:
        node.Free()
    if not whole:
        return None

    cfg = config.get()
    keys = comm.allgather(_settings_key(cfg))
    if any(k != keys[0] for k in keys):
        bad = [r for r, k in enumerate(keys) if k != keys[0]]
        raise CXLMPIConfigError(
            f"CXLMPI_* settings differ between ranks (ranks {bad} differ from "
            f"rank 0); launch every rank with the same environment")

    rank = comm.Get_rank()
    pool = None
    name = None
    error = None
    if rank == 0:
        try:
            pool = Pool.create(0, size, cfg.pool_size)
            name = pool.name
        except (OSError, ValueError) as exc:
            error = f"rank 0 could not create the pool: {exc}"
    name, error = comm.bcast((name, error), root=0)
    if error is None and rank != 0:
        try:
            pool = Pool.attach(name, rank, size, cfg.pool_size)
        except (OSError, ValueError) as exc:
            error = f"rank {rank} could not map pool {name}: {exc}"
    errors = [e for e in comm.allgather(error) if e]
    if rank == 0 and pool is not None:
        pool.unlink()  # every rank has mapped it (or failed): drop the name
    if errors:
        if pool is not None:
            pool.close()
        raise CXLMPIPoolError(
            "; ".join(dict.fromkeys(errors))
            + " (check /dev/shm space and CXLMPI_POOL_SIZE)")
    pool.timeout_s = cfg.timeout
    # Busy-poll only with a core per rank; oversubscribed ranks yield at once.
    pool.spin = size <= len(os.sched_getaffinity(0))
    pool.software_coherence = cfg.coherence == "sw"
    pool.chunk_nbytes = cfg.chunk_size
    pool.rsag_min_nbytes = cfg.rsag_threshold
    return pool
