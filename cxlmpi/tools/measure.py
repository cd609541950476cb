"""How the benchmark measures (cxlmpi.tools.bench): OSU's iterations, a
timed batch, the alternating rounds of stock MPI and cxlmpi (`measure`),
and where and how the figures were taken (`metadata`)."""

from __future__ import annotations

import datetime
import math
import platform
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from time import perf_counter
from typing import Any, Callable

import numpy as np
from mpi4py import MPI

import cxlmpi
from cxlmpi import config, select

from .operations import Collective, make_buffers, validate

__all__ = ["Settings", "measure", "metadata", "osu_iterations", "time_batch",
           "MIN_ITERATIONS", "MIN_WARMUP", "Speed", "time_speed", "case_seconds",
           "command_line"]

# OSU micro-benchmarks: messages above LARGE_MESSAGE_SIZE get fewer calls.
LARGE_MESSAGE_SIZE = 8 << 10
SMALL_ITERATIONS, SMALL_WARMUP = 1000, 200
LARGE_ITERATIONS, LARGE_WARMUP = 100, 10
# Above that, the timed calls of one batch move at most about this many bytes
# per rank (16 MiB: 64 calls, 256 MiB: MIN_ITERATIONS), never fewer calls.
LARGE_BYTE_BUDGET = 1 << 30
MIN_ITERATIONS, MIN_WARMUP = 5, 2


