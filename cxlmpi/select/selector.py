"""The learning of one communicator's pool (`Selector`): a Learner per class,
the report in flight between header steps, and the compiled route table it
keeps up to date.  It is the policy half of the interface declared in
cxlmpi.select.interface: the compiled half calls `report`, `delivered` and
`pick`; it hands the route table the paths through `set`, `start_run` and
`first_runs`."""

from __future__ import annotations

import threading
from typing import Any

from .. import config
from .classes import (
    CUT_SHORT,
    MPI_PATH,
    NCLASSES,
    SLOW,
    candidates,
    class_floor,
    code_name,
    first_run,
    first_runs,
    run_length,
    size_class,
)
from .interface import RouteTable
from .learner import LEARN_OVERHEAD_S, MIN_INTERVAL, Learner

__all__ = ["Selector", "decision", "learned_overhead", "OVERHEAD_FIGURES"]

# Header calls' overhead figures the median is taken of (see LEARN_OVERHEAD_S).
OVERHEAD_FIGURES = 7
_learned_overhead = [LEARN_OVERHEAD_S]
# The last prior a Selector checked, the kind of pool, and what fit (read-only)
_last_fitting: list[Any] = [None]


def learned_overhead() -> float:
    """What a learning call cost, as this process's communicators last
    agreed (LEARN_OVERHEAD_S before any did).  A new communicator's first
    report cannot carry its own header call's cost: its class would judge
    exploring by the tight loop's figure."""
    return _learned_overhead[0]


