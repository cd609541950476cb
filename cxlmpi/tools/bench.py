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
import importlib.util
import os
import sys
import traceback
from collections.abc import Sequence
from typing import Any, Callable

from mpi4py import MPI

import cxlmpi
from cxlmpi import config
from cxlmpi.select import cache
from cxlmpi.select.classes import PLACEMENTS, size_class

from .learning import run_learning
from .measure import (
    MIN_ITERATIONS,
    MIN_WARMUP,
    Settings,
    case_seconds,
    measure,
    metadata,
    osu_iterations,
    time_speed,
)
from .operations import (
    BENCHMARKS,
    BUFFER_KINDS,
    DEFAULT_OPS,
    BenchError,
    Buffers,
    Collective,
    allocate,
    cases_to_measure,
    describe_mismatch,
    make_buffers,
)
from .overlap import run_overlap
from .report import (
    PATH_MARKERS,
    Progress,
    format_duration,
    format_size,
    format_table,
    plot_figure,
    plural,
    write_csv,
    write_json,
    write_plot,
)

# The benchmark's face: what tune and the tests use, wherever it lives.
__all__ = [
    "BENCHMARKS", "DEFAULT_OPS", "BUFFER_KINDS", "Collective", "Buffers", "BenchError",
    "allocate", "make_buffers", "describe_mismatch", "Settings", "measure", "metadata",
    "osu_iterations", "MIN_ITERATIONS", "MIN_WARMUP", "format_size", "plot_figure",
    "write_plot", "PATH_MARKERS", "Progress", "RankZeroParser", "size_list",
    "check_counts", "run_tool", "main", "announce", "finish", "plan_estimates",
]

DEFAULT_MIN_SIZE, DEFAULT_MAX_SIZE = "8", "256M"
DEFAULT_ROUNDS = 3

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
                         "collective (Barrier too), one speedup scale for all with 1.0 "
                         "marked, pool/MPI points marked, thin whiskers from the fastest "
                         "to the slowest round (needs matplotlib: pip install "
                         "'cxlmpi[bench]')")
    ap.add_argument("--learning", type=int, metavar="N",
                    help="instead: the cost of adaptive selection's learning -- per size, "
                         "a fresh communicator's first N calls (which learn) against the "
                         "first N of fresh ones pinned to MPI and to the path it chose")
    ap.add_argument("--overlap", action="store_true",
                    help="instead: nonblocking collectives with compute between post and "
                         "wait (OSU's overlap), stock and cxlmpi alternating")
    ap.add_argument("--overlap-ops", default="Iallreduce,Ibcast", metavar="OPS",
                    help="the collectives of --overlap, or 'all' (known: "
                         "Iallreduce, Ibcast, Iallgather, Igather, Iscatter, Ialltoall, "
                         "Igatherv, Iscatterv, Ialltoallv)")
    ap.add_argument("--overlap-compute", choices=("cpu", "wait"), default="cpu",
                    help="the compute of --overlap: cpu (busy, OSU's), or wait (the thread "
                         "waits off its core, as for a GPU kernel or for I/O: where every "
                         "core runs a rank, only then is one free to progress the call)")
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

    if args.overlap:
        records = run_overlap(args, sizes)
        meta = metadata(world, Settings(rounds=args.rounds, iterations=args.iterations,
                                        warmup=args.warmup, buffers=args.buffers,
                                        data_varying=False, validate=args.validate), argv)
        meta["bench"]["method"] = "OSU overlap: post, compute, wait (cxlmpi.tools.overlap)"
        meta["mode"] = "overlap"
        meta["bench"]["compute"] = args.overlap_compute
        status = 0
        for record in records:
            for problem in record["validation_errors"]:
                _say(rank, f"VALIDATION FAILED: {record['op']} "
                           f"{format_size(record['size'])}: {problem}")
                status = 1
        if rank == 0 and args.json:
            write_json(args.json, records, meta)
        return int(world.bcast(status, root=0))
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
    cases = cases_to_measure(ops, sizes, stock.Get_size())
    progress = announce("cxlmpi.bench", plan_estimates(stock, cases, settings),
                        rank == 0 and not args.quiet,
                        f"{plural(len(ops), 'collective')} x {plural(len(sizes), 'size')} x "
                        f"{plural(settings.rounds, 'round')}, "
                        f"{plural(len(cases), 'measurement')}")
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
    finish("cxlmpi.bench", progress, args.quiet)
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


def plan_estimates(stock: MPI.Intracomm, cases: Sequence[tuple[Collective, int]],
                   settings: Settings,
                   iterations_of: Callable[[int], tuple[int, int]] = osu_iterations
                   ) -> list[float]:
    """Collective: about how many seconds each of `cases` will take to
    measure, from this machine's speed (`time_speed`), the calls planned,
    and (adaptive selection) whether the selection cache knows the class."""
    speed = time_speed(stock)
    known = stock.bcast(_cached_classes(stock.Get_size(), settings.buffers)
                        if stock.Get_rank() == 0 else None, root=0)

    def learns(name: str, total: int) -> bool:
        return known is not None and name in config.COLLECTIVES and \
            total >= config.get().threshold and \
            (config.COLLECTIVES.index(name), size_class(total)) not in known

    return [case_seconds(op, size, stock.Get_size(), settings, speed, iterations_of, learns)
            for op, size in cases]


def _cached_classes(nranks: int, buffers: str) -> set[tuple[int, int]] | None:
    """(collective index, size class) of the selection cache's decisions for
    this job and placement; None when nothing is learned (a pinned path)."""
    cfg = config.get()
    if not cfg.adaptive:
        return None
    fp = cache.fingerprint(nranks, MPI.Get_library_version(), cfg)
    placement = PLACEMENTS.index(buffers)
    return {(which, sc) for which, sc, pl in cache.load_cache(cache.cache_path(cfg), fp)
            if pl == placement}


def announce(prog: str, estimates: Sequence[float], enabled: bool, plan: str) -> Progress:
    """Say (where `enabled`: rank 0 without --quiet) about how long the
    plan will take, from the `estimates` of its steps (seconds), and return
    the Progress that shows each step with the time elapsed and left."""
    if enabled:
        print(f"{prog}: {plan}: about {format_duration(sum(estimates))} (estimated from "
              f"the calls planned and this machine's speed; --quiet: no progress lines)",
              file=sys.stderr, flush=True)
    return Progress(len(estimates), enabled, estimates)


def finish(prog: str, progress: Progress, quiet: bool) -> None:
    """End the progress lines, saying how long it took against the estimate."""
    elapsed = progress.close()
    if progress.enabled:
        print(f"{prog}: took {format_duration(elapsed)} (estimated "
              f"{format_duration(sum(progress.estimates))})", file=sys.stderr, flush=True)


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