def osu_iterations(size: int) -> tuple[int, int]:
    """(timed iterations, warm-up iterations) for a message of `size` bytes
    (all blocks of a rank together for the block collectives)."""
    if size <= LARGE_MESSAGE_SIZE:
        return SMALL_ITERATIONS, SMALL_WARMUP
    iterations = max(MIN_ITERATIONS, min(LARGE_ITERATIONS, LARGE_BYTE_BUDGET // size))
    warmup = max(MIN_WARMUP, min(LARGE_WARMUP, iterations // 5))
    return iterations, warmup



def time_batch(fn: Callable[..., Any], args: tuple[Any, ...], iterations: int, warmup: int,
                barrier: MPI.Intracomm, stamp: np.ndarray | None, first_mark: int) -> float:
    """Seconds per call on this rank: warm-up calls, a Barrier, then
    `iterations` timed calls.  With `stamp`, each call first writes a new
    mark (the iteration number) into element 0 of the send buffer."""
    for _ in range(warmup):
        fn(*args)
    if stamp is None:
        barrier.Barrier()
        t0 = perf_counter()
        for _ in range(iterations):
            fn(*args)
        t1 = perf_counter()
    else:
        modulus = 256 if stamp.dtype.kind == "u" else 1 << 52
        marks = (np.arange(first_mark, first_mark + iterations) % modulus).astype(
            stamp.dtype).tolist()
        barrier.Barrier()
        t0 = perf_counter()
        for mark in marks:
            stamp[0] = mark
            fn(*args)
        t1 = perf_counter()
    return (t1 - t0) / iterations


def _time_memcpy(dst: np.ndarray, src: np.ndarray, iterations: int, warmup: int,
                 barrier: MPI.Intracomm) -> float:
    """Seconds per np.copyto(dst, src) on this rank, every rank at once."""
    for _ in range(warmup):
        np.copyto(dst, src)
    barrier.Barrier()
    t0 = perf_counter()
    for _ in range(iterations):
        np.copyto(dst, src)
    return (perf_counter() - t0) / iterations


def _over_ranks(comm: MPI.Intracomm, seconds: float) -> tuple[float, float, float] | None:
    """(avg, min, max) over ranks of a per-call time, in µs, on rank 0 (None elsewhere)."""
    times = comm.gather(seconds, root=0)
    if times is None:
        return None
    us = [t * 1e6 for t in times]
    return sum(us) / len(us), min(us), max(us)


def _pool_path(key: str, before: dict[str, dict[str, float]]) -> tuple[str, int, int]:
    """How cxlmpi ran `key` since `before`: 'pool', 'mpi' or 'mixed', with
    the counts of pool and passed-through calls."""
    now = cxlmpi.stats().get(key, {})
    was = before.get(key, {})
    pool = int(now.get("pool_calls", 0) - was.get("pool_calls", 0))
    passed = int(now.get("passthrough_calls", 0) - was.get("passthrough_calls", 0))
    path = "mixed" if pool and passed else "pool" if pool else "mpi"
    return path, pool, passed



@dataclass(frozen=True)
class Settings:
    """How to measure (from the command line; None: OSU's choice by size)."""

    rounds: int
    iterations: int | None
    warmup: int | None
    buffers: str
    data_varying: bool
    validate: bool


# Calls at most that a class may take to settle before the rounds start.
SETTLE_CALLS = 2000       # calls a class may take to settle before the rounds ...
SETTLE_BYTES = 8 << 30    # ... but no more than this many bytes' worth (at least 100)


def measure(op: Collective, requested: int, stock: MPI.Intracomm, wrapped: MPI.Intracomm,
            settings: Settings) -> dict[str, Any] | None:
    """Benchmark `op` at `requested` bytes: the record on rank 0, None elsewhere."""
    nranks = stock.Get_size()
    size = op.message_size(requested, nranks)
    count = size // op.itemsize
    nsend, nrecv = op.counts(count, nranks)
    total = max(nsend, nrecv) * op.itemsize
    iterations, warmup = osu_iterations(total)
    iterations = settings.iterations or iterations
    warmup = warmup if settings.warmup is None else settings.warmup

    bufs = make_buffers(op, count, settings.buffers, wrapped)
    stamp = bufs.send if settings.data_varying and bufs.send is not None else None
    calls = [op.bind(comm, bufs) for comm in (stock, wrapped)]
    copy_src = np.ones(size, np.uint8)
    copy_dst = np.zeros(size, np.uint8)

    rounds: dict[str, list[tuple[float, float, float]]] = {"stock": [], "cxlmpi": [],
                                                           "memcpy": []}
    first_before = path_before = cxlmpi.stats()
    # Adaptive selection: its learning calls first (every rank reads the
    # same, agreed decision, so every rank ends this loop alike); the
    # rounds then time what a program gets after them (re-checks included).
    fn, args = calls[1]
    learns = config.get().adaptive and op.stat_key in config.COLLECTIVES and \
        total >= min(config.get().threshold, config.get().hosts_threshold)
    settle = max(100, min(SETTLE_CALLS, SETTLE_BYTES // max(total, 1)))
    for i in range(settle if learns else 0):
        # (asked every 16 calls: the Python between calls is part of what
        # a learning run times, and the rounds call back to back)
        if i % 16 == 0 and select.decision(wrapped, op.stat_key, total) is not None:
            break
        fn(*args)
    mark = 0
    for _ in range(settings.rounds):
        for label, (fn, args) in zip(("stock", "cxlmpi"), calls):
            if label == "cxlmpi":   # the path: what the last round's calls took
                path_before = cxlmpi.stats()
            seconds = time_batch(fn, args, iterations, warmup, stock, stamp, mark)
            mark += iterations
            figures = _over_ranks(stock, seconds)
            if figures is not None:
                rounds[label].append(figures)
        if size:
            seconds = _time_memcpy(copy_dst, copy_src, iterations, min(warmup, MIN_WARMUP),
                                   stock)
            figures = _over_ranks(stock, seconds)
            if figures is not None:
                rounds["memcpy"].append(figures)
    path, pool_calls, passed_calls = _pool_path(op.stat_key, path_before)
    learning = int(cxlmpi.stats().get(op.stat_key, {}).get("learning_calls", 0)
                   - first_before.get(op.stat_key, {}).get("learning_calls", 0))
    choice = select.decision(wrapped, op.stat_key, total)
    if op.name == "Bcast_view":  # by reference: no copy through pool or MPI
        path = "view"
    del bufs, calls, copy_src, copy_dst

    problems = validate(op, count, settings.buffers, stock, wrapped) \
        if settings.validate else None
    if stock.Get_rank() != 0:
        return None

    def median(label: str, which: int) -> float | None:
        values = [r[which] for r in rounds[label]]
        return statistics.median(values) if values else None

    record: dict[str, Any] = {"op": op.name, "size": size, "requested_size": requested,
                              "total_bytes": total, "dtype": str(np.dtype(op.dtype)),
                              "count": count, "ranks": nranks, "iterations": iterations,
                              "warmup": warmup, "rounds": settings.rounds}
    for label in ("stock", "cxlmpi", "memcpy"):
        for which, stat in enumerate(("avg", "min", "max")):
            record[f"{label}_{stat}_us"] = median(label, which)
    stock_us, cxl_us, copy_us = (record["stock_avg_us"], record["cxlmpi_avg_us"],
                                 record["memcpy_avg_us"])
    record["speedup"] = stock_us / cxl_us if cxl_us else math.nan
    record["cxlmpi_per_memcpy"] = cxl_us / copy_us if copy_us else None
    record.update(path=path, pool_calls=pool_calls, passthrough_calls=passed_calls,
                  learning_calls=learning, choice=choice,
                  buffers=settings.buffers, data_varying=settings.data_varying)
    record["valid"] = None if problems is None else not problems
    record["validation_errors"] = problems or []
    for label in ("stock", "cxlmpi", "memcpy"):
        record[f"rounds_{label}_avg_us"] = [r[0] for r in rounds[label]]
    return record



# ------------------------------------------------------------ how long


@dataclass(frozen=True)
class Speed:
    """What calls cost on this machine, timed once before a plan runs
    (`time_speed`): `call_s`, a Barrier's seconds (a collective's latency);
    `collective_bps`, bytes per second of stock Allreduce and Bcast of 1 MiB
    (what a loaded machine's collectives move, far below memcpy's);
    `copy_bps`, bytes per second of one memcpy on every rank at once."""

    call_s: float
    collective_bps: float
    copy_bps: float

    def call(self, nbytes: int) -> float:
        """Seconds of one collective moving `nbytes` per rank."""
        return self.call_s + nbytes / self.collective_bps

    def copy(self, nbytes: int) -> float:
        return nbytes / self.copy_bps


SPEED_NBYTES = 1 << 20


def time_speed(comm: MPI.Intracomm) -> Speed:
    """Collective: a few Barriers, stock Allreduces and Bcasts of 1 MiB and
    memcpys; the slowest rank's figures (the same Speed on every rank)."""
    comm = MPI.Intracomm(comm)      # (stock, whatever it is given)
    src, dst = np.ones(SPEED_NBYTES // 8), np.empty(SPEED_NBYTES // 8)
    calls = {"barrier": lambda: comm.Barrier(),
             "allreduce": lambda: comm.Allreduce(src, dst),
             "bcast": lambda: comm.Bcast(src),
             "copy": lambda: np.copyto(dst, src)}
    seconds = {}
    for name, call in calls.items():
        call()
        comm.Barrier()
        t0 = perf_counter()
        for _ in range(5):
            call()
        seconds[name] = (perf_counter() - t0) / 5
    figures = comm.allgather(seconds)
    worst = {name: max(f[name] for f in figures) for name in calls}
    per_byte = (worst["allreduce"] + worst["bcast"]) / 2 - worst["barrier"]
    return Speed(worst["barrier"], SPEED_NBYTES / max(per_byte, 1e-9),
                 SPEED_NBYTES / max(worst["copy"], 1e-9))


def case_seconds(op: Collective, requested: int, nranks: int, settings: Settings,
                 speed: Speed, iterations_of: Callable[[int], tuple[int, int]] = osu_iterations,
                 learns: Callable[[str, int], bool] | None = None) -> float:
    """About how long `measure` takes for `op` at `requested` bytes: per
    round a timed batch of each side and a memcpy batch, the warm-ups, and
    where adaptive selection has it to learn (`learns(collective, total
    bytes)`) the calls it takes to settle."""
    size = op.message_size(requested, nranks)
    nsend, nrecv = op.counts(size // op.itemsize, nranks)
    total = max(nsend, nrecv) * op.itemsize
    iterations, warmup = iterations_of(total)
    iterations = settings.iterations or iterations
    warmup = warmup if settings.warmup is None else settings.warmup
    per_round = 2 * (iterations + warmup) * speed.call(total) + \
        (iterations + min(warmup, MIN_WARMUP)) * speed.copy(size)
    # learning from nothing, settling took about a quarter of the loop's cap
    # (2-core VM); a class the selection cache knows needs none
    settle = max(100, min(SETTLE_CALLS, SETTLE_BYTES // max(total, 1))) // 4 \
        if learns is not None and learns(op.stat_key, total) else 0
    return settings.rounds * per_round + settle * speed.call(total) + 0.01


def command_line(argv: Sequence[str], module: str, nranks: int) -> str:
    """The command as a user would type it again: ``mpiexec -n N python -m
    MODULE ARGS`` (the launcher's own options are not known here)."""
    import shlex

    return shlex.join(["mpiexec", "-n", str(nranks), "python", "-m", module, *argv])


def metadata(comm: MPI.Intracomm, settings: Settings, argv: Sequence[str]) -> dict[str, Any]:
    """Where and how the figures were taken."""
    import os

    import mpi4py

    from cxlmpi.select.cache import cpu_model

    cfg = config.get()
    return {
        "tool": "cxlmpi.bench",
        "command": ["python", "-m", "cxlmpi.bench", *argv],
        "command_line": command_line(argv, "cxlmpi.bench", comm.Get_size()),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "host": MPI.Get_processor_name(),
        "cpu": cpu_model(),
        "cores": os.cpu_count(),
        "ranks": comm.Get_size(),
        "cxlmpi_version": cxlmpi.__version__,
        "mpi4py_version": mpi4py.__version__,
        "numpy_version": np.__version__,
        "python_version": platform.python_version(),
        "mpi_version": "{}.{}".format(*MPI.Get_version()),
        "mpi_library": " ".join(MPI.Get_library_version().splitlines()[0].split()),
        "mpi_library_full": MPI.Get_library_version().strip(),
        "settings": cfg.as_dict(),
        "windows": {k: (None if w is None else list(w)) for k, w in cfg.windows().items()},
        "bench": {"rounds": settings.rounds, "iterations": settings.iterations,
                  "warmup": settings.warmup, "buffers": settings.buffers,
                  "data_varying": settings.data_varying, "validate": settings.validate,
                  "method": "OSU: warm-up, Barrier, timed batch; per-rank time per call, "
                            "avg/min/max over ranks; median of rounds alternating "
                            "stock and cxlmpi"},
    }

