"""Per-communicator pool state: set up at a communicator's first blocking
collective, whatever its size (collective), found by the compiled hot path
through its MPI handle, freed with the communicator (an MPI attribute) or
at exit; and the turning of an algorithm's failure into the exception the
user sees."""

from __future__ import annotations

import atexit
import sys
import threading
from typing import Any

from mpi4py import MPI

from .. import _shim, config, select
from .._pool import (
    MAX_VARIES,
    NO_SPACE,
    OP_CODES,
    TYPE_CODES,
    Pool,
    PoolFailure,
    on_short,
    warn_no_space,
)
from ..errors import (
    CXLMPIError,
    CXLMPIMessageError,
    CXLMPIMismatchError,
    CXLMPIPeerError,
    CXLMPIPoolError,
    CXLMPITimeoutError,
)
from ..memory.backends import NO_ROOM
from . import agree, leaders, progress
from .group import create_pool, detach_heap, node_heap
from .hierarchy import ACROSS_GROUPS, Hierarchy
from .selection import attach, remember

__all__ = ["pool_for", "pool_state", "arena_pool", "run_pool"]


class _State:
    """Pool state of one MPI communicator (shared by every Python object
    with the same handle); `pool` is None when its ranks share no pool, a
    Hierarchy when they span several; `only` (for a Hierarchy) tells, per
    collective of config.COLLECTIVES, whether it runs over the hierarchy."""

    __slots__ = ("pool", "error", "only", "probe", "order", "order_at", "left", "stuck",
                 "routes", "hosts", "key", "held", "wanted")

    def __init__(self, pool: Pool | Hierarchy | None,
                 probe: MPI.Intracomm | None = None, ordering: bool = False) -> None:
        self.pool = pool
        self.probe = probe  # what the pool's waits probe for MPI progress
        # where each pool collective ends with an MPI barrier (None: none;
        # see _shim `order`)
        self.order: MPI.Intracomm | None = probe if ordering else None
        self.order_at: int = MPI._addressof(probe) if self.order is not None else 0
        # barriers on `order` a failed call left behind (_shim `abandon_order`),
        # and whether one may be left that only MPI holds (a late `order`, a
        # failed call other than a refusal)
        self.left: list[MPI.Request] = []
        self.stuck = False
        self.error: CXLMPIError | None = None
        self.only: tuple[bool, ...] | None = None
        # adaptive selection: the compiled route table, bound to its policy
        # (cxlmpi.select.interface)
        self.routes: select.RouteTable | None = None
        # the hosts its pool spans, the same on every rank: which windows
        # apply (_shim.lo1)
        self.hosts: int = getattr(pool, "hosts", 1)
        if isinstance(pool, Hierarchy):
            self.only = tuple(c in ACROSS_GROUPS for c in config.COLLECTIVES)
        # which later communicator may take it over once this one is freed
        # (_spare): None where none may
        self.key: tuple | None = None
        # a closed Hierarchy, whose leaders' communicator waits for `free`
        self.held: Hierarchy | None = None
        # a posted call found the data halves not reserved (it went to MPI,
        # as it may not wait for its peers): the next blocking call reserves
        # them (_shim `ready_wanted`)
        self.wanted = False

    def close(self) -> None:
        remember(self.routes, self.pool)
        self.routes = None
        if self.pool is not None:
            self.pool.close()
            if isinstance(self.pool, Hierarchy):
                self.held = self.pool
            self.pool = None

    def free(self) -> None:
        """Close, and free the progress communicator and the leaders' one
        of a Hierarchy (collective: the communicator itself is being freed
        on every rank)."""
        self.close()
        probe, self.probe, self.order, self.order_at = self.probe, None, None, 0
        held, self.held = self.held, None
        if MPI.Is_finalized():
            return
        if probe is not None:
            left, self.left = self.left, []
            # (a barrier a failed call left on it may still run there: Open
            # MPI crashed progressing one whose communicator had been freed;
            # its peers may never post theirs, so it is not waited for)
            if self.stuck or not leaders.settle(left, 0.1):
                _kept.append((probe, left))
            else:
                probe.Free()
        if held is not None:
            held.free()


# Progress communicators never freed: a failed call left a barrier on them
# that may never complete (with its requests).
_kept: list[tuple[MPI.Intracomm, list[MPI.Request]]] = []

