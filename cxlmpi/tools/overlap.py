"""``python -m cxlmpi.bench --overlap``: nonblocking collectives with
compute between post and wait, the OSU way (osu_iallreduce, osu_ibcast).

Per collective and size, stock and cxlmpi alternating (median of the
rounds): the time of the blocking form on the same buffers, the pure
time of a call posted and waited for at once, the compute time (a loop
that makes no MPI call, calibrated to the pure time of the same
communicator), the time of post + compute + wait, and OSU's overlap:
100 x (1 - (total - compute) / pure), floored at 0.  The speedup is
stock's total over cxlmpi's: what a program that hides the collective
behind that much compute sees.  The compute is OSU's (busy, ``cpu``) or,
``--overlap-compute wait``, a wait off the core -- a thread that waits
for a GPU kernel or for I/O: where every core runs a rank, only then is a
core free to progress the call.  posted_over_blocking is cxlmpi's pure time
over its blocking call's (the price of the posted form), and
persistent_over_blocking the time of a Start + Wait of the persistent form
(``Allreduce_init`` & co., set up once) over it.
"""

from __future__ import annotations

import argparse
import statistics
from time import perf_counter, sleep
from typing import Any

import numpy as np
from mpi4py import MPI

import cxlmpi

from .measure import _pool_path
from .operations import SENTINEL, allocate, describe_mismatch, fill_pattern, problems_at_root
from .report import Progress, format_size

__all__ = ["OVERLAP_OPS", "run_overlap"]

#: The nonblocking collectives measured: name -> (the arguments of the call,
#: and of its blocking form, for (comm, send, recv); element count of (send,
#: recv) for a message of n elements on p ranks).
OVERLAP_OPS: dict[str, Any] = {
    "Iallreduce": (lambda c, s, r: (s, r), lambda n, p: (n, n)),
    "Ibcast": (lambda c, s, r: (s, 0), lambda n, p: (n, 0)),
    "Iallgather": (lambda c, s, r: (s, r), lambda n, p: (n, n * p)),
    "Igather": (lambda c, s, r: (s, r, 0), lambda n, p: (n, n * p)),
    "Iscatter": (lambda c, s, r: (s, r, 0), lambda n, p: (n * p, n)),
    "Ialltoall": (lambda c, s, r: (s, r), lambda n, p: (n * p, n * p)),
    # the vector forms, every block alike
    "Igatherv": (lambda c, s, r: (s, _v(c, r), 0), lambda n, p: (n, n * p)),
    "Iscatterv": (lambda c, s, r: (_v(c, s), r, 0), lambda n, p: (n * p, n)),
    "Ialltoallv": (lambda c, s, r: (_v(c, s), _v(c, r)), lambda n, p: (n * p, n * p)),
}


