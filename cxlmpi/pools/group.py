"""Pool groups: which ranks of a communicator share a pool, and setting up
the pools they share.

Ranks belong to one pool group when they can map the same memory: for shm
and numa pools, the ranks of one node (MPI's COMM_TYPE_SHARED split); for a
pool file or a devdax device, the ranks that see the same partition table
(its random identity, not the host name: a CXL device shared by several
hosts puts ranks of every host in one group).  CXLMPI_POOL_GROUPS=G splits
each of those into G groups of consecutive ranks, so that the hierarchy runs
(and is tested) on one node as if on G hosts.

One group holding every rank: a flat pool (cxlmpi._pool.Pool).  Several
groups: a Hierarchy (cxlmpi.pools.hierarchy) - each collective runs in every
group's pool and through MPI among the group leaders.  Every rank reaches
the same verdict (the outcome of each step is allgathered), and a set-up
error on any rank is raised on every rank.

The node heap: pool-resident arrays (cxlmpi.empty & co., the NumPy hook)
live in one heap per pool group of the whole job -- the arenas of a pool
made, without control traffic of its own, with the first pool of a
communicator that holds every rank of COMM_WORLD.  Every later pool whose
ranks all map that heap is made without arenas and shares it
(Pool.share_heap), so that an array is used in place by every such
communicator (COMM_WORLD, Dup, Split, ...), whichever it was allocated for.
Pools made before it, or whose ranks do not all map it, keep arenas of
their own.
"""

from __future__ import annotations

import functools
import os

from mpi4py import MPI

from .. import config
from .._pool import (
    NO_SPACE,
    UNREACHABLE,
    Pool,
    check_layout,
    configure_emulation,
    cpu_features,
    warn_no_space,
)
from ..errors import CXLMPIConfigError, CXLMPIError, CXLMPIPoolError
from ..memory import backends
from . import agree
from .hierarchy import Hierarchy

__all__ = ["create_pool", "check_agreed", "disagreement", "node_heap", "detach_heap"]

# Every heap this process made, and whether making one failed (tried once
# per process).  The first is the node heap (see above); threads that set
# up communicators at once may each make one, and the others then serve
# their own communicator's pool only.  All are given back at exit.
_heaps: list[Pool] = []
_heap_failed = False
# ... for want of memory or address space: later pools get no arenas of
# their own either (they would want as much)
_heap_short = False


def check_agreed(comm: MPI.Intracomm, cfg: config.Config | None = None) -> None:
    """Collective over `comm`: raise CXLMPIConfigError on every rank, naming
    the variables, when its ranks disagree on a setting of config.AGREED
    (those that choose a call's path or the pool's layout: ranks that
    disagree would take different paths and wait for each other forever).
    Talks through a plain Intracomm on the same handle."""
    mine = (cfg or config.get()).agreed()
    error = disagreement(agree.allgather(comm, mine))
    if error is not None:
        raise CXLMPIConfigError(error)


def disagreement(everyone: list[dict]) -> str | None:
    """What differs between the ranks' `Config.agreed()` values (by rank),
    or None when they all agree."""
    first = everyone[0]
    differ = [name for name in first if any(vals[name] != first[name] for vals in everyone)]
    if not differ:
        return None
    shown = "; ".join(
        f"{name}: " + ", ".join(
            f"rank {r} " + ("(other windows)" if name == "CXLMPI_TUNING" else repr(vals[name]))
            for r, vals in enumerate(everyone) if r == 0 or vals[name] != first[name])
        for name in differ)
    return (f"CXLMPI_* settings differ between ranks ({shown}); launch every rank "
            f"with the same {', '.join(differ)}")


def _raise_any(comm: MPI.Intracomm, error: str | None, kind: type = CXLMPIPoolError) -> None:
    """Collective: raise on every rank if `error` is set on any; a lack of
    memory (NO_SPACE, on every rank that failed) as a CXLMPIPoolError
    whatever `kind`, so that every rank goes on through MPI alike."""
    errors = [e for e in agree.allgather(comm, error) if e]
    if errors:
        short = all(NO_SPACE in e for e in errors)
        raise (CXLMPIPoolError if short else kind)("; ".join(dict.fromkeys(errors)))


