"""A simulated job for the selection tests (tests/test_select.py,
tests/test_select_jobs.py, tests/test_cache.py): ranks with their own
Selector and Routes making the same calls, each path's time made up per
rank (cold first calls, first touches, header steps), and the cost tables
they read."""

from __future__ import annotations

import random

from cxlmpi import _shim, config, select
from cxlmpi.select import MPI_PATH, NEW, SLOW, Selector, code_of, size_class

BCAST = config.COLLECTIVES.index("bcast")
ALLREDUCE = config.COLLECTIVES.index("allreduce")
CHUNK = 256 << 10
COLD = 30e-6     # a class's first call through MPI, or through the pool: this much more
TOUCH = 2.5e-6   # its first call, whatever its path: this much more per page of 4 KiB


def alone(least: float, calls: int, nbytes: int) -> float:
    """The time of `calls` calls on the best path alone (`least` seconds
    each), its cold first call included."""
    return calls * least + COLD + TOUCH * (nbytes >> 12)


def realistic(**kw) -> Job:
    return Job(2, cold=COLD, touch=TOUCH, header=select.LEARN_OVERHEAD_S, **kw)


class Routes:
    """cxlmpi._shim.Routes in Python: the table the hot path reads, the
    placement each class's last pool call found, the pool's call counter."""

    def __init__(self) -> None:
        self.table: dict[tuple[int, int, int], tuple[int, int]] = {}
        self.where: dict[tuple[int, int], int] = {}
        self.counter = 0
        self.run: list | None = None   # [which, sc, pl, code, seconds, calls]
        self.span = False      # the run is timed end to end (cxlmpi._shim.Routes)
        self.last: int | None = None   # the call counter at its last call
        self.first = [0] * select.NCLASSES   # the first runs' lengths (NEW), by class
        self.first_skip = [0] * select.NCLASSES   # ... and their untimed calls
        self.new = False
        self.skip = 0

    def set(self, which: int, sc: int, pl: int, code: int, due: int) -> None:
        self.table[(which, sc, pl)] = (code, due)

    def first_runs(self, calls: list[int], skips: list[int] | None = None) -> None:
        self.first, self.first_skip = calls, skips or [1] * len(calls)

    def start_run(self, which: int, sc: int, pl: int, code: int, due: int,
                  skip: int = 0) -> None:
        self.set(which, sc, pl, code, due)
        self.run = [which, sc, pl, code, 0.0, 0]
        self.skip = skip   # calls after the opening one that only restart the span
        # a run of several calls is timed end to end: from the end of one
        # of its calls to the end of the next, where no other call of the
        # communicator came between
        self.span = due > self.counter + 1
        self.spans: list[float] = []   # (its calls' times, when timed end to end)
        self.last = None
        self.new = False   # opened by a class's first call (NEW)

    def peek_run(self):
        if self.run is None:
            return None
        run = list(self.run)
        if self.span and self.spans:   # the middle half's mean per call, as compiled
            run[4] = _shim.run_figure(self.spans) * run[5]
        return tuple(run) + (self.skip > 0,)

    def finish_run(self) -> None:
        self.run = None

    def timed(self, which: int, nbytes: int, seconds: float) -> bool:
        """A call of the run in flight (took(): its time counts)."""
        sc = size_class(nbytes)
        if self.run is None or self.run[:3] != [which, sc, self.placement(which, sc)]:
            return False
        if self.span:
            follows = self.last is not None and self.counter == self.last + 1
            opening = self.last is None
            self.last = self.counter
            if not opening and self.skip:
                self.skip -= 1
                return True   # the call after a cold one: its end restarts the span
            if not follows:
                return True   # a call of the run; its end starts the next span
        self.run[4] += seconds
        self.run[5] += 1
        if self.span:
            self.spans.append(seconds)
        return True

    def placement(self, which: int, sc: int) -> int:
        return self.where.get((which, sc), 0)

    def ops(self) -> int:
        return self.counter

    def fast(self, which: int, nbytes: int) -> int | None:
        """The hot path's choice, None when it must ask the selector."""
        sc = size_class(nbytes)
        pl = self.placement(which, sc)
        key = (which, sc, pl)
        if key not in self.table and self.first[sc]:
            self.table[key] = (NEW, self.first[sc])
        code, due = self.table.get(key, (SLOW, 0))
        if code == NEW and (self.run is None or self.new):   # (the class's first call)
            self.start_run(which, sc, pl, MPI_PATH, self.counter + due, self.first_skip[sc])
            self.new = True
            return MPI_PATH
        return code if code >= 0 and self.counter < due else None


