"""Stock MPI vs cxlmpi, collective by collective, the OSU micro-benchmark way.

    mpiexec -n 2 python -m cxlmpi.bench [--ops Allreduce,Bcast | all]
        [--sizes 8,64K,1M | --min-size 8 --max-size 256M]
        [--rounds 3] [--iterations N] [--warmup N] [--buffers private]
        [--data-varying] [--validate] [--csv F] [--json F] [--plot F.png] [--quiet]

Method (as the OSU micro-benchmarks measure collectives): for each collective
and message size, warm-up calls, a Barrier, then a timed batch of back-to-back
calls; each rank's time per call is its batch time over the iterations, and
the ranks' times give the average, minimum and maximum.  Iterations follow
OSU (200 warm-up and 1000 timed calls up to 8 KiB, 10 and 100 above), scaled
down for large messages so that a run stays short.

Both communicators run in the same job on the same MPI communicator: the
stock one (a plain ``MPI.Intracomm`` on the handle) and the wrapped one
(``cxlmpi.wrap``), alternately (stock, cxlmpi, stock, cxlmpi, ...) over
``--rounds`` rounds, on the same buffers; every figure is the median of the
rounds.  speedup = stock time / cxlmpi time (above 1: cxlmpi is faster).
Each round also times one memcpy (``np.copyto``) of the message size on every
rank at once: the physical reference, and cxlmpi's time as a multiple of it.
"""

from __future__ import annotations

import argparse
import csv
import datetime
import importlib.util
import json
import math
import os
import platform
import statistics
import sys
import traceback
from collections.abc import Sequence
from dataclasses import dataclass
from time import perf_counter
from typing import TYPE_CHECKING, Any, Callable

import numpy as np
from mpi4py import MPI

import cxlmpi
from cxlmpi import config, select

if TYPE_CHECKING:
    from matplotlib.figure import Figure

__all__ = [
    "BENCHMARKS",
    "DEFAULT_OPS",
    "BUFFER_KINDS",
    "Collective",
    "Buffers",
    "allocate",
    "make_buffers",
    "osu_iterations",
    "size_list",
    "format_size",
    "describe_mismatch",
    "plot_figure",
    "write_plot",
    "main",
]

# ----------------------------------------------------------------- method

# OSU micro-benchmarks: messages above LARGE_MESSAGE_SIZE get fewer calls.
LARGE_MESSAGE_SIZE = 8 << 10
SMALL_ITERATIONS, SMALL_WARMUP = 1000, 200
LARGE_ITERATIONS, LARGE_WARMUP = 100, 10
# Above that, the timed calls of one batch move at most about this many bytes
# per rank (16 MiB: 64 calls, 256 MiB: MIN_ITERATIONS), never fewer calls.
LARGE_BYTE_BUDGET = 1 << 30
MIN_ITERATIONS, MIN_WARMUP = 5, 2

DEFAULT_MIN_SIZE, DEFAULT_MAX_SIZE = "8", "256M"
DEFAULT_ROUNDS = 3
ROOT = 0


