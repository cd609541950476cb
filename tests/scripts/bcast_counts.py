"""Bcast whose receivers name more (or fewer) bytes than the root sends
(tests/test_receive_counts.py): mpi4py infers the count from the buffer.
Each case runs on the wrapped communicator and on a plain one: every
rank's outcome (it returned, or the class of the MPI error it raised) and
what arrived in its buffer must be stock's.  Sizes straddle the pool's
threshold (root below, receivers above, and the reverse) and lie inside its
windows, each on a communicator whose pool exists and on a fresh one (its
first call sets the pool up: at every communicator's first blocking
collective, whatever its size, so that no rank decides from its own size
whether to set a pool up -- only the root knows what is sent).

    mpiexec -n N python bcast_counts.py

Rank 0 prints ``RESULT <json>``: per case, every rank's [wrapped, stock]
outcome and whether the data matched."""

from __future__ import annotations

import json
import sys

import numpy as np
from mpi4py import MPI

import cxlmpi
from cxlmpi import config

MARK = 255


def outcome(comm: MPI.Intracomm, root_nbytes: int, other_nbytes: int,
            persistent: bool = False) -> tuple[str, bytes]:
    """Bcast from rank 0 (its bytes numbered), receivers' buffers filled with
    MARK: what the call ended in, and the buffer afterwards.  `persistent`:
    Bcast_init, started once."""
    r = comm.Get_rank()
    if r == 0:
        buf = (np.arange(root_nbytes) % 251).astype(np.uint8)
    else:
        buf = np.full(other_nbytes, MARK, np.uint8)
    try:
        if persistent:
            req = comm.Bcast_init(buf, 0)
            req.Start()
            req.Wait()
            req.Free()
        else:
            comm.Bcast(buf, 0)
        what = "returned"
    except MPI.Exception as exc:
        what = f"MPI error class {exc.Get_error_class()}"
    except Exception as exc:  # noqa: BLE001 - what was raised is the result
        what = type(exc).__name__
    return what, buf.tobytes()


def main() -> None:
    plain = MPI.COMM_WORLD
    r = plain.Get_rank()
    threshold = config.get().threshold
    pairs = {"receivers twice the root's, straddling": (threshold // 2 + 8, threshold + 16),
             "receivers twice the root's, in the pool": (64 << 10, 128 << 10),
             "receivers half the root's, straddling": (threshold + 16, threshold // 2 + 8),
             "receivers half the root's, in the pool": (128 << 10, 64 << 10)}
    results: dict[str, list] = {}
    for name, (root_nbytes, other_nbytes) in pairs.items():
        for fresh in (True, False):
            comm = cxlmpi.wrap(plain.Dup())
            ref = plain.Dup()
            for c in (comm, ref):
                c.Set_errhandler(MPI.ERRORS_RETURN)
            if not fresh:   # the pool set up by a call all agree on
                a = np.ones(threshold)
                comm.Bcast(a, 0)
            got = outcome(comm, root_nbytes, other_nbytes)
            want = outcome(ref, root_nbytes, other_nbytes)
            # the communicators still work, and still agree
            a = np.full(threshold + 8, r, np.uint8)
            b, c = a.copy(), a.copy()
            comm.Bcast(b, 0)
            ref.Bcast(c, 0)
            results[f"{name}, {'fresh' if fresh else 'pool set up'}"] = [
                got[0], want[0], got[1] == want[1], bool(np.array_equal(b, c))]
            comm.Free()
            ref.Free()
    # Bcast_init straddling the posted calls' threshold on a fresh
    # communicator: the receivers' plan would take the pool, the root's MPI
    # (before, the receivers waited in the set-up the init ran for them)
    floor = config.get().nonblocking_threshold
    for name, (root_nbytes, other_nbytes) in {
            "Bcast_init, receivers twice the root's": (floor // 2 + 8, floor + 16),
            "Bcast_init, receivers half the root's": (floor + 16, floor // 2 + 8)}.items():
        comm, ref = cxlmpi.wrap(plain.Dup()), plain.Dup()
        for c in (comm, ref):
            c.Set_errhandler(MPI.ERRORS_RETURN)
        got = outcome(comm, root_nbytes, other_nbytes, persistent=True)
        want = outcome(ref, root_nbytes, other_nbytes, persistent=True)
        a = np.full(floor + 8, r, np.uint8)
        b, c = a.copy(), a.copy()
        comm.Bcast(b, 0)
        ref.Bcast(c, 0)
        results[f"{name}, fresh"] = [got[0], want[0], got[1] == want[1],
                                     bool(np.array_equal(b, c))]
        comm.Free()
        ref.Free()
    everyone = plain.gather(results, root=0)
    if r == 0:
        merged = {k: [res[k] for res in everyone] for k in results}
        sys.stdout.write("RESULT " + json.dumps(merged) + "\n")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