class Job:
    """`nranks` ranks, each with its own Selector and Routes, making the same
    calls; `cost(code, call)` is a path's true time, which each rank sees
    with its own noise (`jitter`).  A class's first call through MPI and
    its first through the pool cost `cold` seconds more (first touches:
    measured 20-50 us at 64 KiB); the class's very first call, whatever its
    path, pays the first touches of the buffers' pages too (`touch`
    seconds per 4 KiB; measured about 2.5 us, 10 ms at 16 MiB); every
    header step costs `header` seconds."""

    def __init__(self, nranks: int, seed: int = 0, jitter: float = 0.0,
                 prior: dict | None = None, cold: float = 0.0, touch: float = 0.0,
                 header: float = 0.0) -> None:
        self.rng = random.Random(seed)
        self.jitter = jitter
        self.cold = cold
        self.touch = touch
        self.header = header
        self.warm: set[tuple[int, int, bool]] = set()
        self.routes = [Routes() for _ in range(nranks)]
        self.selectors = [Selector(r, nranks, CHUNK, True, prior) for r in self.routes]
        self.time = 0.0           # the job's time: the slowest rank's, summed
        self.learning = 0

    def call(self, which: int, nbytes: int, cost, call: int = 0) -> int:
        """One collective call on every rank; the path every rank took."""
        fast = {r.fast(which, nbytes) for r in self.routes}
        assert len(fast) == 1, f"ranks disagree whether to learn: {fast}"
        code = fast.pop()
        learn = False
        if code is None:   # the header step: every rank takes it, or none
            self.time += self.header
            reports = {s.report()[0] for s in self.selectors}
            assert len(reports) == 1, f"ranks carry different reports: {reports}"
            slowest = max(s.report()[1] for s in self.selectors)
            for r in self.routes:
                r.counter += 1
            picks = set()
            for s, r in zip(self.selectors, self.routes):
                s.delivered(slowest, round(self.header * 1e9))
                picks.add(s.pick(which, nbytes, r.counter))
            assert len(picks) == 1, f"ranks picked differently: {picks}"
            code, learn = picks.pop()
        for r in self.routes:
            r.counter += 1
        true = cost(code, call)
        kind = (which, size_class(nbytes), code != MPI_PATH)
        if kind not in self.warm:
            if (which, size_class(nbytes), code == MPI_PATH) not in self.warm:
                true += self.touch * (nbytes >> 12)
            self.warm.add(kind)
            true += self.cold
        seen = [true * (1 + self.jitter * self.rng.random()) for _ in self.routes]
        self.time += max(seen)
        timed = {r.timed(which, nbytes, t) for r, t in zip(self.routes, seen)}
        assert len(timed) == 1, "ranks disagree whether a call is timed"
        self.learning += timed.pop() or learn
        return code

    def decisions(self) -> list[dict]:
        return [{k: (v.best, v.runner_up, v.phase) for k, v in s.learners.items()}
                for s in self.selectors]


def fixed(table: dict[str, float]):
    """A cost function from {path name: seconds}; paths not named: 10 s."""
    costs = {code_of(name): t for name, t in table.items()}
    return lambda code, call: costs.get(code, 10.0)