def osu_iterations(size: int) -> tuple[int, int]:
    """(timed iterations, warm-up iterations) for a message of `size` bytes
    (all blocks of a rank together for the block collectives)."""
    if size <= LARGE_MESSAGE_SIZE:
        return SMALL_ITERATIONS, SMALL_WARMUP
    iterations = max(MIN_ITERATIONS, min(LARGE_ITERATIONS, LARGE_BYTE_BUDGET // size))
    warmup = max(MIN_WARMUP, min(LARGE_WARMUP, iterations // 5))
    return iterations, warmup


# ------------------------------------------------------------ collectives


@dataclass
class Buffers:
    """The message buffers of one rank for one collective.  For Bcast `send`
    is the broadcast buffer and `recv` is None."""

    send: np.ndarray | None
    recv: np.ndarray | None

    def output(self) -> np.ndarray | None:
        """The buffer holding the collective's result."""
        return self.recv if self.recv is not None else self.send


Binder = Callable[[MPI.Intracomm, Buffers], tuple[Callable[..., Any], tuple[Any, ...]]]


@dataclass(frozen=True)
class Collective:
    """How to benchmark one collective.

    `counts(n, nranks)` gives the element counts of the send and receive
    buffers (0: none) for a message of `n` elements; `bind(comm, buffers)`
    gives the method and arguments of one call; `defined(rank, nranks)`
    says whether the result on `rank` is defined (compared by --validate)."""

    name: str
    dtype: str  # numpy dtype: "f8" for reductions, "u1" (MPI.BYTE) for data movement
    counts: Callable[[int, int], tuple[int, int]]
    bind: Binder
    defined: Callable[[int, int], bool]
    block_divides: bool = False  # the message must split into nranks equal blocks

    @property
    def itemsize(self) -> int:
        return np.dtype(self.dtype).itemsize

    @property
    def stat_key(self) -> str:
        """Name of the collective in cxlmpi.stats()."""
        return self.name.lower()

    def message_size(self, requested: int, nranks: int) -> int:
        """The size actually measured for `requested` bytes: whole elements
        (and whole blocks per rank where the collective needs that), at
        least one of each."""
        if self.name == "Barrier":
            return 0
        unit = self.itemsize * (nranks if self.block_divides else 1)
        return max(unit, requested // unit * unit)


def _everywhere(rank: int, nranks: int) -> bool:
    return True


def _at_root(rank: int, nranks: int) -> bool:
    return rank == ROOT


def _not_first(rank: int, nranks: int) -> bool:
    return rank > 0


def _same(n: int, p: int) -> tuple[int, int]:
    return n, n


def _sum(op: str) -> Binder:
    def bind(comm: MPI.Intracomm, b: Buffers) -> tuple[Callable[..., Any], tuple[Any, ...]]:
        method = getattr(comm, op)
        if op == "Reduce":
            return method, (b.send, b.recv, MPI.SUM, ROOT)
        return method, (b.send, b.recv, MPI.SUM)
    return bind


def _pair(op: str, rooted: bool = False) -> Binder:
    def bind(comm: MPI.Intracomm, b: Buffers) -> tuple[Callable[..., Any], tuple[Any, ...]]:
        method = getattr(comm, op)
        return method, ((b.send, b.recv, ROOT) if rooted else (b.send, b.recv))
    return bind


def _bind_bcast(comm: MPI.Intracomm, b: Buffers) -> tuple[Callable[..., Any], tuple[Any, ...]]:
    return comm.Bcast, (b.send, ROOT)


def _bind_bcast_view(comm: MPI.Intracomm, b: Buffers
                     ) -> tuple[Callable[..., Any], tuple[Any, ...]]:
    """cxlmpi's broadcast by reference against stock's Bcast of the same
    buffer (the views are checked in the test suite, not here)."""
    if isinstance(comm, cxlmpi.CXLComm):
        return comm.Bcast_view, (b.send, ROOT)
    return comm.Bcast, (b.send, ROOT)


def _bind_barrier(comm: MPI.Intracomm, b: Buffers) -> tuple[Callable[..., Any], tuple[Any, ...]]:
    return comm.Barrier, ()


# The collectives this tool measures, by mpi4py method name (`--ops`).
BENCHMARKS: dict[str, Collective] = {c.name: c for c in (
    Collective("Allreduce", "f8", _same, _sum("Allreduce"), _everywhere),
    Collective("Reduce", "f8", _same, _sum("Reduce"), _at_root),
    Collective("Bcast", "u1", lambda n, p: (n, 0), _bind_bcast, _everywhere),
    Collective("Allgather", "u1", lambda n, p: (n, n * p), _pair("Allgather"), _everywhere),
    Collective("Gather", "u1", lambda n, p: (n, n * p), _pair("Gather", True), _at_root),
    Collective("Scatter", "u1", lambda n, p: (n * p, n), _pair("Scatter", True), _everywhere),
    Collective("Alltoall", "u1", lambda n, p: (n * p, n * p), _pair("Alltoall"), _everywhere),
    Collective("Reduce_scatter_block", "f8", lambda n, p: (n, n // p),
               _sum("Reduce_scatter_block"), _everywhere, block_divides=True),
    Collective("Scan", "f8", _same, _sum("Scan"), _everywhere),
    Collective("Exscan", "f8", _same, _sum("Exscan"), _not_first),
    Collective("Barrier", "u1", lambda n, p: (0, 0), _bind_barrier, _everywhere),
    Collective("Bcast_view", "u1", lambda n, p: (n, 0), _bind_bcast_view, _at_root),
)}

DEFAULT_OPS = ("Allreduce", "Bcast")

# ---------------------------------------------------------------- buffers

BUFFER_KINDS = ("private", "pool")


class BenchError(Exception):
    """A problem with the request, found alike on every rank (exit status 2)."""


def allocate(kind: str, count: int, dtype: str, comm: MPI.Intracomm) -> np.ndarray:
    """One message buffer of `count` elements of `dtype`, of buffer `kind`:
    "private" (a numpy array of this process) or "pool" (an array resident in
    the pool of `comm`: collective, every rank allocates alike)."""
    if kind == "private":
        return np.empty(count, dtype)
    if kind == "pool":
        return cxlmpi.empty(count, dtype, comm=comm)
    raise BenchError(f"unknown buffer kind {kind!r} (use one of {', '.join(BUFFER_KINDS)})")


def make_buffers(op: Collective, count: int, kind: str, comm: MPI.Intracomm) -> Buffers:
    """The buffers of `op` for a message of `count` elements, filled with this
    rank's pattern (which also touches every page before timing)."""
    nsend, nrecv = op.counts(count, comm.Get_size())
    send = allocate(kind, nsend, op.dtype, comm) if nsend else None
    recv = allocate(kind, nrecv, op.dtype, comm) if nrecv else None
    for buf in (send, recv):
        if buf is not None:
            fill_pattern(buf, comm.Get_rank())
    return Buffers(send, recv)


def fill_pattern(buf: np.ndarray, rank: int) -> None:
    """Rank- and position-dependent small integers (exact in float64, so
    every sum is exact whatever the order)."""
    index = np.arange(buf.size)
    if buf.dtype.kind == "f":
        buf[...] = index % 13 + rank + 1
    else:
        buf[...] = (index * 7 + rank * 31 + 1) % 251


SENTINEL = {"f": -7.0, "u": 0xEE}


# ---------------------------------------------------------------- timing


def _time_batch(fn: Callable[..., Any], args: tuple[Any, ...], iterations: int, warmup: int,
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


# -------------------------------------------------------------- validation


def describe_mismatch(expected: np.ndarray, got: np.ndarray) -> str | None:
    """None when the arrays are equal (np.array_equal), else what differs."""
    if np.array_equal(expected, got):
        return None
    if expected.shape != got.shape:
        return f"shapes differ: {expected.shape} vs {got.shape}"
    bad = np.flatnonzero(expected != got)
    i = int(bad[0])
    return (f"{bad.size} of {expected.size} elements differ, first at [{i}]: "
            f"stock {expected[i].item()!r}, cxlmpi {got[i].item()!r}")


def validate(op: Collective, count: int, kind: str, stock: MPI.Intracomm,
             wrapped: MPI.Intracomm) -> list[str] | None:
    """Run `op` once on each communicator with the same data and compare
    the results where defined.  On rank 0: the problems found, one line per
    rank ([] when none); None on the other ranks."""
    rank, nranks = stock.Get_rank(), stock.Get_size()
    outputs = []
    for comm in (stock, wrapped):
        bufs = make_buffers(op, count, kind, wrapped)
        sentinel = SENTINEL[np.dtype(op.dtype).kind]
        if bufs.recv is not None:
            bufs.recv[...] = sentinel
        elif bufs.send is not None and rank != ROOT:  # Bcast: the others receive
            bufs.send[...] = sentinel
        fn, args = op.bind(comm, bufs)
        fn(*args)
        outputs.append(bufs.output())
    problem = None
    if op.defined(rank, nranks) and outputs[0] is not None and outputs[1] is not None:
        problem = describe_mismatch(outputs[0], outputs[1])
    found = stock.gather(problem, root=0)
    if found is None:
        return None
    return [f"rank {r}: {text}" for r, text in enumerate(found) if text is not None]


# ------------------------------------------------------------- measuring


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
            seconds = _time_batch(fn, args, iterations, warmup, stock, stamp, mark)
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


# ---------------------------------------------------------------- output


def format_size(nbytes: int) -> str:
    """'8 B', '64 KiB', '16 MiB', '1 GiB'; plain bytes when not a whole unit."""
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if nbytes and nbytes % (1 << shift) == 0:
            return f"{nbytes >> shift} {unit}"
    return f"{nbytes} B"


def _us(value: float | None) -> str:
    if value is None or not math.isfinite(value):
        return "-"
    if value < 100:
        return f"{value:.2f}"
    if value < 10000:
        return f"{value:.1f}"
    return f"{value:.0f}"


def format_table(records: Sequence[dict[str, Any]], validated: bool) -> str:
    """The records as an aligned text table."""
    head = ["op", "size", "stock us", "min/max", "cxlmpi us", "min/max", "speedup",
            "memcpy us", "cxlmpi/memcpy", "path", "chosen (learning calls)"] + \
        (["check"] if validated else [])
    rows = [head]
    for r in records:
        ratio = r["cxlmpi_per_memcpy"]
        row = [r["op"], format_size(r["size"]) if r["op"] != "Barrier" else "-",
               _us(r["stock_avg_us"]), f"{_us(r['stock_min_us'])}/{_us(r['stock_max_us'])}",
               _us(r["cxlmpi_avg_us"]), f"{_us(r['cxlmpi_min_us'])}/{_us(r['cxlmpi_max_us'])}",
               f"{r['speedup']:.2f}x", _us(r["memcpy_avg_us"]),
               "-" if ratio is None else f"{ratio:.2f}x", r["path"],
               "-" if r.get("choice") is None else
               f"{r['choice']} ({r.get('learning_calls', 0)})"]
        if validated:
            row.append("ok" if r["valid"] else "FAIL")
        rows.append(row)
    widths = [max(len(row[i]) for row in rows) for i in range(len(head))]
    lines = ["  ".join(cell.ljust(w) if i < 2 else cell.rjust(w)
                       for i, (cell, w) in enumerate(zip(row, widths))).rstrip()
             for row in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


CSV_FIELDS = ("op", "size", "requested_size", "total_bytes", "dtype", "count", "ranks",
              "iterations", "warmup", "rounds",
              "stock_avg_us", "stock_min_us", "stock_max_us",
              "cxlmpi_avg_us", "cxlmpi_min_us", "cxlmpi_max_us", "speedup",
              "memcpy_avg_us", "memcpy_min_us", "memcpy_max_us", "cxlmpi_per_memcpy",
              "path", "pool_calls", "passthrough_calls", "learning_calls", "choice", "buffers",
              "data_varying", "valid")


def write_csv(path: str, records: Sequence[dict[str, Any]]) -> None:
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=CSV_FIELDS, extrasaction="ignore")
        writer.writeheader()
        writer.writerows(records)


def write_json(path: str, records: Sequence[dict[str, Any]], metadata: dict[str, Any]) -> None:
    with open(path, "w") as f:
        json.dump({"metadata": metadata, "records": list(records)}, f, indent=1,
                  default=str)
        f.write("\n")


# How cxlmpi ran the calls of a record ("path"), as a marker of its points.
PATH_MARKERS = {"pool": "o", "view": "D", "mixed": "s", "mpi": "x"}
PATH_LABELS = {"pool": "cxlmpi: pool", "view": "cxlmpi: by reference",
               "mixed": "cxlmpi: pool and MPI", "mpi": "cxlmpi: passed to MPI"}
STOCK_COLOUR, SHIM_COLOUR, MEMCPY_COLOUR = "0.45", "tab:blue", "0.7"


def _spread(median: float, values: Sequence[float]) -> tuple[float, float]:
    """(below, above) the median to the min and max of the rounds (0 when
    the record has no per-round figures)."""
    if not values:
        return 0.0, 0.0
    return max(0.0, median - min(values)), max(0.0, max(values) - median)


def _round_speedups(record: dict[str, Any]) -> list[float]:
    """stock / cxlmpi of each round (the two alternate in every round)."""
    pairs = zip(record.get("rounds_stock_avg_us") or [], record.get("rounds_cxlmpi_avg_us") or [])
    return [s / c for s, c in pairs if c]


def plot_figure(records: Sequence[dict[str, Any]],
                metadata: dict[str, Any] | None = None) -> Figure:
    """A matplotlib Figure of `records` (as ``--json`` writes them): one
    panel per collective (small multiples, in the order measured), each a
    latency plot (stock, cxlmpi and memcpy, µs) above a speedup plot
    (stock / cxlmpi, log scale).  Only the sizes measured are drawn, as
    points (no lines between them) with x ticks at exactly those sizes; the error bars
    run from the fastest to the slowest round; cxlmpi's marker says how it
    ran the calls (PATH_MARKERS: through the pool, or passed to MPI).
    Barrier (no message size) is not drawn.  Each axes is labelled "<op>
    latency" or "<op> speedup" (``Axes.get_label()``); needs matplotlib
    (3.7 or later: the optional ``[bench]`` extra)."""
    from matplotlib.figure import Figure
    from matplotlib.lines import Line2D
    from matplotlib.ticker import FixedLocator, FuncFormatter, NullLocator

    ops = list(dict.fromkeys(r["op"] for r in records if r["size"]))
    if not ops:
        raise ValueError("nothing to plot: no record with a message size")
    ncols = min(3, len(ops))
    nrows = math.ceil(len(ops) / ncols)
    fig = Figure(figsize=(4.6 * ncols, 4.4 * nrows + 0.9), layout="constrained")
    grid = fig.add_gridspec(nrows, ncols)
    paths_seen: list[str] = []
    for i, op in enumerate(ops):
        rows = sorted((r for r in records if r["op"] == op), key=lambda r: r["size"])
        sizes = [r["size"] for r in rows]
        cell = grid[i // ncols, i % ncols].subgridspec(2, 1, height_ratios=[3, 2], hspace=0)
        lat = fig.add_subplot(cell[0], label=f"{op} latency")
        gain = fig.add_subplot(cell[1], sharex=lat, label=f"{op} speedup")
        lat.set_title(op, fontsize="medium")
        for label, colour, marker in (("stock", STOCK_COLOUR, "s"), ("memcpy", MEMCPY_COLOUR, "_")):
            points = [(r["size"], r[f"{label}_avg_us"], r.get(f"rounds_{label}_avg_us") or [])
                      for r in rows if r.get(f"{label}_avg_us") is not None]
            if points:
                lat.errorbar([p[0] for p in points], [p[1] for p in points],
                             yerr=np.array([_spread(p[1], p[2]) for p in points]).T,
                             fmt=marker, color=colour, ms=5, capsize=2, label=label)
        for path in PATH_MARKERS:
            group = [r for r in rows if r["path"] == path]
            if not group:
                continue
            if path not in paths_seen:
                paths_seen.append(path)
            x = [r["size"] for r in group]
            lat.errorbar(x, [r["cxlmpi_avg_us"] for r in group],
                         yerr=np.array([_spread(r["cxlmpi_avg_us"],
                                                r.get("rounds_cxlmpi_avg_us") or [])
                                        for r in group]).T,
                         fmt=PATH_MARKERS[path], color=SHIM_COLOUR, ms=6, capsize=2,
                         mfc="none" if path == "mpi" else SHIM_COLOUR,
                         label=PATH_LABELS[path])
            gain.errorbar(x, [r["speedup"] for r in group],
                          yerr=np.array([_spread(r["speedup"], _round_speedups(r))
                                         for r in group]).T,
                          fmt=PATH_MARKERS[path], color=SHIM_COLOUR, ms=6, capsize=2,
                          label=PATH_LABELS[path])
        lat.set_yscale("log")
        lat.grid(True, which="major", alpha=0.3)
        lat.tick_params(labelbottom=False)
        if i % ncols == 0:
            lat.set_ylabel("µs per call")
            gain.set_ylabel("speedup")
        gain.axhline(1.0, color="black", lw=0.8)
        gain.set_yscale("log", base=2)  # 2x faster and 2x slower as far from 1
        gain.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:.3g}x"))
        gain.yaxis.set_minor_formatter(FuncFormatter(lambda v, _: ""))
        gain.set_xscale("log", base=2)
        gain.xaxis.set_major_locator(FixedLocator(sizes))
        gain.xaxis.set_minor_locator(NullLocator())
        gain.set_xticks(sizes, [format_size(s) for s in sizes], fontsize="x-small",
                        rotation=90 if len(sizes) > 4 else 0)
        gain.set_xlim(sizes[0] / 1.5, sizes[-1] * 1.5)
        gain.grid(True, axis="y", alpha=0.3)
        if i // ncols == nrows - 1 or i + ncols >= len(ops):
            gain.set_xlabel("message size")
    handles = [Line2D([], [], ls="", marker="s", color=STOCK_COLOUR, label="stock MPI")]
    handles += [Line2D([], [], ls="", marker=PATH_MARKERS[p], color=SHIM_COLOUR,
                       mfc="none" if p == "mpi" else SHIM_COLOUR, label=PATH_LABELS[p])
                for p in paths_seen]
    handles.append(Line2D([], [], ls="", marker="_", color=MEMCPY_COLOUR,
                          label="memcpy (reference)"))
    fig.legend(handles=handles, loc="outside lower center", ncols=len(handles),
               fontsize="small", frameon=False)
    title = "speedup = stock / cxlmpi; error bars: fastest to slowest round"
    if metadata:
        library = metadata["mpi_library"].split(",")[0].replace(" Version:", "")
        title = (f"cxlmpi {metadata['cxlmpi_version']} vs stock {library}, "
                 f"{plural(metadata['ranks'], 'rank')}, "
                 f"{metadata['bench']['buffers']} buffers; {title}")
    fig.suptitle(title, fontsize="medium")
    return fig


def write_plot(path: str, records: Sequence[dict[str, Any]], metadata: dict[str, Any]) -> None:
    """Save `plot_figure(records, metadata)` to `path` (PNG, SVG, PDF: by
    the suffix)."""
    plot_figure(records, metadata).savefig(path, dpi=120)


def plural(count: int, noun: str) -> str:
    """'1 rank', '2 ranks'."""
    return f"{count} {noun}{'' if count == 1 else 's'}"


def metadata(comm: MPI.Intracomm, settings: Settings, argv: Sequence[str]) -> dict[str, Any]:
    """Where and how the figures were taken."""
    import mpi4py

    cfg = config.get()
    return {
        "tool": "cxlmpi.bench",
        "command": ["python", "-m", "cxlmpi.bench", *argv],
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "host": MPI.Get_processor_name(),
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


class Progress:
    """'[i/n] op size' lines on stderr (rank 0): one overwritten line on a
    terminal, one line each otherwise."""

    def __init__(self, total: int, enabled: bool) -> None:
        self.total, self.enabled, self.done = total, enabled, 0
        self.tty = enabled and sys.stderr.isatty()

    def step(self, text: str) -> None:
        self.done += 1
        if not self.enabled:
            return
        line = f"[{self.done}/{self.total}] {text}"
        sys.stderr.write(f"\r\033[K{line}" if self.tty else line + "\n")
        sys.stderr.flush()

    def close(self) -> None:
        if self.tty:
            sys.stderr.write("\r\033[K")
            sys.stderr.flush()


# ------------------------------------------------------------ command line


class RankZeroParser(argparse.ArgumentParser):
    """Prints usage and errors from rank 0 only (every rank parses alike)."""

    def _print_message(self, message: str, file: Any = None) -> None:
        if MPI.COMM_WORLD.Get_rank() == 0:
            super()._print_message(message, file)


SIZE_HELP = """\
A size is the bytes of one rank's message, as in the OSU micro-benchmarks:
  Allreduce, Reduce,     each rank's send buffer, float64 (rounded down to a
  Scan, Exscan           multiple of 8 B)
  Reduce_scatter_block   each rank's whole send buffer, float64 (rounded down to a
                         multiple of 8 B x ranks); each rank receives size / ranks
  Bcast                  the broadcast buffer, bytes
  Allgather, Gather      each rank's block, bytes; size x ranks are received
                         (by every rank, by the root)
  Scatter                each rank's block, bytes; the root sends size x ranks
  Alltoall               the block for each peer, bytes; each rank sends and
                         receives size x ranks
  Barrier                no data: measured once, whatever the sizes
Sizes accept K, M, G suffixes (powers of two).

Columns: time per call (µs), the average over ranks of each rank's mean and
min/max over ranks, median of the rounds; speedup = stock / cxlmpi; memcpy =
one np.copyto of size bytes on every rank at once; path = how cxlmpi ran the
calls (pool, or mpi: passed through).  Exit status: 0, 1 if a --validate check
(or writing an output file) failed, 2 for a bad request.

  mpiexec -bind-to core -n 2 python -m cxlmpi.bench --ops all --validate
"""


def build_parser() -> argparse.ArgumentParser:
    ap = RankZeroParser(
        prog="python -m cxlmpi.bench",
        description=__doc__.split("\n\n")[0] if __doc__ else None,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=SIZE_HELP)
    ap.add_argument("--ops", default=",".join(DEFAULT_OPS),
                    help="comma-separated collectives, or 'all' (default: %(default)s); "
                         f"known: {', '.join(BENCHMARKS)}")
    ap.add_argument("--sizes", help="explicit comma-separated sizes, e.g. 8,64K,1M "
                                    "(overrides --min-size/--max-size)")
    ap.add_argument("--min-size", default=DEFAULT_MIN_SIZE,
                    help="smallest size (default: %(default)s B)")
    ap.add_argument("--max-size", default=DEFAULT_MAX_SIZE,
                    help="largest size; sizes double from --min-size (default: %(default)s)")
    ap.add_argument("--rounds", type=int, default=DEFAULT_ROUNDS,
                    help="stock/cxlmpi alternations; the median is reported "
                         "(default: %(default)s)")
    ap.add_argument("--iterations", type=int,
                    help="timed calls per batch (default: OSU's 1000 up to 8 KiB, 100 above, "
                         "fewer for large messages)")
    ap.add_argument("--warmup", type=int,
                    help="warm-up calls before each batch (default: OSU's 200 up to 8 KiB, "
                         "10 above, fewer for large messages)")
    ap.add_argument("--buffers", choices=BUFFER_KINDS, default="private",
                    help="private: numpy arrays of each process; pool: arrays resident "
                         "in the pool (needs cxlmpi.empty) (default: %(default)s)")
    ap.add_argument("--data-varying", action="store_true",
                    help="write the iteration number into the send buffer before every call")
    ap.add_argument("--validate", action="store_true",
                    help="after each size, compare one call's results on both communicators "
                         "(exit status 1 on any difference)")
    ap.add_argument("--csv", metavar="FILE", help="write the records as CSV")
    ap.add_argument("--json", metavar="FILE",
                    help="write {metadata, records} as JSON")
    ap.add_argument("--plot", metavar="FILE.png",
                    help="plot latency and speedup at the measured sizes, one panel per "
                         "collective, pool/MPI points marked, error bars over the rounds "
                         "(needs matplotlib: pip install 'cxlmpi[bench]')")
    ap.add_argument("--learning", type=int, metavar="N",
                    help="instead: the cost of adaptive selection's learning -- per size, "
                         "a fresh communicator's first N calls (which learn) against the "
                         "first N of fresh ones pinned to MPI and to the path it chose")
    ap.add_argument("--quiet", action="store_true", help="no progress lines on stderr")
    return ap


def size_list(sizes: str | None, min_size: str, max_size: str) -> list[int]:
    """The requested sizes: the explicit list, else doubling from min to max."""
    if sizes:
        out = [config.parse_size(s) for s in sizes.split(",") if s.strip()]
        if not out:
            raise ValueError("--sizes: no size given")
    else:
        low, high = config.parse_size(min_size), config.parse_size(max_size)
        if low < 1 or high < low:
            raise ValueError(f"need 1 <= --min-size <= --max-size, got {low} and {high}")
        out = []
        while low <= high:
            out.append(low)
            low *= 2
    if any(s < 1 for s in out):
        raise ValueError("sizes must be at least 1 byte")
    return out


def _op_list(text: str) -> list[Collective]:
    if text.strip().lower() == "all":  # Bcast_view needs --buffers pool: by name only
        return [op for op in BENCHMARKS.values() if op.name != "Bcast_view"]
    by_lower = {name.lower(): op for name, op in BENCHMARKS.items()}
    ops = []
    for name in (n.strip() for n in text.split(",") if n.strip()):
        if name.lower() not in by_lower:
            raise ValueError(f"unknown collective {name!r} (known: {', '.join(BENCHMARKS)})")
        ops.append(by_lower[name.lower()])
    if not ops:
        raise ValueError("--ops: no collective given")
    return list(dict.fromkeys(ops))


def _cases(ops: Sequence[Collective], sizes: Sequence[int], nranks: int
           ) -> list[tuple[Collective, int]]:
    """(collective, requested size) to measure: Barrier once, and each
    collective's sizes after rounding without repeats."""
    cases = []
    for op in ops:
        seen: set[int] = set()
        for size in sizes[:1] if op.name == "Barrier" else sizes:
            actual = op.message_size(size, nranks)
            if actual not in seen:
                seen.add(actual)
                cases.append((op, size))
    return cases


def _say(rank: int, text: str) -> None:
    if rank == 0:
        print(f"cxlmpi.bench: {text}", file=sys.stderr, flush=True)


def check_counts(args: argparse.Namespace) -> None:
    """ValueError unless --rounds, --iterations and --warmup make sense."""
    if args.rounds < 1:
        raise ValueError("--rounds must be at least 1")
    if args.iterations is not None and args.iterations < 1:
        raise ValueError("--iterations must be at least 1")
    if args.warmup is not None and args.warmup < 0:
        raise ValueError("--warmup must be at least 0")


def _first_calls(op: Collective, requested: int, kind: str, calls: int, stamp: bool,
                 pin: int | None) -> tuple[float, int, str | None]:
    """A fresh communicator (its pool set up first), its first `calls`
    calls of `op` timed in one batch: (seconds, the slowest rank's, on rank
    0; learning calls; what it takes now: settled, or the fastest seen
    while exploring).  `pin`: a path code (cxlmpi.select) the class is
    pinned to, None: adaptive selection learns it."""
    world = MPI.COMM_WORLD
    wrapped = cxlmpi.wrap(MPI.Intracomm(world).Dup())
    stock = MPI.Intracomm(wrapped)
    nranks = wrapped.Get_size()
    size = op.message_size(requested, nranks)
    nsend, nrecv = op.counts(size // op.itemsize, nranks)
    total = max(nsend, nrecv) * op.itemsize
    from cxlmpi.state import fresh_state

    # The pool's set-up is not the class's learning; and neither a freed
    # communicator's learning nor its pin may carry over (state._spares).
    fresh_state(wrapped)
    bufs = make_buffers(op, size // op.itemsize, kind, wrapped)
    if pin is not None:
        routes = _shim_states().get(wrapped.handle).routes
        which = config.COLLECTIVES.index(op.stat_key)
        sc = select.size_class(total)
        for pl in (0, 1):
            routes.set(which, sc, pl, pin, 1 << 62)
    fn, fargs = op.bind(wrapped, bufs)
    mark = bufs.send if stamp and bufs.send is not None else None
    before = cxlmpi.stats().get(op.stat_key, {}).get("learning_calls", 0)
    seconds = _time_batch(fn, fargs, calls, 0, stock, mark, 0)
    learned = cxlmpi.stats().get(op.stat_key, {}).get("learning_calls", 0) - before
    choice = select.decision(wrapped, op.stat_key, total, settled=False)
    times = stock.gather(seconds, root=0)
    del bufs, fn, fargs
    wrapped.Free()
    return (max(times) * calls if times else 0.0), int(learned), choice


def _shim_states() -> dict[int, Any]:
    from cxlmpi._shim import states

    return states


def learning_cost(op: Collective, requested: int, kind: str, calls: int,
                  stamp: bool, rounds: int = 1) -> dict[str, Any] | None:
    """The first `calls` calls of a fresh communicator that learns the
    class against the first `calls` of fresh ones pinned to MPI and to the
    pool variant it chose (each pays its own cold start), `rounds` times,
    the learning one first and last in turn (whichever comes first meets
    the process's first calls of the size): on rank 0, the medians, the
    ratio to the faster pinned one (the best path alone), what settled
    (in the first round), each round's learning calls."""
    firsts: list[float] = []
    alone: dict[str, list[float]] = {"mpi": []}
    learned: list[int] = []
    choice = None
    for i in range(rounds):
        if i % 2:
            alone["mpi"].append(_first_calls(op, requested, kind, calls, stamp,
                                             select.MPI_PATH)[0])
        first, n, seen = _first_calls(op, requested, kind, calls, stamp, None)
        firsts.append(first)
        learned.append(n)
        if i == 0:
            choice = seen
            if choice is not None and choice != "mpi":
                alone[choice] = []
        if not i % 2:
            alone["mpi"].append(_first_calls(op, requested, kind, calls, stamp,
                                             select.MPI_PATH)[0])
        if choice is not None and choice != "mpi":
            alone[choice].append(_first_calls(op, requested, kind, calls, stamp,
                                              select.code_of(choice))[0])
    if MPI.COMM_WORLD.Get_rank() != 0:
        return None
    medians = {k: statistics.median(v) for k, v in alone.items()}
    first = statistics.median(firsts)
    best = min(medians.values())
    return {"op": op.name, "size": op.message_size(requested, MPI.COMM_WORLD.Get_size()),
            "buffers": kind, "calls": calls, "first_s": first, "alone_s": medians,
            "best_alone_s": best, "ratio": first / best if best else math.nan,
            "learning_calls": learned, "choice": choice, "rounds": rounds}


def run_learning(args: argparse.Namespace, ops: Sequence[Collective],
                 sizes: Sequence[int]) -> int:
    """--learning N: learning_cost of every op and size, as a table."""
    world = MPI.COMM_WORLD
    cases = _cases(ops, sizes, world.Get_size())
    progress = Progress(len(cases), enabled=world.Get_rank() == 0 and not args.quiet)
    rows = [["op", "size", f"learning: {args.learning} calls (ms)", "MPI alone (ms)",
             "chosen alone (ms)", "ratio", "learning calls", "chosen"]]
    for op, size in cases:
        progress.step(f"{op.name} {format_size(op.message_size(size, world.Get_size()))}")
        r = learning_cost(op, size, args.buffers, args.learning, args.data_varying,
                          args.rounds)
        if r is not None:
            chosen = r["alone_s"].get(r["choice"] or "mpi", r["alone_s"]["mpi"])
            rows.append([r["op"], format_size(r["size"]), f"{r['first_s'] * 1e3:.3f}",
                         f"{r['alone_s']['mpi'] * 1e3:.3f}", f"{chosen * 1e3:.3f}",
                         f"{r['ratio']:.3f}", "/".join(map(str, r["learning_calls"])),
                         r["choice"] or "-"])
    progress.close()
    if world.Get_rank() == 0:
        widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
        lines = ["  ".join(c.ljust(w) if i < 2 else c.rjust(w)
                           for i, (c, w) in enumerate(zip(row, widths))) for row in rows]
        lines.insert(1, "  ".join("-" * w for w in widths))
        print("\n".join(lines))
        print(f"# each on a fresh communicator, first {args.learning} calls, medians of "
              f"{args.rounds} rounds (learning calls: each round's); "
              f"ratio = learning / the faster path alone "
              f"(CXLMPI_TUNING={config.get().tuning}, {args.buffers} buffers)", flush=True)
    return 0


def run(args: argparse.Namespace, argv: Sequence[str]) -> int:
    """Measure what `args` asks; the exit status (0, or 1 on a failed check)."""
    world = MPI.COMM_WORLD
    rank = world.Get_rank()
    try:
        ops = _op_list(args.ops)
        sizes = size_list(args.sizes, args.min_size, args.max_size)
        check_counts(args)
        if args.learning and not config.get().adaptive:
            raise ValueError(f"--learning measures adaptive selection, which "
                             f"CXLMPI_TUNING={config.get().tuning} pins: unset it")
        if args.buffers != "pool" and any(op.name == "Bcast_view" for op in ops):
            raise ValueError("Bcast_view broadcasts a pool array by reference: "
                             "use --buffers pool")
    except ValueError as exc:
        raise BenchError(str(exc)) from None
    if args.plot and importlib.util.find_spec("matplotlib") is None:
        raise BenchError("--plot needs matplotlib, an optional dependency that is not "
                         "installed (pip install matplotlib, or the [bench] extra)")

    if args.learning:
        # Learning from nothing: no cache read when a pool is set up, none
        # written when one is freed (a round would start from what the
        # round before it settled).
        os.environ["CXLMPI_CACHE"] = "off"
        config.reload()
        return int(world.bcast(run_learning(args, ops, sizes), root=0))
    settings = Settings(rounds=args.rounds, iterations=args.iterations, warmup=args.warmup,
                        buffers=args.buffers, data_varying=args.data_varying,
                        validate=args.validate)
    wrapped = cxlmpi.wrap(MPI.Intracomm(world).Dup())
    stock = MPI.Intracomm(wrapped)  # plain mpi4py on the same MPI handle
    stock.Set_name("cxlmpi.bench")
    cases = _cases(ops, sizes, stock.Get_size())
    progress = Progress(len(cases), enabled=rank == 0 and not args.quiet)
    records = []
    for op, size in cases:
        shown = "" if op.name == "Barrier" else format_size(
            op.message_size(size, stock.Get_size()))
        progress.step(f"{op.name} {shown}".rstrip())
        record = measure(op, size, stock, wrapped, settings)
        if record is not None:
            records.append(record)
            for problem in record["validation_errors"]:
                _say(rank, f"VALIDATION FAILED: {op.name} {shown}: {problem}")
    progress.close()
    meta = metadata(stock, settings, argv)
    wrapped.Free()

    status = 0
    if rank == 0:
        print(format_table(records, args.validate))
        print(f"# {plural(meta['ranks'], 'rank')}, {meta['mpi_library']}; cxlmpi "
              f"{meta['cxlmpi_version']}, {settings.buffers} buffers"
              f"{', data varying' if settings.data_varying else ''}; "
              f"median of {settings.rounds} round(s)", flush=True)
        failed = [r for r in records if r["valid"] is False]
        if failed:
            status = 1
            _say(rank, f"VALIDATION FAILED for {len(failed)} of {len(records)} "
                       "measurements: cxlmpi's results differ from stock MPI's")
        status = max(status, _write_outputs(args, records, meta))
    return int(world.bcast(status, root=0))


def _write_outputs(args: argparse.Namespace, records: list[dict[str, Any]],
                   meta: dict[str, Any]) -> int:
    """Write the requested files (rank 0); 1 if one could not be written."""
    status = 0
    writers: list[tuple[str | None, Callable[[str], None]]] = [
        (args.csv, lambda path: write_csv(path, records)),
        (args.json, lambda path: write_json(path, records, meta)),
        (args.plot, lambda path: write_plot(path, records, meta)),
    ]
    for path, write in writers:
        if not path:
            continue
        try:
            write(path)
        except (OSError, ValueError, ImportError) as exc:
            _say(0, f"could not write {path}: {exc}")
            status = 1
    return status


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``python -m cxlmpi.bench``; returns the exit status:
    0, 1 (a --validate check or an output file failed), 2 (bad request)."""
    argv = sys.argv[1:] if argv is None else list(argv)
    return run_tool("cxlmpi.bench", run, build_parser().parse_args(argv), argv)


def run_tool(prog: str, run: Callable[[argparse.Namespace, Sequence[str]], int],
             args: argparse.Namespace, argv: Sequence[str]) -> int:
    """Run a measuring tool (bench, tune) on every rank: a BenchError (a bad
    request, found alike everywhere before any collective) is reported by
    rank 0 with exit status 2; any other failure may strike one rank only,
    so it ends the whole job rather than leave the others waiting."""
    try:
        return run(args, argv)
    except BenchError as exc:
        if MPI.COMM_WORLD.Get_rank() == 0:
            print(f"{prog}: {exc}", file=sys.stderr, flush=True)
        return 2
    except Exception:
        traceback.print_exc()
        sys.stderr.flush()
        MPI.COMM_WORLD.Abort(1)
        return 1


if __name__ == "__main__":
    sys.exit(main())