# handle -> state (the dict the compiled hot path reads); an MPI attribute on
# the communicator removes the entry when MPI frees it, whoever frees it.
_states: dict[int, _State] = _shim.states


def _on_free(comm: MPI.Comm, keyval: int, state: _State) -> None:
    # Forget the state first: MPI may give the handle to a new communicator,
    # which must never find this one's (closed) pool.
    if _states.get(comm.handle) is state:
        del _states[comm.handle]
    if isinstance(state.pool, Pool):
        state.pool.drain()   # (its nonblocking calls end first, as MPI's would)
        if state.pool.failure() is not None:   # (one failed: never waited for)
            state.stuck = True   # (its ordering barrier may be late: see free)
    _spare(state)


# The pool states of freed communicators, kept for the next communicator of
# the same processes in the same order (with the same settings): a new pool
# reserves and maps CXLMPI_POOL_SIZE bytes of fresh memory, tens of
# milliseconds (0.25 s for a 64 MiB pool of 2 ranks on a VM), which a
# program that duplicates and frees a communicator per solve or per layer
# would pay every time.  The state moves over whole -- pool, progress probe,
# what adaptive selection learned -- so the next communicator starts where
# the last one stopped.  Its control lines carry on from the last step:
# every rank freed the old communicator after finishing the same pool calls
# on it, so they are in step.  The latest SPARES of the process, oldest
# first; a pool that cannot be set up for want of memory or room lets them
# all go and tries again.
_spares: list[_State] = []
_spares_lock = threading.Lock()
SPARES = 4


def _spare(state: _State) -> None:
    """Keep the state of a communicator being freed for a later one (a
    healthy pool of one host), or let go of it -- of one whose data halves
    could not be had, too (its calls would all go to MPI; a new pool asks
    for the memory again)."""
    pool = state.pool
    if state.key is None or state.error is not None or state.stuck \
            or not isinstance(pool, Pool) or pool.identity is None or pool.short \
            or pool.out_of_step():
        state.free()   # (out of step: its ranks' calls were counted apart)
        return
    remember(state.routes, pool)
    with _spares_lock:
        _spares.append(state)
        old = _trim()
    for spare in old:
        spare.free()


def _trim() -> list[_State]:
    """(under _spares_lock) Drop the oldest spares beyond SPARES; returns
    them, to be freed outside the lock."""
    extra = len(_spares) - SPARES
    if extra <= 0:
        return []
    old = _spares[:extra]
    del _spares[:extra]
    return old


def _let_spares_go() -> bool:
    """Free every spare of this process; whether there were any."""
    with _spares_lock:
        old = _spares[:]
        _spares.clear()
    for spare in old:
        spare.free()
    return bool(old)


def _membership(comm: MPI.Intracomm, cfg: config.Config) -> tuple | None:
    """What a spare pool state must have been made for to serve `comm`: its
    ranks' COMM_WORLD ranks in order, and the settings' values; None for a
    communicator with processes from outside COMM_WORLD (spawned)."""
    group, world = comm.Get_group(), MPI.COMM_WORLD.Get_group()
    try:
        ranks = MPI.Group.Translate_ranks(group, list(range(group.Get_size())), world)
    finally:
        group.Free()
        world.Free()
    if MPI.UNDEFINED in ranks:
        return None
    return tuple(ranks), tuple(sorted(cfg.as_dict().items()))


def _offerable(state: _State, key: tuple, heap: Pool | None) -> bool:
    """Whether `state` may serve a communicator of `key`: made for the same
    ranks and settings, and sharing the node heap if there is one now (a
    pool made before the heap has arenas of its own: pool arrays of the
    heap would not be zero-copy on it, as they are on a new pool)."""
    return state.key == key and (heap is None or state.pool.heap is not state.pool)


