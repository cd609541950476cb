"""Measure where the pool beats stock MPI on this machine: fill adaptive
selection's cache, or write a CXLMPI_TUNING file that pins the paths.

    mpiexec -bind-to core -n 2 python -m cxlmpi.tune [--ops ... | all] [--min-size 4K]
        [--max-size 64M] [--quiet]
    mpiexec -bind-to core -n 2 python -m cxlmpi.tune --output FILE [--report FILE.json]
        [--ops Bcast,Allgather,Gather,Scatter,Alltoall | all]
        [--min-size 4K] [--max-size 64M] [--rounds 5] [--iterations N] [--warmup N]
        [--margin 0.03] [--quiet]

Without --output: the cache.  Adaptive selection (CXLMPI_TUNING=adaptive,
the default) learns each collective x size x buffer placement online, on
its first calls; this runs every collective of --ops (default: all) at
every size, with private and with pool-resident buffers, until each class
has settled -- trying each candidate path FILL_ROUNDS (tools.fill) times instead of the
online 3 -- and writes what it learned to CXLMPI_CACHE, where every later
job on this machine (same CPU, cores, ranks, MPI library, cxlmpi version)
starts from it.

With --output: the windows file.
The pool path is forced for every size (``CXLMPI_TUNING=pool``, set before
cxlmpi's configuration is read), and each collective is measured stock vs
cxlmpi with ``cxlmpi.bench.measure`` at sizes doubling from --min-size to
--max-size (private buffers, the median of --rounds alternations).  For each
collective the window [lo, hi) is the longest contiguous run of sizes where
cxlmpi wins by the margin (see `choose_window`): lo the first size of the
run (null when the run starts at the smallest size measured: from
CXLMPI_THRESHOLD), hi the first size after it (null when the run reaches the
largest size measured: no upper bound); no winning size: null (MPI always).
Sizes below CXLMPI_THRESHOLD pass through to MPI whatever the window: they
are shown but not weighed.

Units.  The sizes of --min-size/--max-size are bench sizes: one rank's
message (for Allgather and Gather each rank's block, for Scatter and Alltoall
the block of each peer).  The windows of a CXLMPI_TUNING file are bytes of
all blocks together, as the dispatcher compares them (``config.windows()``):
for those four collectives, block x ranks.  The file's windows are therefore
taken from each measurement's ``total_bytes`` (block x ranks for the block
collectives, the message itself for Bcast and the reductions), and a file
tuned at N ranks describes block collectives at N ranks.

The file.  Its keys are collective names of ``config.COLLECTIVES`` only (the
config reader refuses anything else; the measurements go to --report):

- each measured collective, and its vector variant with the same window
  (allgatherv = allgather, gatherv = gather, scatterv = scatter, alltoallv =
  alltoall, reduce_scatter = reduce_scatter_block: the same algorithm and the
  same byte count in the dispatcher);
- every other collective with a builtin window (``config.BUILTIN_WINDOWS``):
  that window, written out.  A key missing from the file means "every size
  >= CXLMPI_THRESHOLD", which for gather or scatter would be worse than the
  builtin "never", so the file never leaves out a collective whose default
  is a window;
- collectives without a builtin window (the reductions, barrier, unless
  measured) are left out: missing means every size >= CXLMPI_THRESHOLD, which
  is their builtin behaviour.

The file written is checked with ``config.Config({"CXLMPI_TUNING": path}).windows()``.
Exit status: 0; 1 when the file (or the report) could not be written or was
refused; 2 for a bad request.
"""

from __future__ import annotations

import argparse
import datetime
import inspect
import json
import math
import os
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any, Optional

from mpi4py import MPI

import cxlmpi
from cxlmpi import config
from cxlmpi.errors import CXLMPIConfigError
from cxlmpi.select import cache
from cxlmpi.tools import bench
from cxlmpi.tools.fill import fill_cache
from cxlmpi.tools.measure import command_line
from cxlmpi.tools.report import align_rows

