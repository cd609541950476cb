"""What a rank can see of its pool segment once the pool is set up
(tests/test_reliability.py).

    segment.py [COUNT]

Runs one large Allreduce on a wrapped dup of COMM_WORLD (COUNT float64
elements, compared with stock MPI on the same handle), then looks at its own
process: the names and sizes of its segments (from cxlmpi's state: the
communicator's pool, and the node heap it shares, with their inodes), every
line of /proc/self/maps that maps one of them (by inode: an unnamed segment
shows as ``/dev/shm/#INODE``), whether /dev/shm/<name> exists (os.stat), and each
mapped file's mode and owner through /proc/self/map_files when this process
may read it.  Rank 0 prints ``SEGMENT <json>``, one report per rank.
"""

from __future__ import annotations

import json
import os
import sys

import numpy as np
from mpi4py import MPI

import cxlmpi
from cxlmpi.pools.state import _states


def say(line: str) -> None:
    """Print `line` in one write: ranks' lines never interleave."""
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def pool_mappings(inodes: set[int]) -> list[dict]:
    """This process's mappings of the files `inodes`, from /proc/self/maps."""
    found = []
    with open("/proc/self/maps") as f:
        for line in f:
            fields = line.split(maxsplit=5)
            if len(fields) < 6 or int(fields[4]) not in inodes:
                continue
            start, end = (int(x, 16) for x in fields[0].split("-"))
            found.append({"range": fields[0], "nbytes": end - start, "perms": fields[1],
                          "inode": int(fields[4]), "path": fields[5].rstrip("\n")})
    return found


def mapped_file_mode(address_range: str) -> dict:
    """Mode and owner of the file behind a mapping (/proc/self/map_files:
    readable with CAP_SYS_ADMIN only, so possibly unknown)."""
    try:
        st = os.stat(f"/proc/self/map_files/{address_range}")
    except OSError as exc:
        return {"mode": None, "uid": None, "why": f"{type(exc).__name__}: {exc}"}
    return {"mode": st.st_mode & 0o7777, "uid": st.st_uid, "why": None}


def main() -> None:
    count = int(sys.argv[1]) if len(sys.argv) > 1 else 1 << 17
    world = MPI.COMM_WORLD
    comm = cxlmpi.wrap(world.Dup())
    plain = MPI.Intracomm(comm)
    rank = comm.Get_rank()
    data = np.random.default_rng([3, rank]).standard_normal(count)
    got, want = np.empty(count), np.empty(count)
    comm.Allreduce(data, got)
    plain.Allreduce(data, want)

    state = _states.get(comm.handle)
    pools = [] if state is None or state.pool is None else [state.pool, state.pool.heap]
    segments = [{"name": p.name, "nbytes": p.total_nbytes, "arena": p.arena_nbytes(),
                 "exists": os.path.exists(f"/dev/shm{p.name}"),
                 "inode": os.fstat(p.fd).st_ino}
                for p in dict.fromkeys(pools)]
    maps = pool_mappings({seg["inode"] for seg in segments})
    report = {
        "rank": rank,
        "uid": os.getuid(),
        "allreduce_close": bool(np.allclose(got, want, rtol=1e-12, atol=1e-12)),
        "pool_calls": cxlmpi.stats()["allreduce"]["pool_calls"],
        "segments": segments,
        "maps": maps,
        "files": [mapped_file_mode(m["range"]) for m in maps],
    }
    everyone = world.gather(report, root=0)
    comm.Free()
    if rank == 0:
        say("SEGMENT " + json.dumps(everyone))


if __name__ == "__main__":
    main()