def _take_spare(comm: MPI.Intracomm, key: tuple | None) -> _State | None:
    """Collective: a spare state that every rank of `comm` holds (the same
    pool, by its identity), taken out of the spares, or None on every rank.
    A rank that freed the old communicator has finished its calls on it, so
    when all offer the same pool none of them is still inside one.  What a
    rank offers is set aside while the ranks agree: a thread setting up
    another communicator at the same time cannot offer it too (the two
    would end up sharing one pool)."""
    heap = node_heap()
    with _spares_lock:
        offered = [s for s in _spares if key is not None and _offerable(s, key, heap)]
        for s in offered:
            _spares.remove(s)
    state = None
    try:
        offers = agree.allgather(comm, [s.pool.identity for s in offered])
        common = set(offers[0]).intersection(*offers[1:])
        pick = min(common) if common else None
        state = next((s for s in offered if s.pool.identity == pick), None)
    finally:
        rest = [s for s in offered if s is not state]
        old = []
        if rest:
            with _spares_lock:
                _spares[:0] = rest
                old = _trim()
        for spare in old:
            spare.free()
    if state is not None and state.routes is not None:
        state.routes.break_run()   # (a run timed end to end stops at the Free)
    return state


# a pool whose data halves find no room lets the spares go first (as _create)
on_short(_let_spares_go)

_KEYVAL = MPI.Comm.Create_keyval(delete_fn=_on_free)


@atexit.register
def _close_at_exit() -> None:
    """Let go of the pools of communicators never freed, so that a partition
    of a pool file or device is given back when the job ends (MPI has no
    collective left to run: each rank lets go of its own mappings).  This
    runs before cxlmpi.memory.backends closes the devices (atexit is last in, first
    out); pool arrays still alive keep their memory until the process ends
    (Pool.detach).  In a child made by fork() it touches nothing shared."""
    with _spares_lock:
        spares = _spares[:]
    for state in [*_states.values(), *spares]:
        remember(state.routes, state.pool)
        pool = state.pool.pool if isinstance(state.pool, Hierarchy) else state.pool
        if pool is not None:
            pool.detach()
    detach_heap()


_warned_no_room = False


def _state_for(comm: MPI.Intracomm) -> _State:
    """Collective: set up the pool state of `comm` at its first blocking
    collective (_shim `enter`), or the first call that needs it.
    The set-up talks through a plain Intracomm on the same handle: its
    lower-case (object) collectives must not come back here.  A pool that
    /dev/shm (or the pool file) cannot hold leaves the communicator with MPI
    alone, with one warning, and so does a pool device or file without room
    for another partition (every rank sees the same error: all agree).  A
    freed communicator's state of the same ranks is taken over when every
    rank holds it (_spares)."""
    plain = MPI.Intracomm(comm)
    cfg = config.get()
    key = _membership(plain, cfg)
    state = _take_spare(plain, key)
    if state is None:
        state = _new_state(plain, cfg)
        state.key = key
    _states[comm.handle] = state
    comm.Set_attr(_KEYVAL, state)
    return state


def _create(plain: MPI.Intracomm) -> Pool | Hierarchy | None:
    """Collective: create_pool, and once more after the spares are let go
    where they may hold the memory or the partitions it found none of (the
    error is raised on every rank alike) and any rank had some."""
    try:
        return create_pool(plain)
    except CXLMPIPoolError as exc:
        short = NO_SPACE in str(exc) or NO_ROOM in str(exc)
        if not (short and any(agree.allgather(plain, _let_spares_go()))):
            raise
    return create_pool(plain)


def _free_space(pool: str) -> tuple[int | None, str]:
    """(bytes free, where) where a pool of CXLMPI_POOL=`pool` reserves its
    memory: /dev/shm, or the folder of a pool file; (None, "") for a
    device or where it cannot be told."""
    import os

    from ..spec import parse_spec

    spec = parse_spec(pool)
    where = "/dev/shm" if spec.kind in ("shm", "numa") else \
        os.path.dirname(spec.path) if spec.kind == "file" else ""
    try:
        st = os.statvfs(where) if where else None
    except OSError:
        st = None
    return (None, "") if st is None else (st.f_bavail * st.f_frsize, where)