def create_pool(comm: MPI.Intracomm) -> Pool | Hierarchy | None:
    """Collective over `comm`: the pool (or hierarchy of pools) its ranks
    share, or None when no two ranks share one.  Raises the same error on
    every rank if setup fails."""
    size = comm.Get_size()
    if size < 2:
        return None
    cfg = config.get()
    check_agreed(comm, cfg)
    spec = backends.parse_spec(cfg.pool)
    if cfg.coherence == "sw" and not cpu_features()["cache_flush"]:
        raise CXLMPIConfigError(
            "CXLMPI_COHERENCE=sw needs user-space cache flushes (x86-64 clwb/"
            "clflushopt/clflush, aarch64 DC CVAC/CIVAC); this CPU has none")
    if cfg.coherence == "emulate":
        configure_emulation(cfg.emulate_seed * 1000003 + comm.Get_rank(), cfg.emulate_fault)
    local, spin, hosts = _pool_group(comm, spec, cfg.pool_groups)
    try:
        groups = _groups(comm, local)
        group = comm if len(groups) == 1 else local
        heap = _share_heap(comm, group, spec, cfg, spin, hosts)
        pool = _flat_or_group_pool(comm, group, spec, cfg, spin, hosts, heap, len(groups) == 1)
        if pool is not None and heap is not None:
            pool.share_heap(heap)
        if len(groups) == 1:
            return pool
        if all(len(g) == 1 for g in groups):
            return None  # no two ranks share memory: MPI alone, no detour
        leader = local.Get_rank() == 0
        leaders = comm.Split(0 if leader else MPI.UNDEFINED, comm.Get_rank())
        hierarchy = Hierarchy(comm.Get_rank(), groups, pool, leaders if leader else None)
        # one figure for the whole communicator (a group of one knows of
        # no host but its own): which windows its calls read (_shim.lo1)
        hierarchy.hosts = max(agree.allgather(comm, hosts))
        return hierarchy
    finally:
        local.Free()


def _flat_or_group_pool(comm: MPI.Intracomm, group: MPI.Intracomm, spec: backends.PoolSpec,
                        cfg: config.Config, spin: bool, hosts: int, heap: Pool | None,
                        flat: bool) -> Pool | None:
    """Collective over `comm`: the pool of this rank's group -- with arenas
    of its own where it shares no node heap and none could be had for want
    of memory (_heap_short) -- and, where the memory or address space for
    its arenas is short, once more without (its arrays are then private).
    A flat pool (`flat`: the communicator's only one) reserves its data
    halves on its first call that moves data (Pool.create `lazy`): one
    whose calls all go to MPI costs a few pages.  (A hierarchy's group
    pools reserve them at once: a call cannot leave for MPI half way.)"""
    # (the group's ranks share `heap` or none; _heap_short is this
    # process's, and a rank whose earlier communicators differ may hold
    # another: agreed in the group, so that all map one layout)
    short = any(agree.allgather(group, _heap_short))
    arenas = heap is None and not short
    try:
        return _make_pool(comm, group, spec, cfg, spin, hosts, arenas=arenas, lazy=flat)
    except CXLMPIPoolError as exc:
        # The error is the same on every rank; whether arenas were asked
        # for is not (one group shares a heap, a group of one has none):
        # agreed over `comm`, since the retry is collective over it -- a
        # group that retried alone ran its collectives against the others'
        # (they paired up wrongly, and a rank waited in Split for ever).
        mine = arenas and cfg.arena_size > 0 and group.Get_size() > 1
        if not (NO_SPACE in str(exc) and any(agree.allgather(comm, mine))):
            raise
    return _make_pool(comm, group, spec, cfg, spin, hosts, arenas=False, lazy=flat)


