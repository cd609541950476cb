"""Where the hot path's per-call state met another thread's call
(tests/test_reliability.py), each checked against a plain communicator.

    thread_races.py tables ITERATIONS
    thread_races.py first-calls NTHREADS
    thread_races.py finalizer

``tables``: a pool file whose one-host and several-host windows differ
(the test sets CXLMPI_POOL=file:..., CXLMPI_HOSTS_THRESHOLD).  Thread 0
runs Alltoallv on its communicator, whose path `settle` reads from the
windows after the header step; thread 1 meanwhile makes small Allreduce
calls on a communicator without a pool yet, whose windows are the other
table.  The windows were process-wide: thread 0's rank read thread 1's
table, sent its call to MPI while its peer waited in the pool.

``first-calls``: NTHREADS threads make their first intercepted calls at
once, a tiny GIL switch interval between them.  The settings were
published before the hot path had taken them: a thread that came second
passed its call to MPI while its peer's took the pool.

``finalizer``: one thread.  A finalizer runs a small Allgather on
communicator B while the hot path switches its cached communicator from B
to A; the half-switched cache ran B's call on A's handle (B's ranks are in
reverse order: the blocks came back in A's order).

Prints ``RESULT <json>`` per rank: {"rank", "wrong": calls whose result
differed from stock, "calls", "error"}.
"""

from __future__ import annotations

import gc
import json
import sys
import threading

import mpi4py

mpi4py.rc.thread_level = "multiple"

import numpy as np  # noqa: E402
from mpi4py import MPI  # noqa: E402

import cxlmpi  # noqa: E402

world = MPI.COMM_WORLD
rank, size = world.Get_rank(), world.Get_size()
report = {"rank": rank, "wrong": 0, "calls": 0, "error": None}


def check(got: np.ndarray, want: np.ndarray) -> None:
    report["calls"] += 1
    if not np.array_equal(got, want):
        report["wrong"] += 1


def tables(iterations: int) -> None:
    comm, plain = cxlmpi.wrap(world.Dup()), world.Dup()
    other = cxlmpi.wrap(world.Dup())
    done = threading.Event()
    n = 1024   # doubles per block: 16 KiB a call at 2 ranks

    def alltoallv() -> None:
        try:
            counts, displs = [n] * size, [n * i for i in range(size)]
            for it in range(iterations):
                x = np.arange(n * size, dtype=np.float64) + 1000 * rank + it
                got, want = np.zeros(n * size), np.zeros(n * size)
                comm.Alltoallv([x, counts, displs, MPI.DOUBLE], [got, counts, displs, MPI.DOUBLE])
                plain.Alltoallv([x, counts, displs, MPI.DOUBLE],
                                [want, counts, displs, MPI.DOUBLE])
                check(got, want)
        except Exception as exc:
            report["error"] = f"{type(exc).__name__}: {exc}"
        finally:
            done.set()

    def small() -> None:
        # until thread 0 of every rank is done (all stop at the same call)
        a, b = np.zeros(1), np.empty(1)
        while True:
            a[0] = 1.0 if done.is_set() else 0.0
            other.Allreduce(a, b, MPI.MIN)
            if b[0] == 1.0:
                break

    threads = [threading.Thread(target=alltoallv), threading.Thread(target=small)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


def first_calls(nthreads: int) -> None:
    comms = [cxlmpi.wrap(world.Dup()) for _ in range(nthreads)]
    plains = [world.Dup() for _ in range(nthreads)]
    start = threading.Barrier(nthreads)
    lock = threading.Lock()

    def work(t: int) -> None:
        x = np.random.default_rng([t, rank]).standard_normal(8192)   # 64 KiB
        got, want = np.empty_like(x), np.empty_like(x)
        try:
            start.wait()
            comms[t].Allreduce(x, got, MPI.SUM)
            plains[t].Allreduce(x, want, MPI.SUM)
            with lock:
                check(got, want)
        except Exception as exc:
            report["error"] = f"{type(exc).__name__}: {exc}"

    sys.setswitchinterval(1e-6)
    threads = [threading.Thread(target=work, args=(t,)) for t in range(nthreads)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    sys.setswitchinterval(0.005)


def finalizer() -> None:
    a = cxlmpi.wrap(world.Dup())
    b = cxlmpi.wrap(world.Split(0, size - rank))   # ranks in reverse order
    b_plain = world.Split(0, size - rank)
    for comm in (a, b):                              # pools set up
        comm.Allreduce(MPI.IN_PLACE, np.ones(4096), MPI.SUM)

    class Garbage:
        def __del__(self) -> None:
            x = np.array([float(rank)])
            got, want = np.zeros(size), np.zeros(size)
            b.Allgather(x, got)
            b_plain.Allgather(x, want)
            check(got, want)

    one = np.ones(1)
    b.Allreduce(MPI.IN_PLACE, one, MPI.SUM)   # B is the communicator cached
    junk = Garbage()
    junk.me = junk                             # a cycle: only the collector frees it
    del junk
    gc.set_threshold(1)     # the next tracked allocation collects it: inside a's call
    a.Allreduce(MPI.IN_PLACE, one, MPI.SUM)
    gc.set_threshold(700)
    gc.collect()


def main() -> None:
    mode = sys.argv[1]
    if mode == "tables":
        tables(int(sys.argv[2]))
    elif mode == "first-calls":
        first_calls(int(sys.argv[2]))
    else:
        finalizer()
    everyone = world.gather(report, root=0)
    if rank == 0:
        print("RESULT " + json.dumps(everyone), flush=True)


if __name__ == "__main__":
    main()
