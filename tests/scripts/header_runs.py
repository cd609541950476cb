"""Timed runs of the collectives whose every call opens with a header step
(Scatter, Gather and their v-forms: only some ranks know their sizes), in
the compiled routes: a run of 7 calls is timed end to end, as the other
collectives' runs are -- its header steps carry no report and leave it
going -- and a call of another size ends it, alike on every rank.

    mpiexec -n N python header_runs.py

A run is opened by hand (Routes.start_run, as the selector opens one) on
the pool's plain path for Scatter and on MPI for Gatherv; after each call,
the calls timed so far (Routes.peek_run), and each result against stock.
Prints RESULT {"scatter": [...], "gatherv": [...], "other_size": [the run's
collective and size class after each call], "class": [those of the run],
"same": every result equal to stock MPI's}.
"""

import json

import numpy as np
from mpi4py import MPI

import cxlmpi
from cxlmpi import config, select
from cxlmpi.pools.state import _states, fresh_state

comm = cxlmpi.wrap(MPI.COMM_WORLD.Dup())
stock = MPI.Intracomm(comm)
fresh_state(comm)
routes = _states[comm.handle].routes
rank, size = comm.Get_rank(), comm.Get_size()
n = 256 << 10                     # bytes a rank: one run is 8 calls or fewer
same = True


def calls_timed() -> int | None:
    run = routes.peek_run()
    return None if run is None else run[5]


def scatter(block: int, root: int) -> None:
    global same
    send = (np.arange(block * size) % 251).astype(np.uint8) + rank
    got, want = np.zeros(block, np.uint8), np.zeros(block, np.uint8)
    comm.Scatter(send, got, root)
    stock.Scatter(send, want, root)
    same = same and bool(np.array_equal(got, want))


def gatherv(block: int, root: int) -> None:
    global same
    send = np.full(block + rank, rank + 1, np.uint8)
    counts = [block + r for r in range(size)]
    got, want = (np.zeros(sum(counts), np.uint8) if rank == root else None for _ in "ab")
    comm.Gatherv(send, [got, counts] if rank == root else None, root)
    stock.Gatherv(send, [want, counts] if rank == root else None, root)
    if rank == root:
        same = same and bool(np.array_equal(got, want))


def run(name: str, path: str, call, block: int) -> list:
    which = config.COLLECTIVES.index(name)
    sc = select.size_class(block * size)
    routes.start_run(which, sc, 0, select.code_of(path), routes.ops() + 8)
    timed = []
    for k in range(7):   # (the header step of a run's opening call counts too)
        call(block, k % size)
        timed.append(calls_timed())
    routes.finish_run()
    return timed


result = {"scatter": run("scatter", "pool", scatter, n),
          "gatherv": run("gatherv", "mpi", gatherv, n)}
# a Scatter of another size class in the middle of a run: the run ends
which = config.COLLECTIVES.index("scatter")
routes.start_run(which, select.size_class(n * size), 0, select.code_of("pool"),
                 routes.ops() + 8)
classes = []
for block in (n, n, n // 4):
    scatter(block, 0)
    run = routes.peek_run()
    classes.append(None if run is None else list(run[:2]))
result["other_size"] = classes
result["class"] = [which, select.size_class(n * size)]
result["same"] = same
if rank == 0:
    print("RESULT " + json.dumps(result), flush=True)
comm.Free()
