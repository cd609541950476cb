"""Online path selection: each communicator measures its own paths and keeps
the fastest (CXLMPI_TUNING=adaptive, the default).

A *class* is one collective, one power-of-two size class (bytes of all
blocks together, as the dispatcher counts them) and one buffer placement
(``private``: the pool path copies through the ranks' halves; ``pool``: it
ran zero-copy, every rank's buffers in the arenas).  Its *candidates* are
stock MPI and the pool variants that can matter for it: regular or
streaming stores into the halves, CXLMPI_CHUNK_SIZE steps or whole halves,
every-rank-reduces or reduce-scatter + allgather (`candidates`).

Every rank must take the same path for the same call, so a `Learner`
changes only on data that every rank holds identically:

- the calls that learn (exploration and re-checks) open with a header step
  in the pool (``Pool.header``), which every rank of the pool takes or none
  does (a rank that sends the call to MPI sends them all there: the call
  teaches nothing then, on every rank);
- the time of a learning call is this rank's; the next header step carries
  it, and every rank learns the largest (the slowest rank's time) -- one
  report in flight per communicator, checked to be the same report on every
  rank (its id rides in the header's signature);
- when a class learns next is counted in the pool's call counter, which
  every rank advances alike (pool calls and passed ones).

The first calls of a class try its candidates in turn (the cheapest-looking
first); a candidate far slower than the best so far is dropped after one
try, and exploration stops once it has cost about EXPLORE_BUDGET calls'
worth of the best path.  Then the fastest is kept; a small, bounded share of
later calls re-times it and the runner-up back to back (more often when
they are close, rarely when the runner-up is far behind), so a change of
load is followed.  What was learned is remembered per machine in a cache
file (CXLMPI_CACHE), read when a communicator's pool is set up.
"""

from __future__ import annotations

import json
import math
import os
import platform
import tempfile
from dataclasses import dataclass, field
from typing import Any

from . import config

__all__ = ["MPI_PATH", "code_name", "code_of", "size_class", "candidates", "Learner",
           "Selector", "fingerprint", "load_cache", "save_cache", "cache_path", "decision",
           "describe_cache"]

# Path codes: 0 is stock MPI; 1 + flags is the pool with the variant flags
# (cxlmpi._pool.VARIANT_FLAGS).
MPI_PATH = 0
STREAM, BIGCHUNK, RSAG, FLAT = 1, 2, 4, 8
_FLAG_NAMES = ((STREAM, "stream"), (BIGCHUNK, "bigchunk"), (RSAG, "rsag"), (FLAT, "flat"))

PLACEMENTS = ("private", "pool")
NCLASSES = 64

# Exploration and re-checking (see the module docstring).
ROUNDS = 3               # tries of each surviving candidate
DROP_AFTER_ONE = 2.0     # a candidate this much slower than the best after one try
EXPLORE_BUDGET = 5.0     # calls' worth of the best path that exploring may waste
SWITCH_MARGIN = 0.95     # the runner-up takes over when this much faster
MIN_INTERVAL = 64        # calls of the class between re-checks, at least ...
MAX_INTERVAL = 4096      # ... and at most
CHECK_SHARE = 0.005      # a re-check may waste this share of the time between

# Collectives by family (config.COLLECTIVES names).
_MOVE = ("bcast", "allgather", "allgatherv", "gather", "gatherv", "scatter", "scatterv",
         "alltoall", "alltoallv")
_REDUCE = ("reduce", "allreduce")
_REDUCE_SCATTER = ("reduce_scatter_block", "reduce_scatter")


def code_name(code: int) -> str:
    """'mpi', 'pool', 'pool+stream', 'pool+stream+bigchunk', ..."""
    if code == MPI_PATH:
        return "mpi"
    flags = code - 1
    return "+".join(["pool"] + [name for bit, name in _FLAG_NAMES if flags & bit])


def code_of(name: str) -> int:
    """The inverse of code_name (ValueError for a name it never makes)."""
    if name == "mpi":
        return MPI_PATH
    parts = name.split("+")
    if parts[0] != "pool":
        raise ValueError(f"unknown path {name!r}")
    names = dict((n, bit) for bit, n in _FLAG_NAMES)
    try:
        flags = sum(names[p] for p in set(parts[1:]))
    except KeyError:
        raise ValueError(f"unknown path {name!r}") from None
    return 1 + flags


def size_class(nbytes: int) -> int:
    """The power-of-two class of a message: floor(log2(nbytes)), 0 for 0."""
    return max(int(nbytes).bit_length() - 1, 0)


def class_floor(sc: int) -> int:
    return 1 << sc if sc else 0


