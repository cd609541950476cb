"""Who lives: how one process tells whether another that shares pool memory
with it is alive, without trusting anything that means nothing where it
looks.

Three witnesses, from the strongest:

- a lock the kernel holds for the owner (same kernel: this host, any pid
  namespace).  Every process that maps a partition or a pool segment holds
  an open-file-description lock (F_OFD_SETLK) on one byte of the backing
  file named for it (its control line, its table entry); the kernel drops
  it when the process's last descriptor of that file goes -- at exit, at
  kill -9, in whatever container -- and keeps it while the process is
  stopped (SIGSTOP, docker pause, a debugger).  F_OFD_GETLK tells held from
  free with no clock: a process that only stood still is never "dead".
- its pid and start time (same pid namespace);
- its heartbeat (another host: a counter its beat thread advances, judged
  by this process's own monotonic clock; see Watch).  A lease is the only
  witness there: a process stopped for longer than CXLMPI_LEASE_BEATS x
  CXLMPI_HEARTBEAT is judged gone, and finds out when it resumes (the
  partition's token, checked around each collective, cxlmpi._pool).

HOST, this process's identity in control lines and table entries, says
which witnesses apply: its high 32 bits name the kernel (this boot of this
host), its low 32 bits the pid namespace (the namespace's inode number).
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import secrets
import stat
import struct
import time
from pathlib import Path

from .. import config

__all__ = ["ALIVE", "DEAD", "UNKNOWN", "HOST", "Watch", "same_kernel", "hold",
           "drop", "lock_verdict", "pid_verdict", "start_time"]

ALIVE, DEAD, UNKNOWN = "alive", "dead", "unknown"

# fcntl's open-file-description locks (Linux >= 3.15; Python >= 3.9 names them)
F_OFD_GETLK = getattr(fcntl, "F_OFD_GETLK", 36)
F_OFD_SETLK = getattr(fcntl, "F_OFD_SETLK", 37)
_FLOCK = "hhqqi4x"     # struct flock: type, whence, start, len, pid (x86-64, aarch64)


def _host_id() -> int:
    """Where a pid or a lock means something: the kernel (this boot of this
    host: the high 32 bits) and the pid namespace (its inode number: the
    low 32 bits; containers on one host share the kernel but not their
    pids).  Where /proc does not show this namespace's pids (a pid
    namespace without its own /proc), no pid can be looked up: the low
    bits are this process's alone, and its peers on this kernel judge it by
    its locks."""
    try:
        boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
        kernel = int.from_bytes(hashlib.blake2b(boot.encode(), digest_size=4).digest(),
                                "little")
    except OSError:
        # (not the host name: two hosts of one name would trust locks they
        # cannot see) this process's alone: peers judge it by heartbeat
        kernel = secrets.randbits(32)
    try:
        ns = os.stat("/proc/self/ns/pid").st_ino & 0xFFFFFFFF
        if os.readlink("/proc/self") != str(os.getpid()):
            raise OSError("/proc is another pid namespace's")
    except OSError:
        ns = secrets.randbits(32)
    return (kernel << 32 | ns) or 1


def same_kernel(host: int, other: int) -> bool:
    """Whether identities `host` and `other` (HOST values) are of one kernel:
    a lock taken by one is seen by the other."""
    return host >> 32 == other >> 32


def start_time(pid: int) -> int:
    """Start time of process `pid` in clock ticks: 0 if it is gone (or a
    zombie), -1 if it lives but /proc does not say (hidepid, another
    user's process): tells a live process from a later one that reused its
    pid."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return 0
    except PermissionError:
        pass
    except OSError:
        return -1
    try:
        stat_line = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return 0
    except OSError:
        return -1
    fields = stat_line[stat_line.rindex(")") + 2:].split()
    if fields[0] in ("Z", "X"):
        return 0
    return int(fields[19])


HOST = _host_id()


def pid_verdict(pid: int, start: int | None) -> str:
    """Liveness of a process of this host and pid namespace: its pid, and
    where known its start time (a reused pid is another process); a pid
    that exists but cannot be looked into is not judged dead."""
    if pid <= 0:
        return DEAD
    now = start_time(pid)
    if now == 0:
        return DEAD
    if now < 0:
        return UNKNOWN
    return ALIVE if start is None or start <= 0 or now == start else DEAD


def hold(fd: int, at: int) -> None:
    """Take a shared lock of byte `at` of the file open as `fd` for this
    open file description (OSError where the file takes none)."""
    fcntl.fcntl(fd, F_OFD_SETLK, struct.pack(_FLOCK, fcntl.F_RDLCK, os.SEEK_SET, at, 1, 0))


def drop(fd: int, at: int) -> None:
    """Let go of the lock of byte `at` that `hold` took (none: no-op)."""
    try:
        fcntl.fcntl(fd, F_OFD_SETLK, struct.pack(_FLOCK, fcntl.F_UNLCK, os.SEEK_SET, at, 1, 0))
    except OSError:
        pass


def lock_verdict(fd: int, at: int) -> str:
    """ALIVE when some other open file description of the file open as `fd`
    (another process's, on this kernel) locks byte `at`, DEAD when none
    does, UNKNOWN when the kernel cannot say -- and when none does but the
    file is a device: each of its nodes is an inode of its own (containers
    given a devdax device by `--device` each have their own node), and a
    lock taken through another node is not seen through this one."""
    probe = struct.pack(_FLOCK, fcntl.F_WRLCK, os.SEEK_SET, at, 1, 0)
    try:
        kind = struct.unpack(_FLOCK, fcntl.fcntl(fd, F_OFD_GETLK, probe))[0]
        regular = stat.S_ISREG(os.fstat(fd).st_mode)
    except OSError:
        return UNKNOWN
    if kind != fcntl.F_UNLCK:
        return ALIVE
    return DEAD if regular else UNKNOWN


def verdict(host: int, pid: int, start: int, lock: tuple[int, int], watch: Watch,
            key: tuple, beat: int, period_ns: int) -> str:
    """Liveness of the process that wrote identity `host`: by `pid` and
    `start` in this pid namespace; by the lock (fd, byte) it holds on this
    kernel; else by its heartbeat `beat` (period `period_ns`), watched
    under `key`."""
    if host == HOST:
        return pid_verdict(pid, start)
    if same_kernel(host, HOST):
        seen = lock_verdict(*lock)
        if seen != UNKNOWN:
            return seen
    return watch.verdict(key, beat, period_ns)


class Watch:
    """Heartbeats as this process has seen them: a counter that has not
    moved, by this process's monotonic clock, for its owner's period times
    CXLMPI_LEASE_BEATS belongs to a process that is gone."""

    def __init__(self) -> None:
        self._seen: dict[tuple, tuple[int, float]] = {}
        self.longest_lease_s = 0.0   # of the counters not yet judged

    def verdict(self, key: tuple, beat: int, period_ns: int) -> str:
        """ALIVE (it moved since last looked at), DEAD (still for its
        lease) or UNKNOWN (first look, or not still for long enough; a
        counter without a period cannot be judged)."""
        if period_ns <= 0:
            return UNKNOWN
        now = time.monotonic()
        lease = period_ns * 1e-9 * config.get().lease_beats
        before = self._seen.get(key)
        if before is None or before[0] != beat:
            self._seen[key] = (beat, now)
            if before is None:
                self.longest_lease_s = max(self.longest_lease_s, lease)
                return UNKNOWN
            return ALIVE
        if now - before[1] > lease:
            return DEAD
        self.longest_lease_s = max(self.longest_lease_s, lease - (now - before[1]))
        return UNKNOWN

    def wait(self) -> None:
        """Sleep until every counter first seen can be judged."""
        time.sleep(min(self.longest_lease_s, 600.0) + 0.05)
        self.longest_lease_s = 0.0
