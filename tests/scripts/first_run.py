"""A class's first run, in the compiled routes: its opening call (cold) is
not timed, and neither are the next three, which hold the time the ranks
left the cold one apart and MPI's own warming up; then each call back to
back counts.  The calls timed
so far after each call (Routes.peek_run), and each result against stock.

    mpiexec -n N python first_run.py

Prints RESULT {"timed": [calls timed after call 1, 2, ...], "same": every
result equal to stock MPI's}.
"""

import json

import numpy as np
from mpi4py import MPI

import cxlmpi
from cxlmpi import select
from cxlmpi.pools.state import _states, fresh_state

comm = cxlmpi.wrap(MPI.COMM_WORLD.Dup())
stock = MPI.Intracomm(comm)
fresh_state(comm)
routes = _states[comm.handle].routes
n = (512 << 10) // 8            # a class whose first run is 8 calls, 3 untimed
assert select.first_run(select.size_class(n * 8)) == 8
assert select.first_skip(select.size_class(n * 8)) == 3
send = np.arange(n, dtype=np.float64) * (comm.Get_rank() + 1)
got, want = np.empty(n), np.empty(n)
timed, same = [], True
for _ in range(8):
    comm.Allreduce(send, got)
    run = routes.peek_run()
    timed.append(None if run is None else run[5])
    stock.Allreduce(send, want)
    same = same and bool(np.array_equal(got, want))
if comm.Get_rank() == 0:
    print("RESULT " + json.dumps({"timed": timed, "same": same}), flush=True)
comm.Free()