def candidates(name: str, nbytes: int, nranks: int, zerocopy: bool, chunk: int,
               streaming: bool = True) -> list[int]:
    """The paths worth trying for a class, in the order they are tried:
    stock MPI first (the reference every other is judged against), then the
    pool variants.  Identical on every rank: it depends only on the class
    and on the pool (its ranks, its chunk)."""
    pool = 1
    if name == "barrier" or name in ("scan", "exscan") or zerocopy:
        return [MPI_PATH, pool]
    out = [MPI_PATH]
    big = nbytes > chunk
    stream = streaming and nbytes >= 64 << 10
    if name in _REDUCE:
        flat, rsag = 1 + FLAT, 1 + RSAG
        out += [flat, rsag] if nranks > 2 else [flat]
        if stream:
            out += [c + STREAM for c in list(out[1:])]
        if nranks <= 2:
            out.append(rsag)
        return out
    if name in _MOVE or name in _REDUCE_SCATTER:
        if stream and big:
            out.append(1 + STREAM + BIGCHUNK)
        if stream:
            out.append(1 + STREAM)
        out.append(pool)
        if big and name in _MOVE:
            out.append(1 + BIGCHUNK)
        return out
    return [MPI_PATH, pool]


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
    warm: bool = False               # the class's first call (cold: discarded) is done

    def __post_init__(self) -> None:
        if not self.alive:
            self.alive = list(self.candidates)

    # ----------------------------------------------------------- exploring

    def estimate(self, code: int) -> float:
        values = self.samples.get(code)
        return min(values) if values else math.inf

    def leader(self) -> int | None:
        tried = [c for c in self.alive if self.samples.get(c)]
        return min(tried, key=lambda c: (self.estimate(c), self.candidates.index(c))) \
            if tried else None

    def wasted(self) -> float:
        """Seconds the tries so far cost beyond what the best candidate (as
        known now) would have taken for as many calls, each try counted at
        its candidate's estimate: a single outlier (a page fault, a
        descheduled peer) does not end the exploring."""
        best = self.leader()
        if best is None:
            return 0.0
        floor = self.estimate(best)
        return sum(len(v) * (self.estimate(c) - floor) for c, v in self.samples.items() if v)

    def next_try(self) -> int | None:
        """The candidate the next exploring call tries, None when done."""
        best = self.leader()
        if best is not None and self.wasted() >= EXPLORE_BUDGET * self.estimate(best):
            return None
        pending = [c for c in self.alive if len(self.samples.get(c, ())) < ROUNDS]
        if not pending:
            return None
        fewest = min(len(self.samples.get(c, ())) for c in pending)
        return next(c for c in pending if len(self.samples.get(c, ())) == fewest)

    def learn(self, code: int, seconds: float) -> None:
        """The slowest rank's time of a learning call that took `code`."""
        self.explored += 1
        if self.phase >= 2:
            self._rechecked(code, seconds)
            return
        if not self.warm:
            # The class's first call pays for first touches (pages of the
            # buffers, of the pool, MPI's connections) whatever path it
            # takes: it is not a sample.
            self.warm = True
            return
        self.samples.setdefault(code, []).append(seconds)
        if code not in self.alive:
            return
        best = self.leader()
        if best is not None:
            # far behind after one try: not worth more
            for c in list(self.alive):
                if c != best and len(self.samples.get(c, ())) == 1 and \
                        self.estimate(c) > DROP_AFTER_ONE * self.estimate(best):
                    self.alive.remove(c)
        if self.next_try() is None:
            self._settle()

    def _settle(self) -> None:
        ranked = sorted((c for c in self.candidates if self.samples.get(c)),
                        key=lambda c: (self.estimate(c), self.candidates.index(c)))
        self.best = ranked[0]
        self.runner_up = ranked[1] if len(ranked) > 1 else None
        self.phase = 1
        self._schedule(self.estimate(self.best),
                       self.estimate(self.runner_up) if self.runner_up is not None else None)

    # ---------------------------------------------------------- re-checking

    def _schedule(self, best_s: float, runner_s: float | None) -> None:
        """The calls until the next re-check: often when the two are close,
        rarely when the runner-up is far behind (its try wastes its extra
        time: at most CHECK_SHARE of the time between re-checks)."""
        if runner_s is None or not math.isfinite(runner_s) or best_s <= 0:
            self.interval = MAX_INTERVAL
            return
        extra = max(runner_s / best_s - 1.0, 0.0)
        want = int(extra / CHECK_SHARE)
        if extra < 0.1:
            self.interval = MIN_INTERVAL
        else:
            self.interval = min(MAX_INTERVAL, max(MIN_INTERVAL, want, self.interval * 2))

    def check_code(self) -> int:
        """The path of a re-checking call (phase 2: the best, 3: the runner-up)."""
        assert self.best is not None
        if self.phase == 3 and self.runner_up is not None:
            return self.runner_up
        return self.best

    def start_check(self) -> None:
        self.phase = 2 if self.runner_up is not None else 1
        self.recheck = []

    def _rechecked(self, code: int, seconds: float) -> None:
        self.recheck.append(seconds)
        if self.phase == 2:
            self.phase = 3
            return
        self.checks += 1
        best_s, runner_s = self.recheck[0], seconds
        assert self.runner_up is not None and self.best is not None
        self.samples.setdefault(self.best, []).append(best_s)
        self.samples.setdefault(self.runner_up, []).append(runner_s)
        if runner_s < SWITCH_MARGIN * best_s:
            self.best, self.runner_up = self.runner_up, self.best
            best_s, runner_s = runner_s, best_s
            self.interval = MIN_INTERVAL
        self.phase = 1
        self._schedule(best_s, runner_s)

    # --------------------------------------------------------------- cache

    def as_cache(self) -> dict[str, Any]:
        assert self.best is not None
        return {"best": code_name(self.best),
                "runner_up": None if self.runner_up is None else code_name(self.runner_up),
                "seconds": {code_name(c): self.estimate(c) for c in self.candidates
                            if self.samples.get(c)},
                "interval": self.interval}

    @classmethod
    def from_cache(cls, cands: list[int], entry: dict[str, Any]) -> Learner | None:
        """A settled learner from a cache entry, None when the entry does
        not fit the candidates (another version's variants)."""
        try:
            best = code_of(entry["best"])
            runner = None if entry.get("runner_up") is None else code_of(entry["runner_up"])
            seconds = {code_of(k): float(v) for k, v in entry.get("seconds", {}).items()}
            interval = int(entry.get("interval", MIN_INTERVAL))
        except (KeyError, TypeError, ValueError, AttributeError):
            return None
        if best not in cands or (runner is not None and runner not in cands):
            return None
        learner = cls(cands, samples={c: [s] for c, s in seconds.items() if c in cands})
        learner.best, learner.runner_up, learner.phase = best, runner, 1
        learner.interval = min(MAX_INTERVAL, max(MIN_INTERVAL, interval))
        return learner