def _pool_group(comm: MPI.Intracomm, spec: backends.PoolSpec,
                ngroups: int) -> tuple[MPI.Intracomm, bool, int]:
    """Collective: the communicator of this rank's pool group, whether its
    waiters may busy-poll (`_spins`), and on how many hosts (as MPI sees
    them: COMM_TYPE_SHARED groups) its ranks run -- the same on every rank
    of the group."""
    rank = comm.Get_rank()
    node = comm.Split_type(MPI.COMM_TYPE_SHARED, rank)
    try:
        spin = _spins(node)
        # a node's identity: the rank of `comm` that leads it
        node_id = agree.bcast(node, rank)
        if spec.shared_file:
            # The first rank of each node creates a missing pool file and
            # formats an empty table; then every rank opens it.
            error = None
            if node.Get_rank() == 0:
                error = _open_error(spec, create=True)
            _raise_any(comm, error, CXLMPIConfigError)
            error = _open_error(spec, create=False)
            _raise_any(comm, error, CXLMPIConfigError)
            ident = backends.open_device(spec).identity
            idents = sorted(set(agree.allgather(comm, ident)))
            same = comm.Split(idents.index(ident), rank)
        else:
            if spec.kind == "numa":
                backends.numa_check(spec.node)  # the same verdict on every rank
            same = node.Dup()
    finally:
        node.Free()
    try:
        n = same.Get_size()
        local = same.Split(same.Get_rank() * ngroups // n, rank)
    finally:
        same.Free()
    return local, spin, len(set(agree.allgather(local, node_id)))


def _spins(node: MPI.Intracomm) -> bool:
    """Collective over the ranks of one node: busy-poll only with a core
    per rank, that is, when the node's ranks may run on at least as many
    CPUs together (the union of their affinity masks) as there are ranks.
    Else the ranks that share a CPU take turns (yield) before sleeping.

    The union, not this rank's own mask: ranks bound to a core each
    (``mpiexec -bind-to core``) have one CPU apiece, yet one core per rank.
    Not shortened when other processes keep the CPUs busy: a waiter that
    sleeps at once then waits for its core behind them (measured with a
    CPU-bound process beside 2 ranks on 2 cores); a peer queued on the
    waiter's own CPU is yielded to in any case (pool/protocol.pxi).  Every
    rank of the node reaches the same verdict."""
    cpus: set[int] = set().union(*agree.allgather(node, os.sched_getaffinity(0)))
    return node.Get_size() <= len(cpus)


def _open_error(spec: backends.PoolSpec, create: bool) -> str | None:
    try:
        backends.open_device(spec, create=create).check_header(format_if_empty=create)
    except CXLMPIError as exc:
        return str(exc)
    return None


def _groups(comm: MPI.Intracomm, local: MPI.Intracomm) -> list[list[int]]:
    """Every group's ranks of `comm`, groups ordered by their first rank."""
    leader_of = agree.allgather(comm, agree.bcast(local, comm.Get_rank()))
    groups: dict[int, list[int]] = {}
    for r, lead in enumerate(leader_of):
        groups.setdefault(lead, []).append(r)
    return [groups[lead] for lead in sorted(groups)]


def node_heap() -> Pool | None:
    """This process's node heap, None before it is made (or in a child
    made by fork(): the heap is its parent's)."""
    if not _heaps or _heaps[0].closed or _heaps[0].inherited:
        return None
    return _heaps[0]


def detach_heap() -> None:
    """The process is exiting: give the node heaps' partitions back (their
    arrays stay mapped until the process ends)."""
    for heap in _heaps:
        heap.detach()


def _share_heap(comm: MPI.Intracomm, group: MPI.Intracomm, spec: backends.PoolSpec,
                cfg: config.Config, spin: bool, hosts: int) -> Pool | None:
    """Collective over `comm`: the node heap this rank's pool group will
    share -- the one every rank of the group has mapped, or a new one when
    none of them has any and `comm` holds every rank of COMM_WORLD -- or
    None (the group's pool then gets arenas of its own).  The same answer on
    every rank of a group: it is reached from data they all hold."""
    global _heap_failed, _heap_short
    mine = node_heap()
    seen = agree.allgather(group, (None if mine is None else mine.identity, _heap_failed))
    ids = [ident for ident, _ in seen]
    if ids[0] is not None and ids.count(ids[0]) == len(ids):
        shared = mine
    else:
        shared = None
    whole = _holds_world(comm)   # collective: every rank of comm, always
    make = (shared is None and whole and cfg.arena_size > 0
            and all(i is None for i in ids) and not any(failed for _, failed in seen))
    try:
        heap = _make_pool(comm, group, spec, cfg, spin, hosts, heap=True, make=make)
    except CXLMPIPoolError as exc:
        # (raised on every rank) no room for it: arenas of their own, and
        # no second try (a full device would be asked again and again)
        _heap_failed = True
        if NO_SPACE in str(exc):
            _heap_short = True
            warn_no_space("the node heap: pool-resident arrays (cxlmpi.empty & co. "
                          "return private arrays)", cfg.arena_size * group.Get_size())
        return None
    if heap is not None:
        _heaps.append(heap)
        shared = heap
    return shared


def _holds_world(comm: MPI.Intracomm) -> bool:
    """Collective: whether `comm` holds every rank of COMM_WORLD (the same
    answer on every rank)."""
    mine, world = comm.Get_group(), MPI.COMM_WORLD.Get_group()
    try:
        same = MPI.Group.Compare(mine, world) in (MPI.IDENT, MPI.SIMILAR)
    finally:
        mine.Free()
        world.Free()
    return all(agree.allgather(comm, same))


# A node heap's pool proper: the fewest pages per rank the layout takes.
_HEAP_PAGES = 4


def coherence(cfg: config.Config, hosts: int) -> str:
    """The coherence a pool runs: CXLMPI_COHERENCE when set to hw, sw or
    emulate; unset (auto), sw when the pool's ranks run on several hosts
    as MPI sees them (`hosts`: memory shared across hosts is not kept
    coherent by CXL 2.0), else hw.  Every rank of a pool decides alike:
    `hosts` is counted from data they all hold."""
    if cfg.coherence != "auto":
        return cfg.coherence
    return "sw" if hosts > 1 else "hw"


def _make_pool(comm: MPI.Intracomm, group: MPI.Intracomm, spec: backends.PoolSpec,
               cfg: config.Config, spin: bool, hosts: int = 1, *, arenas: bool = True,
               heap: bool = False, make: bool = True, lazy: bool = False) -> Pool | None:
    """Collective over `comm`: the pool of `group` (this rank's pool group,
    possibly `comm` itself; None for a group of one, or when not `make`),
    created by its first rank and mapped by the others, its ranks on
    `hosts` hosts; with arenas for pool-resident arrays when `arenas`.
    `heap`: a node heap -- arenas, and the smallest pool proper that the
    layout allows (it never runs a collective).  `lazy`: its data halves
    reserved on first use (shm pools; Pool.create).  Errors of any group are
    raised on every rank of `comm`."""
    rank, n = group.Get_rank(), group.Get_size()
    mode = coherence(cfg, hosts)
    emulate = mode == "emulate"
    lazy = lazy and not emulate
    pool = None
    error = None
    where = None
    if n == 1 or not make:
        _raise_any(comm, None)
        return None
    size = _HEAP_PAGES * n * 4096 + Pool.layout(n, 0)[0] if heap else cfg.pool_size
    arena = cfg.arena_size if arenas or heap else 0
    if mode == "sw" and not cpu_features()["cache_flush"]:
        error = (f"rank {comm.Get_rank()}: the pool's ranks run on {hosts} hosts, which "
                 f"needs software coherence (CXLMPI_COHERENCE=sw), and this CPU has no "
                 f"user-space cache flushes; set CXLMPI_COHERENCE=hw only if the memory "
                 f"is coherent across them")
    if rank == 0 and error is None:
        try:
            check_layout(n, size)
            if spec.shared_file:
                dev = backends.open_device(spec)
                total = Pool.mapping_nbytes(n, size, arena)
                entry, token, offset, length = dev.claim(total, n)
                try:
                    pool = Pool.map_partition(dev.fd, offset, size, 0, n, True,
                                              token, f"{spec}#{entry}", arena,
                                              dev.wipes, emulate)
                except BaseException:
                    dev.release(entry, token)      # not left claimed by nobody
                    raise
                pool.release = functools.partial(dev.release, entry, token)
                where = (entry, token, offset)
            else:
                pool = Pool.create(0, n, size,
                                   numa_node=spec.node if spec.kind == "numa" else -1,
                                   arena_nbytes=arena, emulate=emulate, lazy=lazy)
                where = pool.locator
        except (OSError, ValueError, CXLMPIError) as exc:
            error = f"rank {comm.Get_rank()} could not create the pool: {exc}"
    where, error = agree.bcast(group, (where, error))
    if error is None and rank != 0:
        try:
            if spec.shared_file:
                entry, token, offset = where
                dev = backends.open_device(spec)
                pool = Pool.map_partition(dev.fd, offset, size, rank, n,
                                          False, token, f"{spec}#{entry}", arena,
                                          dev.wipes, emulate)
                pool.release = functools.partial(dev.release, entry, token)
            else:
                pool = Pool.attach(where, rank, n, size, arena, emulate=emulate, lazy=lazy)
        except (OSError, ValueError) as exc:
            error = f"rank {comm.Get_rank()} could not map pool {where}: {exc}"
    if not spec.shared_file and isinstance(where, tuple):   # (alike in the group)
        # an unnamed segment: where a rank could not open it through the
        # creator's /proc (another pid namespace, say), name it for those
        # (unlinked below, once they have mapped it)
        unreached = UNREACHABLE in (error or "")
        if any(agree.allgather(group, unreached)):
            try:
                where = pool.publish() if rank == 0 else None
            except OSError as exc:
                where, error = None, f"rank {comm.Get_rank()} could not name pool: {exc}"
            where = agree.bcast(group, where)
            if unreached and where is not None:
                try:
                    pool = Pool.attach(where, rank, n, size, arena, emulate=emulate,
                                       lazy=lazy)
                    error = None
                except (OSError, ValueError) as exc:
                    error = f"rank {comm.Get_rank()} could not map pool {where}: {exc}"
    if error and not spec.shared_file:
        error += " (check /dev/shm space and CXLMPI_POOL_SIZE)"
    try:
        _raise_any(comm, error)
    except CXLMPIPoolError:
        if pool is not None:
            pool.close()
        raise
    finally:
        if rank == 0 and pool is not None:
            pool.unlink()  # every rank has mapped it (or failed): drop the name
    pool.timeout_s = cfg.timeout
    pool.spin = spin
    pool.software_coherence = mode in ("sw", "emulate")
    pool.hosts = hosts
    pool.tune(cfg.chunk_size, cfg.rsag_threshold, cfg.zerocopy_threshold)
    return pool
