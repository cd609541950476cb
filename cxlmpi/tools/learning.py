"""``python -m cxlmpi.bench --learning N``: what adaptive selection's
learning costs a fresh communicator's first N calls, against fresh ones
pinned to MPI and to the path it chose."""

from __future__ import annotations

import argparse
import math
import statistics
from collections.abc import Sequence
from typing import Any

from mpi4py import MPI

import cxlmpi
from cxlmpi import config, select

from .measure import time_batch
from .operations import Collective, cases_to_measure, make_buffers
from .report import Progress, align_rows, format_size

__all__ = ["learning_cost", "run_learning"]


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
    from cxlmpi.pools.state import fresh_state

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
    seconds = time_batch(fn, fargs, calls, 0, stock, mark, 0)
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
    cases = cases_to_measure(ops, sizes, world.Get_size())
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
        print(align_rows(rows, left=2))
        print(f"# each on a fresh communicator, first {args.learning} calls, medians of "
              f"{args.rounds} rounds (learning calls: each round's); "
              f"ratio = learning / the faster path alone "
              f"(CXLMPI_TUNING={config.get().tuning}, {args.buffers} buffers)", flush=True)
    return 0