# Routes' codes for "no decision: ask the Selector" (cxlmpi._shim.Routes).
SLOW = -1


class Selector:
    """The learning of one communicator's pool: its learners, the report in
    flight, and the compiled route table it keeps up to date (`routes`:
    cxlmpi._shim.Routes, which reads the pool's call counter)."""

    def __init__(self, routes: Any, nranks: int, chunk: int, streaming: bool,
                 prior: dict[str, Any] | None = None) -> None:
        self.routes = routes
        self.nranks = nranks
        self.chunk = chunk
        self.streaming = streaming
        self.prior = prior or {}
        self.learners: dict[tuple[int, int, int], Learner] = {}
        self.pending: tuple[int, tuple[int, int, int], int, int] | None = None
        self.last_header: dict[tuple[int, int, int], int] = {}  # key -> ops at header
        self.ops_per_call: dict[tuple[int, int, int], float] = {}
        self.next_check: dict[tuple[int, int, int], int] = {}  # key -> ops of its re-check
        self.changed = False  # something settled since the cache was written
        self.headers = 0      # header steps so far (each also counts in the ops)
        for (which, sc, pl), entry in self.prior.items():
            learner = Learner.from_cache(self._candidates(which, sc, pl), entry)
            if learner is not None:
                self.learners[(which, sc, pl)] = learner
                self._publish((which, sc, pl), learner, 0)

    def _candidates(self, which: int, sc: int, pl: int) -> list[int]:
        return candidates(config.COLLECTIVES[which], class_floor(sc), self.nranks,
                          pl == 1, self.chunk, self.streaming)

    def learner(self, key: tuple[int, int, int]) -> Learner:
        learner = self.learners.get(key)
        if learner is None:
            learner = self.learners[key] = Learner(self._candidates(*key))
        return learner

    # ------------------------------------------------------ header traffic

    def report(self) -> tuple[int, int]:
        """(id, this rank's nanoseconds) of the report the next header step
        carries; (0, 0) when none is in flight."""
        if self.pending is None:
            return 0, 0
        return self.pending[0], self.pending[3]

    def delivered(self, nanoseconds: int) -> None:
        """The header step completed on every rank: the slowest rank's
        time of the report in flight."""
        self.headers += 1
        if self.pending is None:
            return
        _, key, code, _ = self.pending
        self.pending = None
        learner = self.learner(key)
        learner.learn(code, nanoseconds * 1e-9)
        if learner.phase == 1:
            self.changed = True
        self._publish(key, learner, self.routes.ops())

    def _publish(self, key: tuple[int, int, int], learner: Learner, ops: int) -> None:
        """Tell the compiled routes what the class's next call does."""
        which, sc, pl = key
        if learner.phase == 1:
            per_call = self.ops_per_call.get(key, 1.0)
            due = ops + max(1, int(learner.interval * per_call))
            self.next_check[key] = due
            self.routes.set(which, sc, pl, learner.best, due)
        else:
            self.routes.set(which, sc, pl, SLOW, 0)

    # --------------------------------------------------------------- calls

    def pick(self, which: int, nbytes: int, ops: int) -> tuple[int, bool]:
        """After a completed header step: (path code, whether this call
        learns) for a call of `nbytes` (the agreed size)."""
        sc = size_class(nbytes)
        key = (which, sc, self.routes.placement(which, sc))
        calls = ops - self.headers   # the communicator's calls, headers not counted
        last = self.last_header.get(key)
        if last is not None and calls > last:
            # calls of the whole communicator per call of this class
            self.ops_per_call[key] = float(calls - last)
        self.last_header[key] = calls
        learner = self.learner(key)
        if learner.phase == 0:
            code = learner.next_try()
            if code is not None:
                self.routes.set(which, sc, key[2], SLOW, 0)
                return code, True
            learner._settle()         # (the budget ran out meanwhile)
            self._publish(key, learner, ops)
        assert learner.best is not None or learner.phase >= 2
        if learner.phase == 1:
            if ops < self.next_check.get(key, 0):   # settled by this header's report
                return learner.best, False  # type: ignore[return-value]
            learner.start_check()
            if learner.phase == 1:    # nothing to compare against
                self._publish(key, learner, ops)
                return learner.best, False  # type: ignore[return-value]
        self.routes.set(which, sc, key[2], SLOW, 0)
        return learner.check_code(), True

    def learned(self, which: int, nbytes: int, code: int, zerocopy: bool,
                nanoseconds: int) -> None:
        """A learning call finished on this rank in `nanoseconds`; its
        report goes out with the next header step."""
        sc = size_class(nbytes)
        pl = int(zerocopy) if code != MPI_PATH else self.routes.placement(which, sc)
        key = (which, sc, pl)
        report = 1 + (which * NCLASSES + sc) * 2 + pl
        self.pending = (report << 8 | code, key, code, max(1, nanoseconds))

    # ---------------------------------------------------------------- show

    def decisions(self) -> dict[tuple[int, int, int], Learner]:
        """The settled classes."""
        return {k: v for k, v in self.learners.items() if v.best is not None}


