"""Several threads of each rank run pool collectives at the same time, each
on a wrapped communicator of its own (tests/test_reliability.py).

    threads.py [NTHREADS] [ITERATIONS] [FRESH]

MPI is initialized with MPI_THREAD_MULTIPLE.  Before any thread starts,
every rank makes, in the same order, one wrapped Dup and one plain Dup of
COMM_WORLD per thread.  Then all threads are released at once; thread t
loops over large Allreduce, Bcast and Allgather calls on its wrapped
communicator and repeats each on its plain one with the same data, comparing
results.  With FRESH > 0, each thread first sets up that many more
wrapped communicators in turn (a Dup of its plain one each: one large
Allreduce, checked, then Free): pool set-ups of several threads at once,
where a step that holds the GIL while it waits for a peer deadlocks.
Rank 0 prints ``THREADS <json>``: per rank, per thread, whether
every result matched, how many calls ran, and the error if one was raised;
plus this rank's pool and learning call counts.  ``SKIP <reason>`` instead
when the MPI library does not provide MPI_THREAD_MULTIPLE.
"""

from __future__ import annotations

import json
import sys
import threading

import mpi4py

mpi4py.rc.thread_level = "multiple"

import numpy as np  # noqa: E402
from mpi4py import MPI  # noqa: E402

import cxlmpi  # noqa: E402


def say(line: str) -> None:
    """Print `line` in one write: ranks' lines never interleave."""
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def fresh_setups(tid: int, plain: MPI.Intracomm, count: int) -> bool:
    """Set up `count` wrapped Dups of `plain` in turn, each by one large
    Allreduce checked against `plain`'s."""
    ok = True
    data = np.random.default_rng([tid, plain.Get_rank()]).standard_normal(8192)
    want = np.empty_like(data)
    plain.Allreduce(data, want, MPI.SUM)
    for _ in range(count):
        comm = cxlmpi.wrap(plain.Dup())
        got = np.empty_like(data)
        comm.Allreduce(data, got, MPI.SUM)
        ok &= bool(np.allclose(got, want, rtol=1e-12, atol=1e-12))
        comm.Free()
    return ok


def work(tid: int, comm: MPI.Intracomm, plain: MPI.Intracomm, iterations: int,
         fresh: int, start: threading.Barrier, report: dict) -> None:
    """Thread `tid`: the loop of pool collectives, each checked against the
    plain communicator; fills `report` (never raises)."""
    rank, size = comm.Get_rank(), comm.Get_size()
    ok, calls = True, 0
    try:
        start.wait()
        ok &= fresh_setups(tid, plain, fresh)
        for it in range(iterations):
            rng = np.random.default_rng([tid, it, rank])
            n = 2048 + 4099 * ((it + tid) % 7)  # 16 KiB .. 250 KiB of float64
            data = rng.standard_normal(n)
            ints = rng.integers(-1000, 1000, n)

            got, want = np.empty(n), np.empty(n)
            comm.Allreduce(data, got, MPI.SUM)
            plain.Allreduce(data, want, MPI.SUM)
            ok &= bool(np.allclose(got, want, rtol=1e-12, atol=1e-12))
            got_i, want_i = np.empty_like(ints), np.empty_like(ints)
            comm.Allreduce(ints, got_i, MPI.MAX)
            plain.Allreduce(ints, want_i, MPI.MAX)
            ok &= bool(np.array_equal(got_i, want_i))

            root = (it + tid) % size
            got = data.copy() if rank == root else np.zeros(n)
            want = got.copy()
            comm.Bcast(got, root)
            plain.Bcast(want, root)
            ok &= bool(np.array_equal(got, want))

            block = ints[:n // size]
            got_g = np.zeros(block.size * size, ints.dtype)
            want_g = np.zeros_like(got_g)
            comm.Allgather(block, got_g)
            plain.Allgather(block, want_g)
            ok &= bool(np.array_equal(got_g, want_g))
            calls += 4
        report.update(ok=ok, calls=calls, error=None)
    except Exception as exc:  # reported, so that the test can show it
        report.update(ok=False, calls=calls, error=f"{type(exc).__name__}: {exc}")


def main() -> None:
    nthreads = int(sys.argv[1]) if len(sys.argv) > 1 else 3
    iterations = int(sys.argv[2]) if len(sys.argv) > 2 else 60
    fresh = int(sys.argv[3]) if len(sys.argv) > 3 else 0
    world = MPI.COMM_WORLD
    rank = world.Get_rank()
    if MPI.Query_thread() < MPI.THREAD_MULTIPLE:
        if rank == 0:
            say(f"SKIP MPI provides thread level {MPI.Query_thread()} only")
        return
    # Made in the same order on every rank, before any thread starts.
    comms = [cxlmpi.wrap(world.Dup()) for _ in range(nthreads)]
    plains = [world.Dup() for _ in range(nthreads)]
    start = threading.Barrier(nthreads)
    reports: list[dict] = [{} for _ in range(nthreads)]
    threads = [threading.Thread(target=work, args=(t, comms[t], plains[t], iterations,
                                                   fresh, start, reports[t]))
               for t in range(nthreads)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    stats = {name: row for name, row in cxlmpi.stats().items()
             if name in ("allreduce", "bcast", "allgather")}
    everyone = world.gather({"rank": rank, "threads": reports,
                             "pool_calls": {k: v["pool_calls"] for k, v in stats.items()},
                             "learning": {k: v["learning_calls"] for k, v in stats.items()}},
                            root=0)
    for comm in comms + plains:
        comm.Free()
    if rank == 0:
        say("THREADS " + json.dumps(everyone))


if __name__ == "__main__":
    main()
