"""Collectives whose ranks disagree (sizes, roots, ops, counts), which MPI
forbids: under cxlmpi every rank must raise, none may return wrong data or
hang, and the communicator must work afterwards.

    mpiexec -n N python mismatch.py

Run with every size through the pool (CXLMPI_TUNING=pool, a small
threshold).  Prints RESULT {case: [what each rank raised]}, STOCK {case:
[what each rank's plain communicator did]} for the cases MPI itself runs
(AS_STOCK: a receiver that names another count than is sent), and AFTER
true when an Allreduce after all the cases equals stock MPI's.
"""

import json

import numpy as np
from mpi4py import MPI

import cxlmpi

plain = MPI.COMM_WORLD
comm = cxlmpi.wrap(plain.Dup())
stock = plain.Dup()
stock.Set_errhandler(MPI.ERRORS_RETURN)
rank, size = comm.Get_rank(), comm.Get_size()
last = size - 1
K = 1 << 10


def f64(n):
    return np.arange(n, dtype=np.float64) + rank


def counts(n, bump):
    """n elements per rank; rank `last` believes rank 0's count is bigger."""
    c = [n] * size
    if bump and rank == last:
        c[0] += 8
    return c


AS_STOCK = {
    "Bcast size": lambda c: c.Bcast(np.zeros(8 * K if rank == 0 else 16 * K), 0),
    "Gatherv counts": lambda c: c.Gatherv(
        f64(K), [np.empty(size * K + 8), counts(K, True)] if rank == last else None, last),
    "Scatterv counts": lambda c: c.Scatterv(
        [f64(size * K + 8), counts(K, True)] if rank == last else None,
        np.empty(K), last),
    "Alltoallv counts": lambda c: c.Alltoallv(
        [f64(size * K), [K] * size], [np.empty(size * K + 8), counts(K, True)]),
}

CASES = {
    "Bcast size": lambda: AS_STOCK["Bcast size"](comm),
    "Bcast root": lambda: comm.Bcast(np.zeros(8 * K), 0 if rank == 0 else last),
    "Allreduce size": lambda: comm.Allreduce(f64(2 * K if rank == 0 else K),
                                             np.empty(2 * K if rank == 0 else K)),
    "Reduce op": lambda: comm.Reduce(f64(K), np.empty(K), MPI.SUM if rank == 0 else MPI.MAX, 0),
    "Allgather size": lambda: comm.Allgather(f64(K + rank), np.empty((K + rank) * size)),
    "Alltoall size": lambda: comm.Alltoall(f64((K + rank) * size), np.empty((K + rank) * size)),
    "Scan size": lambda: comm.Scan(f64(K + rank), np.empty(K + rank)),
    "Allgatherv counts": lambda: comm.Allgatherv(
        f64(counts(K, False)[rank]), [np.empty(size * K + 8), counts(K, True)]),
    "Gatherv counts": lambda: AS_STOCK["Gatherv counts"](comm),
    "Scatterv counts": lambda: AS_STOCK["Scatterv counts"](comm),
    "Alltoallv counts": lambda: AS_STOCK["Alltoallv counts"](comm),
    "Reduce_scatter counts": lambda: comm.Reduce_scatter(
        f64(sum(counts(K, True))), np.empty(counts(K, True)[rank]), counts(K, True), MPI.SUM),
}
if "Open MPI" in MPI.Get_library_version():
    # stock Open MPI corrupts its heap on the Scatterv (rank 0 receives more
    # than its buffer: "double free or corruption" with plain mpi4py, no
    # cxlmpi) and aborts the process on the Bcast (SIGABRT): there is no
    # stock outcome to compare with, and cxlmpi runs both as stock does
    for name in ("Scatterv counts", "Bcast size"):
        del CASES[name], AS_STOCK[name]


def ended(call):
    """What `call()` ended in on this rank."""
    try:
        call()
        return "returned"
    except cxlmpi.CXLMPIMismatchError as exc:
        return "mismatch" if "do not match" in str(exc) else f"mismatch?{exc}"
    except Exception as exc:  # noqa: BLE001 - what was raised is the result
        return type(exc).__name__


outcome = {name: plain.gather(ended(call), 0) for name, call in CASES.items()}
as_stock = {name: plain.gather(ended(lambda call=call: call(stock)), 0)
            for name, call in AS_STOCK.items()}

data = f64(4 * K)
got, want = np.empty_like(data), np.empty_like(data)
comm.Allreduce(data, got)
plain.Allreduce(data, want)
after = plain.allreduce(bool(np.array_equal(got, want)), MPI.LAND)
if rank == 0:
    print("RESULT", json.dumps(outcome), flush=True)
    print("STOCK", json.dumps(as_stock), flush=True)
    print("AFTER", json.dumps(after), flush=True)
comm.Free()
stock.Free()
