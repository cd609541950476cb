"""``python -m cxlmpi.tune`` without --output: fill adaptive selection's
cache (CXLMPI_CACHE) by running every collective at every size, with
private and with pool-resident buffers, until each class has settled."""

from __future__ import annotations

import argparse
import math
from collections.abc import Sequence

from mpi4py import MPI

import cxlmpi
from cxlmpi import select
from cxlmpi.select import learner

from .bench import announce, finish
from .measure import Speed, time_speed
from .operations import Collective, make_buffers
from .report import align_rows, format_size

__all__ = ["fill_cache", "fill_seconds", "FILL_ROUNDS", "FILL_CALLS"]

# Tries of each candidate path when filling the cache (online:
# cxlmpi.select.learner.ROUNDS), and the most calls a class may take to settle.
FILL_ROUNDS = 5
FILL_CALLS = 2000


def fill_seconds(op: Collective, requested: int, nranks: int, speed: Speed) -> float:
    """About how long a class takes to settle: measured on a 2-core VM,
    ~250 calls up to 128 KiB, then about 64 MiB's worth (4 MiB: 19 calls)."""
    size = op.message_size(requested, nranks)
    nsend, nrecv = op.counts(size // op.itemsize, nranks)
    total = max(nsend, nrecv) * op.itemsize
    calls = min(280, max(16, (64 << 20) // max(total, 1)))
    return calls * speed.call(total) + 0.01


def fill_cache(ops: Sequence[Collective], sizes: Sequence[int],
               args: argparse.Namespace, path: str) -> int:
    """Run every op at every size, private and pool buffers, until adaptive
    selection settles each class; write the cache (at `path`, for the
    settings' summary).  The exit status."""
    # deliberate: every candidate tried FILL_ROUNDS times, none dropped early
    learner.ROUNDS = FILL_ROUNDS
    learner.EXPLORE_BUDGET = math.inf
    learner.DROP_AFTER_ONE = math.inf
    world = MPI.COMM_WORLD
    nranks = world.Get_size()
    # pool buffers first: a class whose private calls settle on MPI would never
    # find out that pool-resident buffers run zero-copy (its placement stays)
    cases = [(kind, op, s) for kind in ("pool", "private") for op in ops for s in sizes]
    speed = time_speed(world)
    progress = announce("cxlmpi.tune", [fill_seconds(op, s, nranks, speed)
                                        for _, op, s in cases],
                        world.Get_rank() == 0 and not args.quiet,
                        f"{len(ops)} collectives x {len(sizes)} sizes x 2 placements")
    rows = []
    wrapped = None
    for kind, op, requested in cases:
        if wrapped is None or kind != rows[-1][2]:
            # a communicator per placement: each starts from nothing learned
            if wrapped is not None:
                wrapped.Free()   # writes what it learned into the cache (rank 0)
            wrapped = cxlmpi.wrap(MPI.Intracomm(world).Dup())
            stock = MPI.Intracomm(wrapped)
        size = op.message_size(requested, nranks)
        nsend, nrecv = op.counts(size // op.itemsize, nranks)
        total = max(nsend, nrecv) * op.itemsize
        progress.step(f"{op.name} {format_size(size)} {kind}")
        bufs = make_buffers(op, size // op.itemsize, kind, wrapped)
        fn, fargs = op.bind(wrapped, bufs)
        warm, wargs = op.bind(stock, bufs)
        for _ in range(2):   # first touches of the buffers: not what is learned
            warm(*wargs)
        calls = 0
        # every rank reads the same (agreed) decision: the loops end alike
        while calls < FILL_CALLS and (calls < 2 or select.decision(
                wrapped, op.stat_key, total) is None):
            fn(*fargs)
            calls += 1
        rows.append((op.name, format_size(size), kind,
                     select.decision(wrapped, op.stat_key, total) or "-", str(calls)))
        del bufs, fn, fargs, warm, wargs
    finish("cxlmpi.tune", progress, args.quiet)
    if wrapped is not None:
        wrapped.Free()
    if world.Get_rank() == 0:
        print(align_rows([["collective", "size", "buffers", "chosen", "calls"]] + rows, left=3))
        print(f"# cache: {path} (CXLMPI_CACHE); python -m cxlmpi --info lists it",
              flush=True)
    return 0