def decision(comm: Any, name: str, nbytes: int) -> str | None:
    """What adaptive selection settled on for collective `name` (e.g.
    "bcast") of `nbytes` (all blocks together) on `comm`, for the placement
    its last pool call found: 'mpi', 'pool', 'pool+stream', ...; None when
    nothing is settled (or the path is pinned)."""
    from ._shim import states

    state = states.get(getattr(comm, "handle", None))
    routes = getattr(state, "routes", None)
    if routes is None or name not in config.COLLECTIVES:
        return None
    which, sc = config.COLLECTIVES.index(name), size_class(nbytes)
    learner = routes.selector.learners.get((which, sc, routes.placement(which, sc)))
    if learner is None or learner.best is None:
        return None
    return code_name(learner.best)


# ------------------------------------------------------------------- cache


def cache_path(cfg: config.Config | None = None) -> str | None:
    """Where the cache file is (CXLMPI_CACHE), None when it is off."""
    cfg = config.get() if cfg is None else cfg
    path = cfg.cache
    if path.lower() in ("", "off", "none", "0"):
        return None
    return os.path.expanduser(path)


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def fingerprint(nranks: int, mpi_library: str, cfg: config.Config) -> dict[str, Any]:
    """What a cache entry is valid for: this machine, the ranks of the pool,
    the MPI library, cxlmpi's version, the pool's backend and coherence."""
    return {"cpu": _cpu_model(), "cores": os.cpu_count() or 0, "ranks": nranks,
            "mpi": " ".join(mpi_library.splitlines()[0].split()) if mpi_library else "",
            "cxlmpi": _version(), "pool": cfg.pool, "coherence": cfg.coherence,
            "chunk": cfg.chunk_size}


