"""What one class has learned and what its next call does (`Learner`):
exploring its candidates, settling on the fastest in typical time, and the
re-checks that follow a change of load (the policy is described in
`cxlmpi.select`).  Pure bookkeeping on data every rank holds alike; the
Selector (cxlmpi.select.selector) feeds it the agreed timings."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from .classes import FIRST_RUN_MIN, MPI_PATH, code_name, code_of, untimed_half

__all__ = ["Learner", "typical", "weighed", "LEARN_OVERHEAD_S"]

# Exploration and re-checking (see cxlmpi.select).
ROUNDS = 3               # tries of each surviving candidate
DROP_AFTER_ONE = 2.0     # a candidate this much slower than the best after one try
UNTRIED = 1.5            # what an untried candidate is expected to cost (x the best)
MPI_MARGIN = 0.97        # a pool path is kept over MPI only when this much faster
EXPLORE_BUDGET = 7.0     # calls' worth of the best path that exploring may waste ...
EXPLORE_SHARE = 0.02     # ... and this share of the communicator's calls since
SWITCH_MARGIN = 0.95     # the runner-up takes over when this much faster
MIN_INTERVAL = 64        # calls of the class between re-checks, at least ...
MAX_INTERVAL = 4096      # ... and at most
CHECK_SHARE = 0.005      # a re-check may waste this share of the time between
RECENT = 4               # samples a settled candidate keeps
OUTLIER = 3.0            # a look counts at most this much x its path's median
STEADY = 1.5             # the best's looks this far apart: re-checks do not space out
HISTORY = 16             # (its latest this many looks)
# What a learning call costs beyond its path, whichever it takes: the header
# step and the selector's bookkeeping.  Measured in place: each rank times
# its header calls (the step and the bookkeeping around it), the next
# header step carries the figure and all learn the largest; the overhead
# is the median of the latest OVERHEAD_FIGURES of those (the lower one of an
# even count: a rank that was descheduled once must not stop exploring),
# the same on every rank.  Not the communicator's first figure: its first
# header call is cold (3.5 ms against 40-130 us after it, 2 ranks beside a
# busy process), and taken as the overhead, it held a 1 MiB class's first
# try of the pool back for 1400 calls.  (Kept by the Selector,
# cxlmpi.select.selector.)
# Before the first figure arrives: the latest figure of an earlier
# communicator of rank 0's process (`learned_overhead`: rank 0 hands it to
# every rank when the pool is set up), or LEARN_OVERHEAD_S (across pool
# groups, where the header step goes through the leaders' MPI, at least
# that plus what rank 0 measured of it then: Selector's `overhead_s`).
# Measured: 1-2 us in a tight loop, 20-90 us in place (2 ranks, 2-vCPU VM).
LEARN_OVERHEAD_S = 6e-6


def weighed(code: int, seconds: float) -> float:
    """A path's time as decisions weigh it: a pool path's by MPI_MARGIN
    more, so that MPI, the reference, is kept (and taken back) unless a
    pool path is clearly faster -- ties and noise must not make a program
    slower than stock."""
    return seconds if code == MPI_PATH else seconds / MPI_MARGIN


def typical(samples: list[float], reference: bool = False) -> float:
    """What a path costs per call, judged from its samples: their mean,
    each look counted at most OUTLIER times their (lower) median, so that
    one look -- a page fault, a descheduled peer -- moves it little.  Not
    the fastest look: on a busy machine a path whose waits sleep may run at
    its quiet speed in one try and 2-5x slower in the next (a 16 MiB Bcast
    through the pool beside a CPU-bound process, 2 ranks on 2 cores: 2.6
    or 6.6 ms, MPI 3.1-3.9 ms), and what a program pays is its mean.

    For stock MPI, the `reference`, no more than the median of its looks
    (the mean of the middle two for an even count: with two looks, their
    mean): one slow look at MPI among three must not hand the class to a
    pool path, since a pool path kept where MPI is faster makes the
    program slower than stock, and MPI kept where a pool path is a little
    faster only gains less.  Its first look is the likeliest slow one: the
    class's first calls on MPI still warm up MPI's own buffers (a 64 KiB
    Alltoall on 4 ranks, 16 cores: 68 us over its first run, 37 us from
    then on, the pool 45 us).  (Not the lower median: with two looks that
    is MPI's fastest, and where MPI swings between two speeds under load,
    MPI kept taking the class back from a pool path that was faster on
    the mean.)"""
    if not samples:
        return math.inf
    ordered = sorted(samples)
    cap = OUTLIER * ordered[(len(ordered) - 1) // 2]
    if cap <= 0:   # (a cache's zero: no cap)
        cap = math.inf
    mean = sum(min(t, cap) for t in samples) / len(samples)
    if not reference:
        return mean
    half = len(ordered) // 2
    median = ordered[half] if len(ordered) % 2 else (ordered[half - 1] + ordered[half]) / 2
    return min(mean, median)


@dataclass
class Learner:
    """What one class has learned, and what its next call does."""

    candidates: list[int]
    samples: dict[int, list[float]] = field(default_factory=dict)
    alive: list[int] = field(default_factory=list)
    best: int | None = None          # None while exploring
    runner_up: int | None = None
    interval: int = MIN_INTERVAL     # calls between re-checks
    phase: int = 0                   # 0 explore, 1 settled, 2 re-timing best, 3 runner-up
    explored: int = 0                # learning calls made
    checks: int = 0                  # re-checks made
    recheck: list[float] = field(default_factory=list)  # [best, runner-up] times
    warm_pool: bool = False          # the class's first call through the pool is done
    warm_mpi: bool = False           # ... and its first through MPI (both cold: no samples)
    opened: bool = False             # the class's first call opened a timed run
    run_calls: int = 1               # calls of the run whose report comes next
    run_len: int = 1                 # calls of a (not warm-up) run of this class
    challenger: int | None = None    # what the re-check in progress times against the best
    displaced: int | None = None     # what the last switch displaced, until a re-check confirms
    born: int = 0                    # the communicator's call count at the class's first call
    resume: int = 0                  # exploring waits (on the leader) until this call count
    overhead: float = LEARN_OVERHEAD_S  # what a learning call costs beyond its path
    cached: set[int] = field(default_factory=set)  # paths whose samples a cache gave

    def __post_init__(self) -> None:
        if not self.alive:
            self.alive = list(self.candidates)
        # each candidate's typical time, kept up to date (a learning
        # call's bookkeeping runs while every rank waits for it: cheap)
        self.est: dict[int, float] = {c: typical(v, c == MPI_PATH)
                                       for c, v in self.samples.items() if v}
        self.ncalls: dict[int, int] = {c: len(v) for c, v in self.samples.items()}
        # the warm-ups' times (real cost, no sample), by kind: through the pool?
        self.warmups: dict[bool, float] = {}
        self.planned: tuple[int, int | None] | None = None   # (ops, plan(ops))
        # each candidate's latest HISTORY looks (its estimate keeps fewer):
        # whether its time is steady
        self.history: dict[int, list[float]] = {c: list(v) for c, v in self.samples.items()}

    def warming(self, code: int) -> bool:
        """Whether a try of `code` now is a warm-up (not a sample)."""
        return not (self.warm_mpi if code == MPI_PATH else self.warm_pool)

    def try_len(self, code: int) -> int:
        """Calls of the next try of `code`: for a candidate's first look as
        few as give a sample (a slow one is dropped after it): one call, or
        two where the class's runs are timed end to end (cxlmpi._shim.Routes:
        from the end of one call to the end of the next); else the class's
        run length.  A warm-up is a run of one call, timed (the cold call's
        extra cost counts against exploring's budget) -- but for the
        class's first call, which the best path alone would pay as well:
        where runs are timed end to end it opens the first look's run,
        FIRST_RUN_MIN calls of which only the second half is timed (the
        ranks leave the cold call apart, and MPI warms up over the next
        few: `cold_skip`), one learning call for both, whose header step
        and bookkeeping cost many cheap calls."""
        if self.warming(code):
            if self.opens_cold(code):
                return FIRST_RUN_MIN
            return 1
        return min(2, self.run_len) if code in self.unsure() else self.run_len

    def cold_skip(self, code: int) -> int:
        """Calls after a try's opening call that only restart its timing
        (cxlmpi._shim.Routes.run_skip): where the try opens with the
        class's cold first call, its first half, as in a class's first run
        (`first_skip`) -- a class first met while another's run was in
        flight opens this way, after a header step; else none."""
        return untimed_half(self.try_len(code)) if self.opens_cold(code) else 0

    def opens_cold(self, code: int) -> bool:
        """Whether a try of `code` now opens with the class's first, cold
        call and goes on end to end (cxlmpi._shim.Routes.run_skip)."""
        return self.warming(code) and not (self.warm_pool or self.warm_mpi) \
            and self.run_len > 1

    def unsure(self) -> list[int]:
        """The candidates a re-check looks at before the runner-up: never
        tried (exploring's budget ran out), or dropped after a single look
        (one sample may be an outlier: a page fault, a descheduled peer)."""
        return [c for c in self.candidates if c not in self.est or
                (c not in self.alive and len(self.samples.get(c, ())) == 1)]

    # ----------------------------------------------------------- exploring

    def estimate(self, code: int) -> float:
        return self.est.get(code, math.inf)

    def leader(self) -> int | None:
        """The tried, surviving candidate with the best estimate (the
        earlier in the candidates' order on a tie)."""
        best, best_t = None, math.inf
        est = self.est
        for c in self.alive:
            t = est.get(c)
            if t is not None and t < best_t:
                best, best_t = c, t
        return best

    def wasted(self) -> float:
        """Seconds the tries so far cost beyond what the best candidate (as
        known now) would have taken for as many calls, each try counted at
        its candidate's estimate (a single outlier -- a page fault, a
        descheduled peer -- does not end the exploring), the warm-ups but
        the dearest, and every learning call's own overhead."""
        best = self.leader()
        if best is None:
            return self.explored * self.overhead
        floor = self.est[best]
        total = self.explored * self.overhead
        for c, n in self.ncalls.items():
            total += n * (self.est[c] - floor)
        # The best path alone would pay one cold first call too (the first
        # touches of the buffers: whichever path comes first pays them):
        # the dearer warm-up stands for it -- unless the class's first call
        # opened a run (untimed: it was that call).
        extra = [max(0.0, t - floor) for t in self.warmups.values()]
        return total + sum(extra) - (0.0 if self.opened else max(extra, default=0.0))

    def next_try(self, ops: int = 0) -> int | None:
        """The candidate the exploring call at the communicator's call
        `ops` tries; None when there is none to try or the try does not
        fit the budget: EXPLORE_BUDGET calls' worth of the leader, plus
        EXPLORE_SHARE of the calls since the class's first (a try counted
        at the candidate's estimate, or, untried, at UNTRIED times the
        leader's).  Then `resume` is the call count at which it will
        fit (0: not within MAX_INTERVAL -- exploring is over, and the
        re-checks try what it never reached).  So a class whose calls are
        cheap against a learning call's own cost explores in steps spread
        over its calls, and learning never costs more than a small share
        of its time."""
        self.resume = 0
        if not (self.warm_pool or self.warm_mpi):
            # The class's first, cold call.  Where its runs are timed end to
            # end (below RUN_BYTES) it opens a run on MPI, the reference:
            # exploring may then wait for its budget for hundreds of calls,
            # and the class runs MPI meanwhile, never slower than stock.
            # Larger classes explore within their first calls: the pool's
            # first call comes first (it warms the pool's lines too).
            if self.run_len > 1 or len(self.candidates) == 1:
                return self.candidates[0]
            return self.candidates[1]
        code, fewest = None, ROUNDS
        for c in self.alive:
            n = len(self.samples.get(c, ()))
            if n < fewest:
                code, fewest = c, n
        if code is None:
            return None
        best = self.leader()
        if best is not None:
            floor = self.est[best]
            # untried: between the leader and the slowest a candidate worth
            # keeping may be (a first look is one or two calls)
            risk = self.est.get(code, UNTRIED * floor)
            need = (self.wasted() + (risk - floor) * self.try_len(code) + self.overhead) \
                / floor
            if need > EXPLORE_BUDGET + EXPLORE_SHARE * max(0, ops - self.born):
                ready = self.born + math.ceil((need - EXPLORE_BUDGET) / EXPLORE_SHARE)
                if ready - ops <= MAX_INTERVAL:
                    self.resume = ready
                return None
        return code

    def plan(self, ops: int) -> int | None:
        """While exploring, at the communicator's call `ops`: the candidate
        to try now; None when exploring waits (`resume`) or is over (the
        class settles).  A header step asks twice at the same call (for
        the report it delivered, then for the call it picks a path for):
        the second answer is the first's, since nothing was learned in
        between (the bookkeeping runs while every rank waits for it)."""
        if self.planned is not None and self.planned[0] == ops:
            return self.planned[1]
        code = self.next_try(ops)
        if code is None and not self.resume:
            self._settle()
        self.planned = (ops, code)
        return code

    def learn(self, code: int, seconds: float) -> None:
        """The slowest rank's time of a learning call that took `code`."""
        self.planned = None
        self.explored += 1
        if self.phase >= 2:
            self._rechecked(code, seconds)
            return
        if self.warming(code):
            # The class's first call pays for first touches (pages of the
            # buffers) whatever path it takes; its first call through the
            # pool for the halves' lines and the pool's code, and its first
            # through MPI for MPI's own first touches at that size (a 64 KiB
            # Bcast's first on a communicator: 39 us, the next 6 us).  Not
            # samples: a cold first look would drop a candidate that is
            # in fact the fastest.  A warm-up that opened a run timed end
            # to end was not timed: the run's time is the first look's.
            self._warmed(code)
            if self.run_calls == 1:
                self.warmups[code != MPI_PATH] = seconds
                return
            self.opened = True
        self.samples.setdefault(code, []).append(seconds)
        self._looked(code, seconds)
        self.ncalls[code] = self.ncalls.get(code, 0) + self.run_calls
        self.est[code] = typical(self.samples[code], code == MPI_PATH)
        if code in self.alive:
            best = self.leader()
            # far behind after its first try: not worth more
            if best is not None and code != best and len(self.samples[code]) == 1 and \
                    seconds > DROP_AFTER_ONE * self.est[best]:
                self.alive.remove(code)
            if best == code:   # a new leader: earlier ones may now be far behind
                for c in list(self.alive):
                    if c != best and len(self.samples.get(c, ())) == 1 and \
                            self.est[c] > DROP_AFTER_ONE * self.est[best]:
                        self.alive.remove(c)

    def untimed(self, code: int) -> None:
        """A learning run of `code` that no rank timed: every call of it
        followed a peer to MPI, or -- a run timed end to end -- no second
        call of the class came next in the communicator's calls (the
        class's calls come between others'; it had counted as taking no
        time at all, 1 ns, and won every comparison).  From then on the
        class's tries are single calls, each timed alone."""
        self.planned = None
        self.explored += 1
        if self.run_calls > 1:
            self._warmed(code)
            self.run_len = 1

    def cut_short(self, code: int) -> None:
        """A learning run that another class's header step ended before its
        timed half (`cold_skip`, `first_skip`: a class's first run ends at
        the next header step, whichever class it is for): it warmed the
        path up and taught nothing else.  Not `untimed`: the class's calls
        may well come back to back, and its tries stay runs."""
        self.planned = None
        self.explored += 1
        self._warmed(code)

    def _looked(self, code: int, seconds: float) -> None:
        self.history[code] = (self.history.get(code, []) + [seconds])[-HISTORY:]

    def _warmed(self, code: int) -> None:
        if code == MPI_PATH:
            self.warm_mpi = True
        else:
            self.warm_pool = True

    def _settle(self) -> None:
        ranked = sorted(self.est, key=lambda c: (weighed(c, self.est[c]),
                                                 self.candidates.index(c)))
        ranked = [c for c in ranked if c in self.candidates]
        self.best = ranked[0]
        self.runner_up = ranked[1] if len(ranked) > 1 else None
        self.phase = 1
        self._schedule()

    # ---------------------------------------------------------- re-checking

    def next_challenger(self) -> int | None:
        """What the next re-check times against the best: a candidate
        exploring never reached or dropped after one look (`unsure`), one
        at a time, so that those are found too when the load changes or
        the look was an outlier; the path the last switch displaced, until
        a re-check confirms the switch (one lucky pair must not hold the
        class for the thousands of calls a settled interval grows to);
        else the runner-up, and every other time one of the rest in turn:
        stock MPI at every other of those -- MPI is the reference a program
        must never be slower than, and a change of load (a busy core) may
        make it the faster path while the pool's variants, slowed alike,
        keep their order -- and the other surviving candidates within
        DROP_AFTER_ONE of the best (one look at an outlier may have put
        the fastest third).  Each re-check's spacing bounds its cost
        (`_schedule`)."""
        unsure = self.unsure()
        if unsure:
            return unsure[0]
        if self.displaced is not None and self.displaced != self.best:
            return self.displaced
        if self.runner_up is None or self.checks % 2 == 0:
            return self.runner_up
        best_s = self.est[self.best] if self.best is not None else math.inf
        rest = [c for c in self.candidates if c not in (self.best, self.runner_up)
                and c in self.est and (c == MPI_PATH or c in self.alive and
                                       self.est[c] < DROP_AFTER_ONE * best_s)]
        if not rest:
            return self.runner_up
        turn = self.checks // 2
        if MPI_PATH in rest:
            if turn % 2 == 0 or len(rest) == 1:
                return MPI_PATH
            rest.remove(MPI_PATH)
            turn //= 2
        return rest[turn % len(rest)]

    def _schedule(self, seen: float = math.inf) -> None:
        """The calls until the next re-check: a re-check (three learning
        calls, one of them on the challenger) costs at most CHECK_SHARE
        of the time between re-checks; the interval doubles while the
        runner-up stays behind, and starts again when it is close (by its
        typical time, or `seen`, the challenger's time in the re-check
        just made), when a switch waits to be confirmed, or while the
        best's own looks disagree (more than STEADY apart: a busy machine,
        where a lucky streak of looks may have made it the best)."""
        assert self.best is not None
        best_s = self.est[self.best]
        other = self.next_challenger()
        if other is None or not math.isfinite(best_s) or best_s <= 0:
            self.interval = MAX_INTERVAL
            return
        if other in self.unsure():
            # a first look, as slow as a candidate worth keeping may be
            other_s, calls = DROP_AFTER_ONE * best_s, self.try_len(other)
        else:
            other_s, calls = self.est[other], self.run_len
        # (a re-check times a run of each: the other path's extra time)
        cost = calls * max(other_s - best_s, 0.0) + 3 * self.overhead
        want = int(cost / (CHECK_SHARE * best_s))
        runner_s = self.est.get(self.runner_up, math.inf) if self.runner_up is not None \
            else math.inf
        looks = self.history.get(self.best) or [best_s]
        unsteady = max(looks) > STEADY * min(looks)
        if min(runner_s, seen) < 1.1 * best_s or other == self.displaced or unsteady:
            self.interval = min(MAX_INTERVAL, max(MIN_INTERVAL, want))
        else:
            self.interval = min(MAX_INTERVAL, max(MIN_INTERVAL, want, self.interval * 2))

    def check_code(self) -> int:
        """The path of a re-checking call (phase 2: the best, 3: the
        challenger)."""
        assert self.best is not None
        if self.phase == 3 and self.challenger is not None:
            return self.challenger
        return self.best

    def start_check(self) -> None:
        """A re-check times the best, then `next_challenger`, back to back."""
        self.challenger = self.next_challenger()
        self.phase = 2 if self.challenger is not None else 1
        self.recheck = []

    def _rechecked(self, code: int, seconds: float) -> None:
        self.recheck.append(seconds)
        if self.phase == 2:
            self.phase = 3
            return
        self.checks += 1
        best_s, other_s = self.recheck[0], seconds
        other = self.challenger
        assert other is not None and self.best is not None
        for c, t in ((self.best, best_s), (other, other_s)):
            # the latest few: what the cache keeps, with old load forgotten;
            # a cached figure goes at the first look of this job's own (it
            # was another program's, on other data -- or, too small, it
            # would hold its path until RECENT looks had pushed it out)
            kept = [] if c in self.cached else self.samples.get(c, [])
            if c in self.cached:
                self.cached.discard(c)
                self.history[c] = []
            self.samples[c] = (kept + [t])[-RECENT:]
            self.est[c] = typical(self.samples[c], c == MPI_PATH)
            self._looked(c, t)
        # The challenger takes over when faster in typical time -- and a
        # pool path only when faster in this pair too, timed back to back:
        # on a busy machine one look may catch a path at its quiet speed,
        # and MPI, the reference, is taken back on the typical times alone.
        if weighed(other, self.est[other]) < \
                SWITCH_MARGIN * weighed(self.best, self.est[self.best]) and \
                (other == MPI_PATH or
                 weighed(other, other_s) < SWITCH_MARGIN * weighed(self.best, best_s)):
            self.best, other = other, self.best
            self.displaced = other
            self.interval = MIN_INTERVAL
        elif other == self.displaced:   # the switch stands
            self.displaced = None
        if self.runner_up is None or other == self.runner_up or self.runner_up == self.best \
                or self.est[other] < self.est.get(self.runner_up, math.inf):
            self.runner_up = other
        self.phase = 1
        # (how close the path now second came in this pair)
        self._schedule(best_s if other != self.challenger else other_s)

    # --------------------------------------------------------------- cache

    def choice(self) -> int | None:
        """The path the class takes: the settled best, or while exploring
        the fastest seen so far (None before any sample)."""
        return self.best if self.best is not None else self.leader()

    def as_cache(self) -> dict[str, Any]:
        best = self.choice()
        assert best is not None
        runner = self.runner_up if self.best is not None else min(
            (c for c in self.est if c != best), key=self.estimate, default=None)
        return {"best": code_name(best),
                "runner_up": None if runner is None else code_name(runner),
                "seconds": {code_name(c): self.estimate(c) for c in self.candidates
                            if math.isfinite(self.estimate(c))}}

    @staticmethod
    def cached_paths(cands: list[int], entry: dict[str, Any]
                     ) -> tuple[int, int | None, dict[int, float]] | None:
        """(best, runner-up, seconds by path) of a cache entry, None when
        it does not fit the candidates (another version's variants)."""
        try:
            best = code_of(entry["best"])
            runner = None if entry.get("runner_up") is None else code_of(entry["runner_up"])
            seconds = {code_of(k): float(v) for k, v in entry.get("seconds", {}).items()}
        except (KeyError, TypeError, ValueError, AttributeError, OverflowError):
            return None
        if best not in cands or (runner is not None and runner not in cands) or \
                not all(math.isfinite(s) and s > 0 for s in seconds.values()):
            return None
        return best, runner, seconds

    @classmethod
    def from_cache(cls, cands: list[int], entry: dict[str, Any]) -> Learner | None:
        """A settled learner from a cache entry, None when the entry does
        not fit the candidates (`cached_paths`)."""
        paths = cls.cached_paths(cands, entry)
        if paths is None:
            return None
        best, runner, seconds = paths
        learner = cls(cands, samples={c: [s] for c, s in seconds.items() if c in cands})
        learner.cached = set(learner.samples)
        learner.best, learner.runner_up, learner.phase = best, runner, 1
        # Checked again soon, then spaced as learned: the cache's decision
        # was made by another program (tune, a benchmark), whose data may
        # have been cold where this one's is hot.  A pool path is checked
        # against MPI first, the reference, as if it had just displaced it
        # (a 256 KiB Scatter's cached streaming path, 0.75x of this job's
        # MPI, was checked against the cached runner-up, and against MPI
        # 2000 calls later).
        learner.interval = MIN_INTERVAL
        if best != MPI_PATH and MPI_PATH in cands:
            learner.displaced = MPI_PATH
        return learner
