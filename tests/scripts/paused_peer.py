"""Rank 1 stands still (SIGSTOP) for many times its lease while rank 0
waits for it in a pool Allreduce (tests/test_liveness.py).

    mpiexec -n 1 python paused_peer.py MODE : \
            -n 1 [unshare ... sh -c "python paused_peer.py MODE; exit"]

(In a namespace of its own rank 1 must not be its init, pid 1, which
ignores the SIGSTOP it sends itself: a shell that waits for it is.)

- namespace:  rank 1 runs in a pid namespace of its own (a container on
              this host): the kernel still holds its lock, so rank 0 waits
              as stock MPI does, and the Allreduce equals stock MPI's.
- other-host: rank 1 takes another host's identity (no lock can be asked
              about): rank 0 judges it by its heartbeat and stops with an
              error that names how long it stood still and the setting.

Rank 1 is resumed by a helper it starts before it stops itself: the pause
is the scenario, not a synchronization.  Prints ``RESULT {"ok": [...],
"errors": [...], "hosts": [...]}`` on rank 0 (hosts: cxlmpi.memory.liveness.HOST).
"""

import json
import os
import signal
import subprocess
import sys

import numpy as np
from mpi4py import MPI

import cxlmpi
from cxlmpi import _pool
from cxlmpi.memory import liveness

PAUSE_S = 2.0          # (the lease in the tests: 0.05 s x 5 beats)

mode = sys.argv[1]
world = MPI.COMM_WORLD
rank = world.Get_rank()
if mode == "other-host" and rank == 1:
    _pool.set_host(0x0123456789ABCDEF)    # as if on another host
comm = cxlmpi.wrap(world.Dup())
plain = MPI.Intracomm(comm)
data = np.arange(1 << 14, dtype=np.float64) * (rank + 1)
got, want = np.empty_like(data), np.empty_like(data)
comm.Allreduce(data, got)                 # sets the pool up
world.Barrier()
if rank == 1:
    subprocess.Popen(["sh", "-c", f"sleep {PAUSE_S}; kill -CONT {os.getpid()}"])
    os.kill(os.getpid(), signal.SIGSTOP)
error = None
try:
    comm.Allreduce(data + 1, got)
except cxlmpi.CXLMPIError as exc:
    error = f"{type(exc).__name__}: {exc}"
world.Allreduce(data + 1, want)
mine = (bool(np.array_equal(got, want)), error, liveness.HOST)
everyone = world.gather(mine, root=0)
if rank == 0:
    print("RESULT " + json.dumps({"ok": [e[0] for e in everyone],
                                  "errors": [e[1] for e in everyone],
                                  "hosts": [e[2] for e in everyone]}), flush=True)