def _version() -> str:
    """cxlmpi's version, as installed (the package's own __init__ imports
    this module: no import back)."""
    from importlib import metadata

    try:
        return metadata.version("cxlmpi")
    except metadata.PackageNotFoundError:
        return "unknown"


def _key(fp: dict[str, Any]) -> str:
    return json.dumps(fp, sort_keys=True)


def _size_name(sc: int) -> str:
    return str(class_floor(sc))


def load_cache(path: str | None, fp: dict[str, Any]) -> dict[tuple[int, int, int], Any]:
    """The cached decisions of machine `fp`: {(collective index, size
    class, placement): entry}; empty when there are none or the file is
    unreadable (a cache never stops a job)."""
    if path is None:
        return {}
    try:
        with open(path) as f:
            data = json.load(f)
        table = data["machines"][_key(fp)]["decisions"]
    except (OSError, ValueError, KeyError, TypeError):
        return {}
    out: dict[tuple[int, int, int], Any] = {}
    for name, sizes in table.items() if isinstance(table, dict) else ():
        if name not in config.COLLECTIVES or not isinstance(sizes, dict):
            continue
        for size, places in sizes.items():
            if not isinstance(places, dict):
                continue
            try:
                sc = size_class(int(size))
            except ValueError:
                continue
            for pl, entry in places.items():
                if pl in PLACEMENTS and isinstance(entry, dict):
                    out[(config.COLLECTIVES.index(name), sc, PLACEMENTS.index(pl))] = entry
    return out


def read_cache(path: str | None) -> dict[str, Any]:
    """The whole cache file ({"machines": {key: {"machine": fp,
    "decisions": ...}}}), empty when missing or unreadable."""
    if path is None:
        return {"machines": {}}
    try:
        with open(path) as f:
            data = json.load(f)
        if isinstance(data, dict) and isinstance(data.get("machines"), dict):
            return data
    except (OSError, ValueError):
        pass
    return {"machines": {}}


def describe_cache(path: str | None) -> list[str]:
    """The cached decisions, a line per machine and class, for --info."""
    if path is None:
        return ["adaptive selection cache: off (CXLMPI_CACHE)"]
    machines = read_cache(path)["machines"]
    lines = [f"adaptive selection cache: {path} "
             f"({len(machines)} machine{'s' if len(machines) != 1 else ''})"]
    for entry in machines.values():
        fp = entry.get("machine", {})
        lines.append(f"  {fp.get('cpu', '?')}, {fp.get('cores', '?')} cores, "
                     f"{fp.get('ranks', '?')} ranks per pool, {fp.get('mpi', '?')}, "
                     f"cxlmpi {fp.get('cxlmpi', '?')}, pool {fp.get('pool', '?')}:")
        for name, sizes in sorted(entry.get("decisions", {}).items(),
                                  key=lambda kv: config.COLLECTIVES.index(kv[0])
                                  if kv[0] in config.COLLECTIVES else 99):
            for size, places in sorted(sizes.items(), key=lambda kv: int(kv[0])):
                for pl, d in sorted(places.items()):
                    lines.append(f"    {name:<21} >= {int(size):>10} B  {pl:<7} "
                                 f"{d.get('best')} (runner-up {d.get('runner_up')})")
    return lines


def save_cache(path: str | None, fp: dict[str, Any],
               learned: dict[tuple[int, int, int], Learner]) -> bool:
    """Merge the settled `learned` classes into the cache file (atomically:
    a reader sees the old file or the new one); False when it could not be
    written (a cache never stops a job)."""
    if path is None or not learned:
        return False
    try:
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        data = read_cache(path)
        entry = data["machines"].setdefault(_key(fp), {"machine": fp, "decisions": {}})
        table = entry.setdefault("decisions", {})
        for (which, sc, pl), learner in sorted(learned.items()):
            if learner.best is None:
                continue
            table.setdefault(config.COLLECTIVES[which], {}).setdefault(
                _size_name(sc), {})[PLACEMENTS[pl]] = learner.as_cache()
        directory = os.path.dirname(os.path.abspath(path))
        fd, tmp = tempfile.mkstemp(prefix=".cxlmpi-cache-", suffix=".json", dir=directory)
        try:
            with os.fdopen(fd, "w") as f:
                json.dump(data, f, indent=1, sort_keys=True)
                f.write("\n")
            os.replace(tmp, path)
        except BaseException:
            if os.path.exists(tmp):
                os.unlink(tmp)
            raise
    except (OSError, ValueError, TypeError):
        return False
    return True
