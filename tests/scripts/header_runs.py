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
"stale_report": False, or the error a report left pending raised,
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


def gather(block: int, root: int) -> None:
    global same
    send = np.full(block, rank + 1, np.uint8)
    got, want = (np.zeros(block * size, np.uint8) if rank == root else None for _ in "ab")
    comm.Gather(send, got, root)
    stock.Gather(send, want, root)
    if rank == root:
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
# A run in flight whose report a header step took on some ranks only (the
# Scatter root passes None: MPI at once, the others ask and follow), then
# ended by a call of another size: no rank may keep that report pending
# (the next header step's reports would differ: a mismatch on every rank).
gathers = config.COLLECTIVES.index("gather")
# (the other size's class settled on the pool: no run of its own starts)
routes.set(gathers, select.size_class(n // 4 * size), 0, select.code_of("pool"), 1 << 40)
routes.start_run(gathers, select.size_class(n * size), 0, select.code_of("pool"),
                 routes.ops() + 8)
gather(n, 0)
whole = (np.arange(n * size) % 7).astype(np.uint8)
mine = np.zeros(n, np.uint8)
comm.Scatter(whole, None if rank == 0 else mine, 0)
stock.Scatter(whole, None if rank == 0 else mine, 0)
gather(n // 4, 0)         # (another size class of Gather: the run ends)
try:
    for block in (n, n // 2):
        scatter(block, 1 % size)
        gather(block, 0)
    result["stale_report"] = False
except Exception as exc:  # noqa: BLE001 (reported, then every rank stops)
    result["stale_report"] = f"{type(exc).__name__}: {exc}"
result["same"] = same
if rank == 0:
    print("RESULT " + json.dumps(result), flush=True)
comm.Free()
