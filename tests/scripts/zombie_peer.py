"""Dead-peer detection of the pool when the dead peer is not yet reaped.

No MPI: this process creates a two-rank pool, forks a child that attaches as
rank 1 and SIGKILLs itself, and, without reaping the child (so it stays a
zombie, as it does while its launcher is slow to collect it), waits in a
pool Barrier.  Prints ``RESULT peer_gone|timed_out <seconds>``.
"""

from __future__ import annotations

import importlib
import os
import signal
import sys
import time
from pathlib import Path

TIMEOUT = 2.0  # pool wait limit; a dead peer must be noticed well before it


def main() -> None:
    # The compiled pool alone: importing the package would initialise MPI,
    # which must not happen before a fork.
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "cxlmpi"))
    pool_mod = importlib.import_module("_pool")
    size = 1 << 20
    pool = pool_mod.Pool.create(0, 2, size, unnamed=False)
    ready_r, ready_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        pool_mod.Pool.attach(pool.name, 1, 2, size)
        os.write(ready_w, b"x")
        os.kill(os.getpid(), signal.SIGKILL)
    os.read(ready_r, 1)  # the child has attached (and is about to die)
    pool.unlink()
    pool.timeout_s = TIMEOUT
    t0 = time.monotonic()
    outcome = "completed"
    try:
        pool.barrier()
    except pool_mod.PoolFailure as exc:
        outcome = "timed_out" if exc.timed_out else "peer_gone"
    print(f"RESULT {outcome} {time.monotonic() - t0:.2f}", flush=True)
    os.waitpid(pid, 0)


if __name__ == "__main__":
    main()