__all__ = [
    "TUNABLE",
    "REDUCTIONS",
    "DERIVED",
    "DEFAULT_MARGIN",
    "choose_window",
    "build_table",
    "tune_iterations",
    "main",
]

# Collectives with a builtin window (pure data movement), measured by default,
# and the reductions measured with --ops all (the pool wins at every size by
# default; a file can narrow that).
TUNABLE = ("Bcast", "Allgather", "Gather", "Scatter", "Alltoall")
REDUCTIONS = ("Allreduce", "Reduce", "Reduce_scatter_block", "Scan", "Exscan")

# Collectives that take the window of another: same algorithm, and the
# dispatcher compares the same byte count (all blocks together; for the
# rooted and all-to-all vectors, the largest block x ranks).
DERIVED = {
    "allgatherv": "allgather",
    "gatherv": "gather",
    "scatterv": "scatter",
    "alltoallv": "alltoall",
    "reduce_scatter": "reduce_scatter_block",
}

DEFAULT_MARGIN = 0.03
DEFAULT_MIN_SIZE, DEFAULT_MAX_SIZE = "4K", "64M"
DEFAULT_ROUNDS = 5
DEFAULT_OUTPUT = "cxlmpi-tuning.json"

# Calls per timed batch, fewer than OSU's so that a full run (5 collectives x
# 15 sizes x rounds) stays a few minutes: SMALL up to SMALL_LIMIT bytes, then
# about BYTE_BUDGET bytes per batch, never fewer than bench.MIN_ITERATIONS.
SMALL_LIMIT = 64 << 10
SMALL_ITERATIONS, SMALL_WARMUP = 500, 50
LARGE_ITERATIONS = 100
BYTE_BUDGET = 512 << 20

# [lo, hi]: bytes, None = unbounded (a CXLMPI_TUNING file's value for a collective).
Window = list[Optional[int]]


# ------------------------------------------------------------ the decision


def choose_window(sizes: Sequence[int], speedups: Sequence[float | None],
                  margin: float = DEFAULT_MARGIN) -> Window | None:
    """The window [lo, hi] (bytes; None = unbounded) where the pool should run,
    from speedups (stock time / cxlmpi time) measured at ascending `sizes`.

    Rule:

    - a size *wins* when its speedup >= 1 + margin;
    - a size *ties* when 1 / (1 + margin) <= speedup < 1 + margin (within the
      margin either way: noise); a single tie between two wins is bridged,
      counted in the run (one noisy point should not split a window, and the
      window is one interval: splitting it would drop one side); two ties in
      a row, or any loss (speedup < 1 / (1 + margin)), end a run;
    - None (the size did not run through the pool) or NaN is a loss;
    - the window is the longest run (most sizes); equal lengths: the larger
      product of speedups, then the smaller sizes;
    - lo = the run's first size, None when that is sizes[0] (from
      CXLMPI_THRESHOLD); hi = the first size after the run, None when the run
      reaches sizes[-1] (no upper bound);
    - no winning size: None (the collective stays with MPI).
    """
    if len(sizes) != len(speedups):
        raise ValueError("sizes and speedups differ in length")
    if any(b <= a for a, b in zip(sizes, sizes[1:])):
        raise ValueError("sizes must be strictly ascending")
    if margin < 0:
        raise ValueError("the margin must be at least 0")
    n = len(sizes)
    values = [s if s is not None and math.isfinite(s) else None for s in speedups]
    wins = [s is not None and s >= 1 + margin for s in values]
    ties = [s is not None and 1 / (1 + margin) <= s < 1 + margin for s in values]
    member = [wins[i] or (ties[i] and 0 < i < n - 1 and wins[i - 1] and wins[i + 1])
              for i in range(n)]

    best: tuple[int, float, int] | None = None  # (length, sum of logs, -start)
    best_run = (0, 0)
    i = 0
    while i < n:
        if not member[i]:
            i += 1
            continue
        start = i
        while i < n and member[i]:
            i += 1
        gain = sum(math.log(s) for s in values[start:i] if s is not None)
        key = (i - start, gain, -start)
        if best is None or key > best:
            best, best_run = key, (start, i)
    if best is None:
        return None
    start, end = best_run
    return [None if start == 0 else sizes[start], None if end == n else sizes[end]]


