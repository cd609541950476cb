"""One rank fails, the others go on into a collective that can never
complete (tests/test_runner.py).

    failing.py ACTION WHEN THEN

ACTION  what rank 1 does: raise (RuntimeError), exit (sys.exit(3)) or kill
        (SIGKILL to itself)
WHEN    start: before any pool exists; pool: after a large Allreduce has
        created the pool
THEN    what the other ranks do next: allreduce (large) or barrier

Every rank prints ``PID <rank> <pid>`` first; rank 0 prints ``POOL <name>``
once the pool exists; a survivor that gets past the collective prints
``SURVIVED <rank>``.
"""

from __future__ import annotations

import os
import signal
import sys

import numpy as np
from mpi4py import MPI

N = 1 << 17


def say(line: str) -> None:
    """Print `line` in one write: ranks' lines never interleave."""
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def main() -> None:
    action, when, then = sys.argv[1:4]
    comm = MPI.COMM_WORLD
    rank = comm.Get_rank()
    say(f"PID {rank} {os.getpid()}")
    data = np.full(N, rank + 1.0)
    out = np.empty_like(data)
    if when == "pool":
        comm.Allreduce(data, out)
        cxl = sys.modules.get("cxlmpi")
        if cxl is not None and rank == 0:
            state = cxl.pools.state._states.get(comm.handle)
            if state is not None and state.pool is not None:
                say(f"POOL {state.pool.name}")
                # also in a file: an abort may end the job before the
                # launcher forwards this rank's output (seen with Open MPI)
                path = os.environ.get("FAILING_POOL_FILE")
                if path:
                    with open(path, "w") as f:
                        f.write(state.pool.name)
    if when == "pool":
        comm.Barrier()  # rank 0 has written the pool's name before rank 1 fails
    if rank == 1:
        if action == "raise":
            raise RuntimeError("deliberate failure in rank 1")
        if action == "exit":
            sys.exit(3)
        if action == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        raise SystemExit(f"unknown action {action!r}")
    if then == "allreduce":
        comm.Allreduce(data, out)
    else:
        comm.Barrier()
    say(f"SURVIVED {rank}")


if __name__ == "__main__":
    main()