def _new_state(plain: MPI.Intracomm, cfg: config.Config) -> _State:
    """Collective: a new pool state for the communicator behind `plain`."""
    global _warned_no_room
    try:
        pool = _create(plain)
    except CXLMPIPoolError as exc:
        if NO_SPACE in str(exc):
            warn_no_space("a communicator's pool (its collectives go to MPI)",
                          config.get().pool_size, *_free_space(config.get().pool))
        elif NO_ROOM in str(exc):
            if not _warned_no_room:
                _warned_no_room = True
                sys.stderr.write(f"cxlmpi: warning: {exc}. This communicator's "
                                 f"collectives go to MPI (as will those of any other "
                                 f"that finds no room); this warning is not repeated.\n")
                sys.stderr.flush()
        else:
            raise
        pool = None
    probe = progress.attach(pool, plain, calls=cfg.progress, ordering=cfg.ordering)
    state = _State(pool, probe, cfg.ordering)
    if cfg.adaptive and pool is not None:
        state.routes = attach(pool, plain, cfg)
    return state


_VARIES = MAX_VARIES & ((1 << 56) - 1)   # (as Pool.signatures reads it)


def _describe(call: tuple, variants: bool) -> str:
    """A signature of Pool.signatures in words (`variants`: with its pool
    variant, where the ranks' differ)."""
    what, root, op, tcode, nbytes, variant = call
    words = [what]
    if nbytes == _VARIES:   # (a posted v-collective: its ranks' blocks differ)
        words.append("of blocks of each rank's own size")
    elif what not in ("Barrier",) and not what.endswith(" header"):
        words.append(f"of {nbytes} bytes")
    if root >= 0:
        words.append(f"root {root}")
    if op >= 0:
        words.append(f"op {_OP_NAMES.get(op, op)}")
    if tcode >= 0:
        words.append(f"type {_TYPE_NAMES.get(tcode, tcode)}")
    if variants:
        words.append(f"path {select.code_name(1 + variant)}")
    return " ".join(w for w in words if w)


def _mismatch(comm: MPI.Intracomm, state: _State, exc: PoolFailure) -> CXLMPIError:
    """The error of a call whose ranks disagree (every rank raises it; the
    pool stays usable: every rank stopped at the same step).  It is not
    passed on to a later communicator once this one is freed: a rank that
    passed the call to MPI may have counted calls differently."""
    state.key = None
    name = comm.Get_name() or f"communicator {comm.handle:#x}"
    head = (f"cxlmpi: {exc.what} on {name} (rank {comm.Get_rank()} of "
            f"{comm.Get_size()}): the ranks' calls do not match: ")
    pool = state.pool
    refused = _refusers(pool)
    if refused:
        err = CXLMPIMessageError(
            f"cxlmpi: {exc.what} on {name} (rank {comm.Get_rank()} of {comm.Get_size()}): "
            f"rank{'s' if len(refused) > 1 else ''} {', '.join(map(str, refused))} "
            f"refused {'their' if len(refused) > 1 else 'its'} message of a call the "
            "others ran in the pool (a count or block outside its buffer, or a message "
            "the pool cannot take; that rank raised the details); the communicator's pool "
            "is closed, and its collectives raise this error from here")
        state.close()
        state.error = err
        return err
    # across pool groups: the ranks of this rank's group, whose pool compared
    members = pool.groups[pool.group] if isinstance(pool, Hierarchy) else None
    if exc.rank < 0:
        if members is not None:   # (no block checksum across groups)
            return CXLMPIMismatchError(
                head + "ranks of another pool group called otherwise (sizes, roots, ops "
                "and types must agree on every rank, as MPI requires)")
        return CXLMPIMismatchError(
            head + "a rank sends a block of a size its receiver does not expect "
            "(the counts of the ranks must agree, as MPI requires)")
    found = pool.out_of_step() if pool is not None else []
    if found:
        # Not stopped at the same step: one rank saw another's step of a call
        # it made no step of.  Its pool is of no use to these calls any more.
        err = CXLMPIMismatchError(
            head + f"rank{'s' if len(found) > 1 else ''} {', '.join(map(str, found))} "
            "found them out of step (a rank made a collective call on this communicator "
            "that its peers did not make, or made them in another order); its pool is "
            "closed, and its collectives raise this error from here")
        state.close()
        state.error = err
        return err
    calls = pool.signatures() if pool is not None else []
    if not calls:
        return CXLMPIMismatchError(head + "a rank passed the call to MPI")
    seen: dict[tuple, list[int]] = {}
    for q, call in enumerate(calls):
        seen.setdefault(call, []).append(members[q] if members is not None else q)
    variants = len({c[-1] for c in calls}) > 1
    parts = [f"rank{'s' if len(qs) > 1 else ''} {', '.join(map(str, qs))}: "
             f"{_describe(c, variants)}" for c, qs in seen.items()]
    return CXLMPIMismatchError(
        head + "; ".join(parts) + " (sizes, roots, ops and types must agree on every rank, "
        "as MPI requires)")