def _v(comm: MPI.Intracomm, a: np.ndarray) -> list[Any]:
    """`a` as a vector message of one block per rank, all alike."""
    p = comm.Get_size()
    return [a, [a.size // p] * p, MPI.DOUBLE]


def _compute(seconds: float, work: np.ndarray | None) -> None:
    """`seconds` without calling MPI: busy (small NumPy steps on `work`,
    OSU's dummy compute), or, `work` None, waiting off the core, as a
    thread that waits for a GPU kernel or for I/O does (the core is free
    for whatever progresses the call)."""
    if work is None:
        sleep(seconds)
        return
    end = perf_counter() + seconds
    while perf_counter() < end:
        work *= 1.0000001


def _fine_sleeps() -> None:
    """Let this thread's sleeps end within microseconds of their time (the
    kernel's default timer slack, 50 us, is as long as a short call)."""
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(29, 1, 0, 0, 0)   # PR_SET_TIMERSLACK
    except (OSError, AttributeError):
        pass


def _batch(comm: MPI.Intracomm, name: str, args: tuple, iterations: int,
           compute_s: float, work: np.ndarray | None) -> float:
    """Seconds per iteration of post, compute, wait (the slowest rank's)."""
    post = getattr(comm, name)
    comm.Barrier()
    t0 = perf_counter()
    for _ in range(iterations):
        request = post(*args)
        if compute_s:
            _compute(compute_s, work)
        request.Wait()
    return comm.allreduce(perf_counter() - t0, op=MPI.MAX) / iterations


def _blocking(comm: MPI.Intracomm, name: str, args: tuple, iterations: int) -> float:
    """Seconds per call of the blocking form of `name` (the slowest rank's)."""
    call = getattr(comm, name[1].upper() + name[2:])
    comm.Barrier()
    t0 = perf_counter()
    for _ in range(iterations):
        call(*args)
    return comm.allreduce(perf_counter() - t0, op=MPI.MAX) / iterations


def _persistent(comm: MPI.Intracomm, name: str, args: tuple, iterations: int,
                warmup: int) -> tuple[float, str]:
    """Seconds per Start + Wait of the persistent form of `name` (set up
    once: ``Iallreduce`` -> ``Allreduce_init``; the slowest rank's), and the
    path cxlmpi's Starts took."""
    request = getattr(comm, name[1].upper() + name[2:] + "_init")(*args)
    try:
        for _ in range(warmup):
            request.Start()
            request.Wait()
        before = cxlmpi.stats()
        comm.Barrier()
        t0 = perf_counter()
        for _ in range(iterations):
            request.Start()
            request.Wait()
        seconds = comm.allreduce(perf_counter() - t0, op=MPI.MAX) / iterations
    finally:
        request.Free()
    return seconds, _pool_path(name.lower(), before)[0]


def _measure(comm: MPI.Intracomm, name: str, n: int, kind: str, iterations: int,
             warmup: int, busy: bool) -> dict[str, float]:
    arguments, counts = OVERLAP_OPS[name]
    nsend, nrecv = counts(n, comm.Get_size())
    send = allocate(kind, nsend, np.float64, comm)
    recv = allocate(kind, nrecv, np.float64, comm) if nrecv else None
    fill_pattern(send, comm.Get_rank())
    args = arguments(comm, send, recv)
    work = np.ones(64) if busy else None
    _blocking(comm, name, args, warmup)
    before = cxlmpi.stats()
    blocking = _blocking(comm, name, args, iterations)
    blocking_path = _pool_path(name[1:].lower(), before)[0]
    persistent, persistent_path = _persistent(comm, name, args, iterations, warmup)
    _batch(comm, name, args, warmup, 0.0, work)
    before = cxlmpi.stats()
    pure = _batch(comm, name, args, iterations, 0.0, work)
    posted_path = _pool_path(name.lower(), before)[0]
    compute = comm.bcast(pure, root=0)
    comm.Barrier()
    t0 = perf_counter()
    for _ in range(iterations):
        _compute(compute, work)
    compute = comm.allreduce(perf_counter() - t0, op=MPI.MAX) / iterations
    total = _batch(comm, name, args, iterations, compute, work)
    overlap = max(0.0, 100.0 * (1.0 - (total - compute) / pure)) if pure > 0 else 0.0
    return {"blocking_us": blocking * 1e6, "persistent_us": persistent * 1e6,
            "persistent_path": persistent_path, "pure_us": pure * 1e6,
            "compute_us": compute * 1e6, "total_us": total * 1e6, "overlap_pct": overlap,
            "blocking_path": blocking_path, "posted_path": posted_path}


def _validate(stock: MPI.Intracomm, wrapped: MPI.Intracomm, name: str, n: int,
              kind: str) -> list[str] | None:
    """Post `name` once on each communicator with the same data, wait, and
    compare what each rank received (where defined: a rooted gather's at
    the root).  On rank 0: the problems, one line per rank ([] when none);
    None on the other ranks."""
    arguments, counts = OVERLAP_OPS[name]
    rank, nranks = stock.Get_rank(), stock.Get_size()
    nsend, nrecv = counts(n, nranks)
    outputs = []
    for comm, buffers in ((stock, "private"), (wrapped, kind)):
        send = allocate(buffers, nsend, np.float64, wrapped)
        fill_pattern(send, rank)
        recv = allocate(buffers, nrecv, np.float64, wrapped) if nrecv else None
        if recv is not None:
            recv[...] = SENTINEL["f"]
        elif rank != 0:                 # Ibcast: the others receive in place
            send[...] = SENTINEL["f"]
        getattr(comm, name)(*arguments(comm, send, recv)).Wait()
        outputs.append(np.array(send if recv is None else recv))
    defined = rank == 0 or name not in ("Igather", "Igatherv")
    return problems_at_root(stock, describe_mismatch(outputs[0], outputs[1]) if defined
                            else None)


def run_overlap(args: argparse.Namespace, sizes: list[int]) -> list[dict[str, Any]]:
    """The records of --overlap (rank 0 prints the table)."""
    world = MPI.COMM_WORLD
    wrapped = cxlmpi.wrap(MPI.Intracomm(world).Dup())
    stock = MPI.Intracomm(wrapped)
    wrapped.Allreduce(np.zeros(1 << 16), np.zeros(1 << 16))   # (the pool set up)
    names = [n for n in OVERLAP_OPS if n.lower() in args.overlap_ops.lower().split(",")] \
        if args.overlap_ops != "all" else list(OVERLAP_OPS)
    iterations = args.iterations or 50
    warmup = 10 if args.warmup is None else args.warmup
    busy = args.overlap_compute == "cpu"
    if not busy:
        _fine_sleeps()
    progress = Progress(len(names) * len(sizes), enabled=world.Get_rank() == 0 and
                        not args.quiet)
    records = []
    for name in names:
        for size in sizes:
            progress.step(f"{name} {format_size(size)}")
            n = max(1, size // 8)
            rounds: dict[str, list[dict[str, float]]] = {"stock": [], "cxlmpi": []}
            for _ in range(args.rounds):
                rounds["stock"].append(_measure(stock, name, n, "private", iterations,
                                                warmup, busy))
                rounds["cxlmpi"].append(_measure(wrapped, name, n, args.buffers, iterations,
                                                 warmup, busy))
            record: dict[str, Any] = {"op": name, "size": n * 8}
            for who, rows in rounds.items():
                for key in rows[0]:
                    if key.endswith("_path"):
                        # what cxlmpi's calls took (stock's: MPI, never counted)
                        if who == "cxlmpi":
                            paths = {r[key] for r in rows}
                            record[key] = paths.pop() if len(paths) == 1 else "mixed"
                        continue
                    record[f"{who}_{key}"] = statistics.median(r[key] for r in rows)
            record["speedup"] = record["stock_total_us"] / record["cxlmpi_total_us"]
            problems = _validate(stock, wrapped, name, n, args.buffers) \
                if args.validate else None
            record["valid"] = None if problems is None else not problems
            record["validation_errors"] = problems or []
            # the price of the posted form: its pure time over the blocking call's
            record["posted_over_blocking"] = (record["cxlmpi_pure_us"]
                                              / record["cxlmpi_blocking_us"])
            # and of the persistent form, set up once, started every call
            record["persistent_over_blocking"] = (record["cxlmpi_persistent_us"]
                                                  / record["cxlmpi_blocking_us"])
            records.append(record)
    progress.close()
    wrapped.Free()
    if world.Get_rank() == 0:
        print(f"{'collective':<12} {'size':>8} {'stock pure':>11} {'cxl pure':>9} "
              f"{'cxl I*/blk':>10} {'cxl init/blk':>12} {'stock ovl%':>10} {'cxl ovl%':>9} "
              f"{'stock total':>12} {'cxl total':>10} {'speedup':>8}  "
              f"path (posted/persistent/blocking)")
        for r in records:
            print(f"{r['op']:<12} {format_size(r['size']):>8} {r['stock_pure_us']:>9.1f}us "
                  f"{r['cxlmpi_pure_us']:>7.1f}us {r['posted_over_blocking']:>9.2f}x "
                  f"{r['persistent_over_blocking']:>11.2f}x "
                  f"{r['stock_overlap_pct']:>9.0f}% "
                  f"{r['cxlmpi_overlap_pct']:>8.0f}% {r['stock_total_us']:>10.1f}us "
                  f"{r['cxlmpi_total_us']:>8.1f}us {r['speedup']:>7.2f}x  "
                  f"{r['posted_path']}/{r['persistent_path']}/{r['blocking_path']}")
        print(f"# {world.Get_size()} ranks; cxlmpi {args.buffers} buffers, stock private; "
              f"compute: {'busy' if busy else 'waiting off the core'}; "
              f"median of {args.rounds} round(s), {iterations} iterations each", flush=True)
    return records