class Selector:
    """The learning of one communicator's pool: its learners, the report in
    flight, and the compiled route table it keeps up to date (`routes`:
    cxlmpi._shim.Routes, which reads the pool's call counter)."""

    def __init__(self, routes: RouteTable, nranks: int, chunk: int, streaming: bool,
                 prior: dict[str, Any] | None = None, variants: bool = True,
                 overhead_s: float = LEARN_OVERHEAD_S) -> None:
        self.routes = routes
        self.nranks = nranks
        self.chunk = chunk
        self.streaming = streaming
        self.variants = variants
        self.overhead_s = overhead_s
        self.prior = prior or {}
        self.learners: dict[tuple[int, int, int], Learner] = {}
        self.pending: tuple[int, tuple[int, int, int], int, int] | None = None
        self.next_check: dict[tuple[int, int, int], int] = {}  # key -> ops of its re-check
        self.changed = False  # something settled since the cache was written
        self.spent: list[float] = []  # the latest figures of a header call's overhead
        self.cold_figure = True   # the next figure is the first header call's (not kept)
        self.headers = 0      # header steps so far (each also counts in the ops)
        # the machine fingerprint the cache entry is for (cxlmpi.pools.selection;
        # None: nothing is remembered)
        self.machine: dict[str, Any] | None = None
        # The cache's classes: their settled paths go to the routes now;
        # each one's Learner is made at its class's first use (`known`) --
        # making them all took 2-5 ms per communicator (113-157 classes).
        fitting = self._fitting()
        # {class: (cache entry, its best path)}: the cached classes whose
        # Learner is not made yet
        self.cached: dict[tuple[int, int, int], tuple[dict[str, Any], int]] = dict(fitting)
        self._making = threading.Lock()   # (`known`)
        for key, (_, best) in fitting.items():
            # (what `_publish` does for a learner from the cache: settled,
            # re-checked after its first interval)
            self.next_check[key] = MIN_INTERVAL
            self.routes.set(*key, best, MIN_INTERVAL)
        routes.first_runs(*first_runs())

    def _fitting(self) -> dict[tuple[int, int, int], tuple[dict[str, Any], int]]:
        """{class: (cache entry, its best path)} of the prior's entries that
        fit this pool's candidates; the same prior (agree.bcast_kept hands
        every communicator the same object while the cache is unchanged)
        for a pool of the same kind is not checked again."""
        kind = (self.nranks, self.chunk, self.streaming, self.variants)
        last = _last_fitting[0]
        if last is not None and last[0] is self.prior and last[1] == kind:
            return last[2]
        fitting = {}
        for key, entry in self.prior.items():
            paths = Learner.cached_paths(self._candidates(*key), entry)
            if paths is not None:
                fitting[key] = (entry, paths[0])
        _last_fitting[0] = (self.prior, kind, fitting)
        return fitting

    def _candidates(self, which: int, sc: int, pl: int) -> list[int]:
        return candidates(config.COLLECTIVES[which], class_floor(sc), self.nranks,
                          pl == 1, self.chunk, self.streaming, self.variants)

    def likely(self, which: int, sc: int, pl: int) -> int:
        """The path a posted call of class (which, sc, pl) takes while the
        class has settled none: the likeliest pool path, the first pool
        candidate that the class's learning would try."""
        return next((c for c in self._candidates(which, sc, pl) if c != MPI_PATH), 1)

    def known(self, key: tuple[int, int, int]) -> Learner | None:
        """The class's Learner, made from its cache entry at its first use;
        None for a class neither learned nor cached."""
        learner = self.learners.get(key)
        if learner is not None:
            return learner
        with self._making:   # (another thread may ask for it at once)
            learner = self.learners.get(key)
            if learner is None and key in self.cached:
                entry = self.cached[key][0]
                learner = Learner.from_cache(self._candidates(*key), entry)
                assert learner is not None   # (checked in __init__)
                learner.overhead = self.overhead_s
                learner.run_len = run_length(key[1])
                self.learners[key] = learner
                del self.cached[key]
        return learner

    def learner(self, key: tuple[int, int, int], ops: int = 0) -> Learner:
        learner = self.known(key)
        if learner is None:
            learner = self.learners[key] = Learner(self._candidates(*key), born=ops)
            learner.run_len = run_length(key[1])
        learner.overhead = self.overhead_s
        return learner

    # ------------------------------------------------------ header traffic

    def report(self) -> tuple[int, int]:
        """(id, this rank's nanoseconds per call) of the report the next
        header step carries: the run in flight, which ends when that step
        completes on every rank (`delivered`; a step that ends with some
        rank gone to MPI leaves it going, as on that rank); (0, 0) when
        there is none."""
        run = self.routes.peek_run()
        if run is not None:
            which, sc, pl, code, seconds, calls, skipping = run
            # (no call timed -- all followed a peer to MPI: 0, "nothing";
            # the run cut short by this header step before its timed half:
            # CUT_SHORT)
            self.learned(which, class_floor(sc), code, bool(pl),
                         int(seconds * 1e9 / calls) if calls > 0 else
                         CUT_SHORT if skipping else 0)
        if self.pending is None:
            return 0, 0
        return self.pending[0], self.pending[3]

    def delivered(self, nanoseconds: int, spent_ns: int = 0) -> None:
        """The header step completed on every rank: the slowest rank's
        time of the report in flight, and the largest time any rank spent
        in its previous header call beyond the call's path (`spent_ns`; 0:
        none measured), which `overhead_s` follows."""
        self.routes.finish_run()
        self.headers += 1
        if spent_ns > 0 and self.cold_figure:
            self.cold_figure = False
        elif spent_ns > 0:
            recent = self.spent = (self.spent + [spent_ns * 1e-9])[-OVERHEAD_FIGURES:]
            self.overhead_s = _learned_overhead[0] = sorted(recent)[(len(recent) - 1) // 2]
        if self.pending is None:
            return
        _, key, code, _ = self.pending
        self.pending = None
        ops = self.routes.ops()
        new = self.known(key) is None
        learner = self.learner(key, ops)
        if new:   # the run its first call opened (NEW)
            learner.run_calls = first_run(key[1])
        if nanoseconds > CUT_SHORT:
            learner.learn(code, nanoseconds * 1e-9)
        elif nanoseconds == CUT_SHORT:   # every rank was still in its untimed half
            learner.cut_short(code)
        else:                 # no rank timed a call of the run
            learner.untimed(code)
        if learner.phase == 0:
            learner.plan(ops)
        if learner.phase == 1 and nanoseconds > CUT_SHORT:
            self.changed = True
        self._publish(key, learner, ops)

    def _publish(self, key: tuple[int, int, int], learner: Learner, ops: int) -> None:
        """Tell the compiled routes what the class's next call does."""
        which, sc, pl = key
        if learner.phase == 1:
            # (in the communicator's calls: every rank counts those alike)
            due = ops + learner.interval
            self.next_check[key] = due
            self.routes.set(which, sc, pl, learner.best, due)
        elif learner.phase == 0 and learner.resume > ops:
            # exploring waits for its budget: the leader meanwhile, untimed
            self.routes.set(which, sc, pl, learner.leader(), learner.resume)
        else:
            self.routes.set(which, sc, pl, SLOW, 0)

    # --------------------------------------------------------------- calls

    def pick(self, which: int, nbytes: int, ops: int) -> tuple[int, bool]:
        """After a completed header step: (path code, whether this call
        learns) for a call of `nbytes` (the agreed size)."""
        sc = size_class(nbytes)
        key = (which, sc, self.routes.placement(which, sc))
        learner = self.learner(key, ops)
        if learner.phase == 0:
            code = learner.plan(ops)
            if code is not None:
                return self._run(key, learner, code, nbytes, ops), True
            self._publish(key, learner, ops)
            if learner.phase == 0:    # waiting for its budget
                return learner.leader(), False  # type: ignore[return-value]
        assert learner.best is not None or learner.phase >= 2
        if learner.phase == 1:
            if ops < self.next_check.get(key, 0):   # settled by this header's report
                return learner.best, False  # type: ignore[return-value]
            learner.start_check()
            if learner.phase == 1:    # nothing to compare against
                self._publish(key, learner, ops)
                return learner.best, False  # type: ignore[return-value]
        return self._run(key, learner, learner.check_code(), nbytes, ops), True

    def _run(self, key: tuple[int, int, int], learner: Learner, code: int, nbytes: int,
             ops: int) -> int:
        """Start a timed run of `code` on class `key` with this call: a
        single call for a warm-up try, else RUN_BYTES worth of calls (1 to
        MAX_RUN), so that a run of small calls outweighs its header step
        and bookkeeping; it ends at the next header step of the
        communicator, whichever class it is for."""
        which, sc, pl = key
        calls = learner.try_len(code)
        learner.run_calls = calls
        # (the next `calls` calls of the communicator: fewer of the class's
        # own when others come between -- the run's mean is per call timed)
        self.routes.start_run(which, sc, pl, code, ops + calls, learner.cold_skip(code))
        return code

    def abandon_run(self) -> None:
        """The run in flight, whose header steps carried no report while it
        went on (cxlmpi._shim `run_goes_on`), met a call of its collective
        in another class (size or placement): it ends untimed, alike on
        every rank, its class asks the learner again at its next call, and
        its tries are single calls from then on."""
        run = self.routes.peek_run()
        self.routes.finish_run()
        # (a header step that a peer's pass cut short left this run's
        # report pending on the ranks that took it: the report is gone)
        self.pending = None
        learner = None if run is None else self.known(run[:3])
        if learner is not None:
            learner.untimed(run[3])
            self._publish(run[:3], learner, self.routes.ops())   # (not the try's due)

    def learned(self, which: int, nbytes: int, code: int, zerocopy: bool,
                nanoseconds: int) -> None:
        """A learning call finished on this rank in `nanoseconds`; its
        report goes out with the next header step."""
        sc = size_class(nbytes)
        pl = int(zerocopy) if code != MPI_PATH else self.routes.placement(which, sc)
        key = (which, sc, pl)
        report = 1 + (which * NCLASSES + sc) * 2 + pl
        self.pending = (report << 8 | code, key, code, max(0, nanoseconds))

    # ---------------------------------------------------------------- show

    def decisions(self) -> dict[tuple[int, int, int], Learner]:
        """The classes with a choice: settled, or exploring with a fastest
        path seen (what the cache keeps: a class of cheap calls may still
        explore when the job ends)."""
        for key in list(self.cached):
            self.known(key)
        return {k: v for k, v in self.learners.items() if v.choice() is not None}


def decision(comm: Any, name: str, nbytes: int, settled: bool = True) -> str | None:
    """What adaptive selection settled on for collective `name` (e.g.
    "bcast") of `nbytes` (all blocks together) on `comm`, for the placement
    its last pool call found: 'mpi', 'pool', 'pool+stream', ...; None when
    nothing is settled (or the path is pinned).  `settled=False`: while
    the class still explores, the fastest path it has seen so far."""
    from .._shim import states

    state = states.get(getattr(comm, "handle", None))
    routes = getattr(state, "routes", None)
    if routes is None or name not in config.COLLECTIVES:
        return None
    which, sc = config.COLLECTIVES.index(name), size_class(nbytes)
    key = (which, sc, routes.placement(which, sc))
    # (read only: another thread may be in a call of the communicator; the
    # entry first -- `known` makes the Learner before it drops the entry)
    cached = routes.selector.cached.get(key)
    learner = routes.selector.learners.get(key)
    best = cached[1] if learner is None and cached is not None else \
        None if learner is None else learner.best if settled else learner.choice()
    return None if best is None else code_name(best)