def refuse(comm: MPI.Intracomm, state: _State, err: Exception) -> Exception:
    """This rank refused its message (`err`, a CXLMPIMessageError) of a call
    that its peers run in the pool: they are told (Pool.refuse) and raise
    too; its pool closes, and its later collectives on `comm` raise."""
    if state.pool is not None:
        state.pool.refuse()
    name = comm.Get_name() or f"communicator {comm.handle:#x}"
    state.close()
    state.error = CXLMPIMessageError(
        f"cxlmpi: {name} (rank {comm.Get_rank()}): this rank refused its message of an "
        f"earlier pool call ({err}); its peers raised, and the communicator's collectives "
        "raise this error from here")
    return err


def _refusers(pool: Pool | Hierarchy | None) -> list[int]:
    """The ranks that refused their message of a call (Pool.refused)."""
    return pool.refused() if pool is not None and not pool.closed else []


def _fail(comm: MPI.Intracomm, state: _State, exc: PoolFailure) -> CXLMPIError:
    """Turn an algorithm failure into the exception the user sees; after a
    timeout or a dead peer the pool of this communicator is unusable (ranks
    are out of step).  A peer that refused its message may have closed its
    pool before this rank looked (it left): the refusal is what it says."""
    if exc.mismatch or not exc.revoked and _refusers(state.pool):
        return _mismatch(comm, state, exc)
    pool = state.pool
    missing = pool.missing_ranks() if pool is not None else [exc.rank]
    name = comm.Get_name() or f"communicator {comm.handle:#x}"
    if exc.timed_out:
        timeout = config.get().timeout
        err: CXLMPIError = CXLMPITimeoutError(
            f"cxlmpi: {exc.what} on {name} (rank {comm.Get_rank()} of "
            f"{comm.Get_size()}) timed out after {timeout:g} s waiting for "
            f"ranks {missing} (raise CXLMPI_TIMEOUT if they are just slow)")
    elif exc.revoked:
        err = CXLMPIPoolError(_revoked(exc, name, comm.Get_rank()))
    elif exc.passed:   # (run_pool: steps every rank agreed to take in the pool)
        err = CXLMPIMismatchError(
            f"cxlmpi: {exc.what} on {name} (rank {comm.Get_rank()} of {comm.Get_size()}): "
            f"the ranks' calls do not match: a peer sent a call to MPI while this rank "
            f"was in the pool steps of a collective that every rank had agreed to run "
            f"there (the peer raised between two of them, or called otherwise)")
    elif getattr(exc, "left", False):
        err = CXLMPIPoolError(
            f"cxlmpi: {exc.what} on {name} (rank {comm.Get_rank()}): rank {exc.rank} "
            f"left the collective without finishing it: a pool call of its own failed "
            f"(it raised an error there: a timeout, a peer it found gone) and it closed "
            f"the communicator's pool, which is closed here too")
    elif getattr(exc, "closed", False):
        err = CXLMPIPoolError(
            f"cxlmpi: {exc.what} on {name} (rank {comm.Get_rank()}): the communicator's "
            f"pool closed with this nonblocking call in flight (the process is exiting, "
            f"or an earlier call on it failed)")
    elif exc.still_s > 0:
        err = CXLMPIPeerError(
            f"cxlmpi: {exc.what} on {name} (rank {comm.Get_rank()}): rank {exc.rank} "
            f"runs on another host and its heartbeat stood still for {exc.still_s:.1f} s, "
            f"past its lease of {exc.lease_s:g} s (CXLMPI_LEASE_BEATS x CXLMPI_HEARTBEAT): "
            f"judged gone; if it was only stopped (a paused container, SIGSTOP, a "
            f"debugger), raise CXLMPI_LEASE_BEATS above the longest pause")
    else:
        err = CXLMPIPeerError(
            f"cxlmpi: {exc.what} on {name} (rank {comm.Get_rank()}): rank "
            f"{exc.rank} died in the middle of the collective")
    state.close()
    state.error = err
    return err


