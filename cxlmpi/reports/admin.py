"""Pool administration: what a pool file or device holds, and giving back
what dead jobs left in it (``python -m cxlmpi --pool-status / --pool-reset``).

Only file: and dax: pools have something to administer: a partition table
that outlives the jobs.  shm and numa pools are private segments without
names (or whose names are unlinked as soon as every rank has mapped them):
nothing is left behind.
"""

from __future__ import annotations

import os
import sys
import time

from .. import config
from ..errors import CXLMPIError
from ..memory import backends

__all__ = ["status", "reset", "describe"]


def status() -> int:
    """Print the partition table of the pool of CXLMPI_POOL (one row per
    partition in use: state, place, ranks, host, pid, age, whether its job
    lives: alive, dead (stale: the next claim reclaims it) or unknown --
    another host's job, judged by `--pool-reset` after watching its
    heartbeat); returns
    the exit status (0, 1 unreadable, 2 no table)."""
    spec = _shared_spec()
    if spec is None:
        return 2
    try:
        dev = backends.open_device(spec)
        dev.check_header(format_if_empty=False)
    except CXLMPIError as exc:
        _error(str(exc))
        return 1
    h = dev.header()
    entries = dev.entries()
    print(f"{spec}: {h['capacity']} bytes, alignment {h['align']}, table v{h['version']}, "
          f"id {h['uuid']}, {len(entries)} partition(s) in use")
    if entries:
        print(f"{'#':>3} {'state':<9} {'offset':>12} {'bytes':>12} {'ranks':>5} "
              f"{'host':<16} {'pid':>8} {'age s':>8}  job")
    now = time.time_ns()
    for e in entries:
        host = e["host"] + ("" if e["this_host"] else " (other)")
        print(f"{e['index']:>3} {e['state']:<9} {e['offset']:>12} {e['nbytes']:>12} "
              f"{e['nranks']:>5} {host:<16} {e['pid']:>8} "
              f"{(now - e['since_ns']) / 1e9:>8.0f}  {e['liveness']}")
    return 0


def reset(everything: bool = False) -> int:
    """Free the partitions of the pool of CXLMPI_POOL whose jobs are gone
    (everything: every partition, and write a new table - only when no job
    uses the pool); returns the exit status (0, 1 failed, 2 no table)."""
    spec = _shared_spec()
    if spec is None:
        return 2
    try:
        freed = backends.open_device(spec).reset(everything)
    except CXLMPIError as exc:
        _error(str(exc))
        return 1
    what = "rewrote the table; " if everything else ""
    print(f"{spec}: {what}freed {len(freed)} partition(s)" + (f": {freed}" if freed else ""))
    return 0


def describe(pool: str) -> str:
    """Where CXLMPI_POOL=`pool` puts pools, in one line (for --info); never
    creates anything."""
    spec = backends.parse_spec(pool)
    if spec.kind == "shm":
        return "POSIX shared memory (/dev/shm), one private segment per pool"
    if spec.kind == "numa":
        try:
            backends.numa_check(spec.node)
        except CXLMPIError as exc:
            return f"unusable: {exc}"
        return f"POSIX shared memory bound to NUMA node {spec.node}"
    if spec.kind == "file" and not os.path.exists(spec.path):
        return (f"{spec.path} (does not exist yet: the first job creates it, "
                f"{backends.NEW_FILE_NBYTES >> 30} GiB sparse, mode 0600)")
    try:
        dev = backends.open_device(spec)
        dev.check_header(format_if_empty=False)
    except CXLMPIError as exc:
        return f"{spec.path}: {exc}"
    return (f"{spec.path}: {dev.capacity} bytes, alignment {dev.align}, "
            f"{len(dev.entries())} partition(s) in use (--pool-status)")


def _shared_spec() -> backends.PoolSpec | None:
    """The spec of CXLMPI_POOL if it names a pool with a partition table;
    None (said on stderr) otherwise."""
    spec = backends.parse_spec(config.get().pool)
    if spec.shared_file:
        return spec
    _error(f"CXLMPI_POOL={spec} has no partition table (shm and numa pools are "
           f"private segments, gone with their job); name a pool with --pool "
           f"file:PATH or dax:DEVICE")
    return None


def _error(text: str) -> None:
    sys.stderr.write(f"python -m cxlmpi: {text}\n")