def build_table(measured: dict[str, Window | None]) -> dict[str, Window | None]:
    """The tuning file's contents from the measured windows (config keys,
    e.g. "allgather"): the measured ones, their vector variants (DERIVED),
    the builtin window of every other collective that has one; in
    config.COLLECTIVES order."""
    for name in measured:
        if name not in config.COLLECTIVES:
            raise ValueError(f"unknown collective {name!r}")
    table: dict[str, Window | None] = {}
    for name in config.COLLECTIVES:
        base = DERIVED.get(name, name)
        if name in measured:
            window = measured[name]
        elif base in measured:
            window = measured[base]
        elif name in config.BUILTIN_WINDOWS:
            window = config.BUILTIN_WINDOWS[name]
        else:
            continue
        table[name] = None if window is None else list(window)
    return table


def source_of(name: str, measured: dict[str, Any]) -> str:
    """Where the file's entry for `name` came from: measured, derived or builtin."""
    if name in measured:
        return "measured"
    if DERIVED.get(name) in measured:
        return f"= {DERIVED[name]}"
    return "builtin"


# ------------------------------------------------------------ measuring


def tune_iterations(total: int) -> tuple[int, int]:
    """(timed iterations, warm-up iterations) per batch for a message moving
    `total` bytes per rank (bench's total_bytes)."""
    if total <= SMALL_LIMIT:
        return SMALL_ITERATIONS, SMALL_WARMUP
    iterations = max(bench.MIN_ITERATIONS, min(LARGE_ITERATIONS, BYTE_BUDGET // total))
    return iterations, max(bench.MIN_WARMUP, min(10, iterations // 5))


def _total_bytes(op: bench.Collective, requested: int, nranks: int) -> int:
    """bench.measure's total_bytes of `op` at `requested` bytes."""
    size = op.message_size(requested, nranks)
    nsend, nrecv = op.counts(size // op.itemsize, nranks)
    return max(nsend, nrecv) * op.itemsize


@dataclass
class Result:
    """One collective's measurements (rank 0) and the window chosen."""

    op: str
    records: list[dict[str, Any]]
    window: Window | None

    @property
    def key(self) -> str:
        return self.op.lower()


def _speedup(record: dict[str, Any]) -> float | None:
    """The record's speedup, None when cxlmpi did not run it through the pool."""
    return record["speedup"] if record["path"] == "pool" else None


def in_window(nbytes: int, window: Window | None) -> bool:
    """Whether a message of `nbytes` (all blocks together) falls in `window`."""
    if window is None:
        return False
    lo, hi = window
    return (lo is None or nbytes >= lo) and (hi is None or nbytes < hi)


# ------------------------------------------------------------ output


def format_window(window: Window | None) -> str:
    """'[8 KiB, 1 MiB)', '[threshold, 512 KiB)', '[16 MiB, -)' (no upper
    bound), 'never (MPI)'."""
    if window is None:
        return "never (MPI)"
    lo, hi = window
    return (f"[{'threshold' if lo is None else bench.format_size(lo)}, "
            f"{'-' if hi is None else bench.format_size(hi)})")


def format_speedups(results: Sequence[Result]) -> str:
    """Sizes (one rank's message) down, collectives across: the speedup at
    each, '*' inside the chosen window, 'mpi' where cxlmpi passed through."""
    sizes = sorted({r["size"] for res in results for r in res.records})
    rows = [["size"] + [res.op for res in results]]
    for size in sizes:
        row = [bench.format_size(size)]
        for res in results:
            rec = next((r for r in res.records if r["size"] == size), None)
            if rec is None:
                row.append("")
            elif rec["path"] != "pool":
                row.append(f"{rec['speedup']:.2f}x mpi")
            else:
                mark = "*" if in_window(rec["total_bytes"], res.window) else " "
                row.append(f"{rec['speedup']:.2f}x{mark}")
        rows.append(row)
    return align_rows(rows)


def format_windows(table: dict[str, Window | None], measured: dict[str, Any]) -> str:
    """One line per collective: the window of the file, where it comes from,
    and the builtin window for comparison."""
    rows = [["collective", "window (bytes, all blocks)", "from", "builtin"]]
    for name in config.COLLECTIVES:
        builtin = config.BUILTIN_WINDOWS.get(name, [None, None])
        if name in table:
            rows.append([name, format_window(table[name]), source_of(name, measured),
                         format_window(builtin)])
        else:
            rows.append([name, format_window([None, None]), "default (not in file)",
                         format_window(builtin)])
    return align_rows(rows, left=4)


def write_tuning(path: str, table: dict[str, Window | None]) -> None:
    """Write the tuning file atomically, then check that cxlmpi accepts it
    (raises CXLMPIConfigError when it does not; the file is left in place)."""
    directory = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix=".cxlmpi-tuning-", suffix=".json", dir=directory)
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(table, f, indent=1)
            f.write("\n")
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)  # as open() would create it
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    config.Config({"CXLMPI_TUNING": path}).windows()


# ------------------------------------------------------------ command line


class TuneError(bench.BenchError):
    """A problem with the request, found alike on every rank (exit status 2)."""


EPILOG = f"""\
Sizes are bench sizes (one rank's message: for Allgather and Gather its block,
for Scatter and Alltoall the block for each peer; see python -m cxlmpi.bench
--help), doubling from --min-size to --max-size; K, M, G suffixes.  The windows
written are bytes of all blocks together (block x ranks for those four), as
CXLMPI_TUNING files take them: tune with the number of ranks you run.

A size wins when speedup (stock / cxlmpi) >= 1 + margin; a single size within
the margin either way between two wins does not split a run.  The window is
the longest run; no win: null (MPI).  Vector variants take their base
collective's window; collectives not measured keep their builtin window.

  mpiexec -bind-to core -n 2 python -m cxlmpi.tune
  export CXLMPI_TUNING=$PWD/{DEFAULT_OUTPUT}
"""


def build_parser() -> argparse.ArgumentParser:
    ap = bench.RankZeroParser(prog="python -m cxlmpi.tune",
                 description=__doc__.split("\n\n")[0] if __doc__ else None,
                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=EPILOG)
    ap.add_argument("--output", metavar="FILE",
                    help="write a CXLMPI_TUNING file that pins the paths (e.g. "
                         f"{DEFAULT_OUTPUT}); without it, fill CXLMPI_CACHE for "
                         "adaptive selection")
    ap.add_argument("--report", metavar="FILE.json",
                    help="write the measurements and windows as JSON")
    ap.add_argument("--ops", default=None,
                    help="comma-separated collectives, or 'all' (adds the reductions "
                         f"{', '.join(REDUCTIONS)}) (default: {','.join(TUNABLE)} with "
                         "--output, all for the cache)")
    ap.add_argument("--min-size", default=DEFAULT_MIN_SIZE,
                    help="smallest size; a window that starts here is written as "
                         "from CXLMPI_THRESHOLD (default: %(default)s)")
    ap.add_argument("--max-size", default=DEFAULT_MAX_SIZE,
                    help="largest size; a window that reaches it has no upper bound "
                         "(default: %(default)s)")
    ap.add_argument("--rounds", type=int, default=DEFAULT_ROUNDS,
                    help="stock/cxlmpi alternations, the median is used "
                         "(default: %(default)s)")
    ap.add_argument("--iterations", type=int,
                    help=f"timed calls per batch (default: {SMALL_ITERATIONS} up to "
                         f"{bench.format_size(SMALL_LIMIT)}, then fewer, down to "
                         f"{bench.MIN_ITERATIONS})")
    ap.add_argument("--warmup", type=int,
                    help="warm-up calls per batch (default: a tenth to a fifth of the iterations)")
    ap.add_argument("--margin", type=float, default=DEFAULT_MARGIN,
                    help="a size wins when speedup >= 1 + margin (default: %(default)s)")
    ap.add_argument("--quiet", action="store_true", help="no progress lines on stderr")
    return ap


def _op_list(text: str | None, cache: bool = False) -> list[bench.Collective]:
    if text is None:
        text = "all" if cache else ",".join(TUNABLE)
    known = TUNABLE + REDUCTIONS
    if text.strip().lower() == "all":
        return [bench.BENCHMARKS[name] for name in known]
    by_lower = {name.lower(): name for name in known}
    names = [n.strip() for n in text.split(",") if n.strip()]
    if not names:
        raise ValueError("--ops: no collective given")
    for name in names:
        if name.lower() not in by_lower:
            raise ValueError(f"--ops: {name!r} cannot be tuned (use {', '.join(known)}, "
                             "or all)")
    return [bench.BENCHMARKS[by_lower[n.lower()]] for n in dict.fromkeys(names)]


def _say(text: str) -> None:
    print(f"cxlmpi.tune: {text}", file=sys.stderr, flush=True)


def _check(args: argparse.Namespace) -> tuple[list[bench.Collective], list[int]]:
    try:
        ops = _op_list(args.ops, cache=args.output is None)
        sizes = bench.size_list(None, args.min_size, args.max_size)
        bench.check_counts(args)
    except ValueError as exc:
        raise TuneError(str(exc)) from None
    if not (0 <= args.margin < 1):
        raise TuneError("--margin must be at least 0 and below 1")
    if MPI.COMM_WORLD.Get_size() < 2:
        raise TuneError("run it under mpiexec with at least 2 ranks "
                        "(mpiexec -n 2 python -m cxlmpi.tune)")
    return ops, sizes


def measure_all(ops: Sequence[bench.Collective], sizes: Sequence[int],
                args: argparse.Namespace, stock: MPI.Intracomm,
                wrapped: MPI.Intracomm) -> list[Result]:
    """Measure every op at every size (all ranks); the results on rank 0
    (records and windows), an empty list elsewhere."""
    nranks = stock.Get_size()
    threshold = config.get().threshold
    base = bench.Settings(rounds=args.rounds, iterations=None, warmup=None,
                          buffers="private", data_varying=False, validate=False)
    cases = [(op, s) for op in ops for s in sizes]
    progress = bench.announce("cxlmpi.tune", bench.plan_estimates(
        stock, cases, base, tune_iterations), stock.Get_rank() == 0 and not args.quiet,
        f"{len(ops)} collectives x {len(sizes)} sizes x {args.rounds} rounds")
    results = []
    for op in ops:
        records: list[dict[str, Any]] = []
        seen: set[int] = set()
        for requested in sizes:
            actual = op.message_size(requested, nranks)
            progress.step(f"{op.name} {bench.format_size(actual)}")
            if actual in seen:
                continue
            seen.add(actual)
            iterations, warmup = tune_iterations(_total_bytes(op, requested, nranks))
            settings = replace(base, iterations=args.iterations or iterations,
                               warmup=warmup if args.warmup is None else args.warmup)
            record = bench.measure(op, requested, stock, wrapped, settings)
            if record is not None:
                records.append(record)
        if stock.Get_rank() == 0:
            # Sizes below CXLMPI_THRESHOLD never take the pool path: they
            # are shown, not weighed (the window starts at the threshold anyway).
            pooled = [r for r in records if r["total_bytes"] >= threshold]
            window = choose_window([r["total_bytes"] for r in pooled],
                                   [_speedup(r) for r in pooled], args.margin)
            if not any(r["path"] == "pool" for r in pooled):
                _say(f"{op.name} never ran through the pool (at these sizes, ranks and "
                     "settings): written as null, MPI at every size")
            results.append(Result(op.name, records, window))
    bench.finish("cxlmpi.tune", progress, args.quiet)
    return results


def _settings(tuning: str) -> config.Config:
    """cxlmpi's settings, re-read with CXLMPI_TUNING=`tuning`."""
    os.environ["CXLMPI_TUNING"] = tuning
    try:
        cfg = config.reload()
    except CXLMPIConfigError as exc:
        raise TuneError(str(exc)) from None
    if cfg.disable:
        raise TuneError("CXLMPI_DISABLE=1 passes every call to MPI: nothing to tune")
    return cfg


def run(args: argparse.Namespace, argv: Sequence[str]) -> int:
    """Tune what `args` asks; the exit status (0, or 1 when writing failed)."""
    world = MPI.COMM_WORLD
    rank = world.Get_rank()
    ops, sizes = _check(args)
    if args.output is None:
        path = cache.cache_path(_settings("adaptive"))
        if path is None:
            raise TuneError("CXLMPI_CACHE=off: there is no cache to fill")
        return int(world.bcast(fill_cache(ops, sizes, args, path), root=0))
    # Force the pool path at every size >= CXLMPI_THRESHOLD before cxlmpi's
    # settings are (re)read: the measurements must compare both paths.
    _settings("pool")

    wrapped = cxlmpi.wrap(MPI.Intracomm(world).Dup())
    stock = MPI.Intracomm(wrapped)  # plain mpi4py on the same MPI handle
    stock.Set_name("cxlmpi.tune")
    nranks = stock.Get_size()
    results = measure_all(ops, sizes, args, stock, wrapped)
    settings = bench.Settings(rounds=args.rounds, iterations=args.iterations,
                              warmup=args.warmup, buffers="private", data_varying=False,
                              validate=False)
    meta = bench.metadata(stock, settings, argv)
    wrapped.Free()

    status = 0
    if rank == 0:
        status = _finish(args, argv, results, meta, nranks)
    return int(world.bcast(status, root=0))


def _finish(args: argparse.Namespace, argv: Sequence[str], results: list[Result],
            meta: dict[str, Any], nranks: int) -> int:
    """Rank 0: print the tables, write the file (and report); the exit status."""
    measured = {res.key: res.window for res in results}
    table = build_table(measured)
    path = os.path.abspath(args.output)
    print(f"speedup = stock / cxlmpi per call, {nranks} ranks, median of {args.rounds} "
          f"round(s); size = one rank's message; * = in the chosen window "
          f"(wins by >= {args.margin:.0%})")
    print(format_speedups(results))
    print()
    print(format_windows(table, measured))
    print()
    status = 0
    try:
        write_tuning(path, table)
    except OSError as exc:
        _say(f"could not write {path}: {exc.strerror or exc}")
        status = 1
    except CXLMPIConfigError as exc:
        _say(f"wrote {path}, but cxlmpi refuses it: {exc}")
        status = 1
    else:
        print(f"# wrote {path} (tuned at {nranks} ranks); to use it:")
        print(f"export CXLMPI_TUNING={path}", flush=True)
    if args.report:
        meta = dict(meta, tool="cxlmpi.tune",
                    command=["python", "-m", "cxlmpi.tune", *argv],
                    command_line=command_line(argv, "cxlmpi.tune", nranks),
                    date=datetime.datetime.now(datetime.timezone.utc).isoformat(
                        timespec="seconds"))
        meta["tune"] = {"margin": args.margin, "min_size": args.min_size,
                        "max_size": args.max_size, "output": path,
                        "rule": inspect.cleandoc(choose_window.__doc__ or "")}
        report = {
            "metadata": meta,
            "windows": table,
            "sources": {name: source_of(name, measured) for name in table},
            "measured": {res.key: {"op": res.op, "window": res.window,
                                   "records": res.records} for res in results},
        }
        try:
            with open(args.report, "w") as f:
                json.dump(report, f, indent=1, default=str)
                f.write("\n")
        except (OSError, ValueError) as exc:
            _say(f"could not write {args.report}: {exc}")
            status = 1
    return status


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``python -m cxlmpi.tune``; returns the exit status:
    0, 1 (an output file could not be written or was refused), 2 (bad request)."""
    argv = sys.argv[1:] if argv is None else list(argv)
    return bench.run_tool("cxlmpi.tune", run, build_parser().parse_args(argv), argv)


if __name__ == "__main__":
    sys.exit(main())
