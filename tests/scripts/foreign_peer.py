"""A pool peer whose pid means nothing here: rank 1 runs in another pid
namespace (as in a container on this host, or on another host).

No MPI: this process creates a two-rank pool; rank 1 attaches from
`unshare --pid --fork --mount-proc` and then, as the argument says, dies
(SIGKILL) or is late (sleeps ten heartbeat leases) before it joins a pool
Barrier.  The pool's wait must tell them apart by rank 1's heartbeat: a dead
peer well before the pool's timeout, a late one never.  Run with
CXLMPI_HEARTBEAT and CXLMPI_LEASE_BEATS set small.  Prints
``RESULT completed|peer_gone|timed_out <seconds>``.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time

from cxlmpi._pool import Pool, PoolFailure

from cxlmpi import config

SIZE = 1 << 20
TIMEOUT = 8.0  # pool wait limit: a dead peer must be noticed well before it


def child(name: str, how: str) -> None:
    pool = Pool.attach(name, 1, 2, SIZE)
    print("ATTACHED", flush=True)
    if how == "die":
        signal.pause()    # killed from outside: a namespace's init ignores its own SIGKILL
    cfg = config.get()
    time.sleep(10 * cfg.heartbeat * cfg.lease_beats)
    pool.timeout_s = TIMEOUT
    pool.barrier()
    pool.close()


def main(how: str) -> None:
    pool = Pool.create(0, 2, SIZE, unnamed=False)   # (a peer in another pid namespace)
    proc = subprocess.Popen(["unshare", "--pid", "--fork", "--mount-proc", "--kill-child",
                             sys.executable, __file__, "--child", pool.name, how],
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "ATTACHED"
    pool.unlink()
    if how == "die":
        proc.kill()       # unshare, and with it (--kill-child) rank 1
    pool.timeout_s = TIMEOUT
    t0 = time.monotonic()
    outcome = "completed"
    try:
        pool.barrier()
    except PoolFailure as exc:
        outcome = "timed_out" if exc.timed_out else "peer_gone"
    print(f"RESULT {outcome} {time.monotonic() - t0:.2f}", flush=True)
    proc.kill()
    proc.wait()


if __name__ == "__main__":
    config.get()   # the heartbeat settings, before any pool is mapped
    if sys.argv[1] == "--child":
        child(sys.argv[2], sys.argv[3])
    else:
        main(sys.argv[1])