def order_timed_out(comm: MPI.Intracomm, state: _State, what: str) -> CXLMPIError:
    """The error of a rank whose pool collective ended, but whose MPI
    barrier after it (CXLMPI_ORDERING) did not within CXLMPI_TIMEOUT: a
    peer left the collective on another branch (it raised) or stands
    still.  The pool of the communicator is unusable from here."""
    name = comm.Get_name() or f"communicator {comm.handle:#x}"
    err = CXLMPITimeoutError(
        f"cxlmpi: {what} on {name} (rank {comm.Get_rank()} of {comm.Get_size()}) "
        f"finished in the pool, but a peer did not reach its end within "
        f"{config.get().timeout:g} s (it raised an error there, or stands still; "
        f"raise CXLMPI_TIMEOUT if it is just slow)")
    state.close()
    state.error = err
    return err


def _revoked(exc: PoolFailure, name: str, rank: int) -> str:
    """What a rank whose pool memory was handed to another job is told."""
    cfg = config.get()
    return (f"cxlmpi: {exc.what} on {name} (rank {rank}): the pool's partition (or the node "
            f"heap's, where its pool-resident arrays live) was "
            f"handed to another job: this process stood still (stopped, paused, in a "
            f"debugger) for longer than its lease, {cfg.lease_beats} x "
            f"{cfg.heartbeat:g} s (CXLMPI_LEASE_BEATS x CXLMPI_HEARTBEAT), and a job on "
            f"another host took the memory; this call's results cannot be trusted. "
            f"Raise CXLMPI_LEASE_BEATS above the longest pause")


_shim.bind(_state_for, _fail, order_timed_out, refuse)

_OP_NAMES = {code: name for name, code in OP_CODES.items()}
_TYPE_NAMES = {code: name for name, code in TYPE_CODES.items()}


def pool_for(comm: MPI.Intracomm) -> Pool | None:
    """The pool of `comm`, set up on first use (collective then: every rank
    must call it at the same point), or None when its ranks share no pool.
    Raises the error that broke the pool, if one did."""
    return _shim.pool_of(comm)


def pool_state(comm: MPI.Intracomm) -> Pool | Hierarchy | None:
    """What `comm`'s ranks share: a Pool, a Hierarchy of pools, or None (set
    up on first use, collective then)."""
    _shim.pool_of(comm, 0)  # Barrier: every kind of pool state runs it
    return _states[comm.handle].pool


def fresh_state(comm: MPI.Intracomm) -> Pool | Hierarchy | None:
    """`pool_state`, set up afresh and kept to `comm`: no freed
    communicator's state is taken over (this process's spares are let go,
    whichever ranks they were for), and this one's is not passed on when
    it is freed -- what it learned, or a path a benchmark pinned it to,
    must not carry over to the next; what it learns still goes to the
    selection cache unless CXLMPI_CACHE is off.  Collective over `comm`,
    before its first pool call; for a communicator of every rank (as the
    benchmark's), whose ranks hold the same spares."""
    _let_spares_go()
    pool = pool_state(comm)
    _states[comm.handle].key = None
    return pool


def arena_pool(comm: MPI.Intracomm | None) -> Pool | None:
    """The pool whose arenas hold `comm`'s pool-resident arrays -- the node
    heap its pool (its group's, when it spans several) shares, or that
    pool's own arenas; None without arenas: collective the first time.
    `comm` None: COMM_WORLD.  None after MPI_Finalize (or before MPI_Init),
    when no collective can run and none may be set up."""
    if MPI.Is_finalized() or not MPI.Is_initialized():
        return None
    comm = MPI.COMM_WORLD if comm is None else comm
    pool = pool_state(comm) if not isinstance(comm, MPI.Intercomm) else None
    if isinstance(pool, Hierarchy):
        pool = pool.pool
    if pool is not None:
        pool = pool.heap
    if pool is not None and pool.arena_nbytes() == 0:
        return None
    return pool


def run_pool(comm: MPI.Intracomm, pool: Pool, method: str, *args: Any) -> Any:
    """Call `pool.<method>(*args)`, turning an algorithm failure into the
    CXLMPIError the user sees (timeout, dead peer)."""
    return _shim.run_pool(comm, getattr(pool, method), *args)
