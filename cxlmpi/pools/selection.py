"""A communicator's adaptive selection from set-up to free: `attach` binds
its compiled route table to a Selector (the interface of
cxlmpi.select.interface), starting from what the cache remembers for this
machine; `remember` writes back what it settled."""

from __future__ import annotations

import time

from mpi4py import MPI

from .. import _shim, config
from .._pool import Pool
from ..select import cache
from ..select.interface import RouteTable
from ..select.learner import LEARN_OVERHEAD_S
from ..select.selector import Selector, learned_overhead
from . import agree
from .hierarchy import Hierarchy

__all__ = ["attach", "remember", "HEADER_TIMINGS"]

# Header steps timed across pool groups when a communicator's pool is set up
HEADER_TIMINGS = 4


def attach(pool: Pool | Hierarchy, comm: MPI.Intracomm, cfg: config.Config) -> RouteTable:
    """Collective: the route table of `pool` with its Selector, starting
    from what the cache remembers for this machine (read by rank 0, so that
    every rank starts from the same decisions).  Across pool groups it
    chooses between MPI and the hierarchy (no variants: Hierarchy takes
    none)."""
    prior = None
    machine = None
    across = isinstance(pool, Hierarchy)
    overhead = learned_overhead()   # (rank 0's counts: see below)
    if across:
        # a learning call's header step goes through the leaders' MPI here:
        # its cost, as rank 0 measures it, is what the selector counts
        pool.header(1)          # (the first: MPI's own set-up)
        start = time.perf_counter()
        for _ in range(HEADER_TIMINGS):
            pool.header(1)
        overhead = max(overhead, LEARN_OVERHEAD_S +
                       (time.perf_counter() - start) / HEADER_TIMINGS)
    if comm.Get_rank() == 0:
        groups = [len(g) for g in pool.groups] if across else None
        machine = cache.fingerprint(pool.size, MPI.Get_library_version(), cfg, groups)
        prior = cache.load_cache(cache.cache_path(cfg), machine)
    machine, overhead = agree.bcast(comm, (machine, overhead))
    prior = agree.bcast_kept(comm, "selection cache", prior)
    routes = _shim.Routes(pool)
    selector = Selector(routes, pool.size, pool.chunk_nbytes, streaming=True, prior=prior,
                        variants=not across, overhead_s=overhead)
    selector.machine = machine
    routes.selector = selector
    return routes


def remember(routes: RouteTable | None, pool: Pool | Hierarchy | None) -> None:
    """Write what the selector of `routes` settled into the cache (rank 0
    of the communicator, which read it), once."""
    if routes is None or pool is None:
        return
    selector = routes.selector
    if selector.machine is None or not selector.changed or pool.rank != 0:
        return
    selector.changed = False
    cache.save_cache(cache.cache_path(), selector.machine, selector.decisions())
