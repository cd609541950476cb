"""A partition table (`Device`): one open pool file or devdax device, shared
by every job that names it, cut into partitions that pools claim and
release; who lives is judged as cxlmpi.memory.liveness tells (see cxlmpi.memory.backends,
which opens the devices, for the whole picture)."""

from __future__ import annotations

import ctypes
import errno
import mmap
import os
import secrets
import socket
import struct
import threading
import time
import weakref

from .. import _pool, config
from ..errors import CXLMPIPoolError
from ..spec import PoolSpec
from .liveness import (
    ALIVE,
    DEAD,
    HOST,
    UNKNOWN,
    Watch,
    drop,
    hold,
    start_time,
    verdict,
)
from .table_lock import LINE, LOCK_AT, TableLock

__all__ = ["Device", "NO_ROOM", "TABLE_NBYTES", "round_up", "libc"]

TABLE_MAGIC = 0x3130544150495843  # "CXIPAT01" little-endian
TABLE_VERSION = 3                # 2: heartbeats; 3: owners on one kernel hold locks
TABLE_NBYTES = 64 * 1024        # the table; partitions start after it, aligned
NENTRIES = 255
ENTRIES_AT = 2 * LINE


FREE, CLAIMED, RELEASED = 0, 1, 2
STATE_NAMES = {FREE: "free", CLAIMED: "claimed", RELEASED: "released"}
# Where a partition's control lines are, and the words read from them: the
# layout pyx/cxl_layout.h declares (cxlmpi._pool.LAYOUT).
CTRL_AT = _pool.LAYOUT["header_nbytes"]
CTRL_LINE = _pool.LAYOUT["ctrl_nbytes"]
CTRL_PID = _pool.LAYOUT["ctrl_pid"] // 8
CTRL_HOST = _pool.LAYOUT["ctrl_host"] // 8
CTRL_ATTACHED = _pool.LAYOUT["ctrl_attached"] // 8
CTRL_BEAT = _pool.LAYOUT["ctrl_beat"] // 8
CTRL_PERIOD = _pool.LAYOUT["ctrl_beat_period"] // 8
CTRL_START = _pool.LAYOUT["ctrl_start"] // 8
HEADER_TOKEN = _pool.LAYOUT["header_token"]

# Entry words: state, token, offset, nbytes, host, pid, pid start time,
# claimed time (ns, for people), uid, nranks, the host name (32 bytes), the
# leader's heartbeat and its period (ns).
E_STATE, E_TOKEN, E_OFFSET, E_NBYTES, E_HOST, E_PID, E_START, E_TIME, E_UID, \
    E_NRANKS, E_NAME = range(11)
E_BEAT, E_PERIOD = 14, 15
E_WORDS = 16

#: The words of the error a claim raises when the device has no room left
#: (cxlmpi.pools.state then leaves the communicator with MPI, with one warning).
NO_ROOM = "no room for a"


# --------------------------------------------------------- host and process

_pool.set_host(HOST, max(0, start_time(os.getpid())))
config.on_change(lambda cfg: _pool.set_heartbeat(cfg.heartbeat, cfg.lease_beats))


# ------------------------------------------------------------ the device


class Device(TableLock):
    """One open pool file or devdax device and its partition table, shared
    by every pool of this process on it."""

    def __init__(self, spec: PoolSpec, fd: int, capacity: int, align: int) -> None:
        self.spec = spec
        self.fd = fd
        self.capacity = capacity
        self.align = align
        self.table_nbytes = round_up(TABLE_NBYTES, align)
        # (reserved before it is touched: on a full tmpfs, a page faulted in
        # that the tmpfs cannot give is a SIGBUS)
        err = _pool.reserve(fd, 0, self.table_nbytes) if spec.kind == "file" else 0
        if err:
            raise CXLMPIPoolError(f"{spec}: {_pool.NO_SPACE} for its partition table "
                                  f"({self.table_nbytes} bytes): {os.strerror(err)}")
        self._map = mmap.mmap(fd, self.table_nbytes, mmap.MAP_SHARED,
                              mmap.PROT_READ | mmap.PROT_WRITE, offset=0)
        self._words = memoryview(self._map).cast("Q")
        self._address = ctypes.addressof(ctypes.c_char.from_buffer(self._map))
        # No word of the table may still beat once it is unmapped (closed,
        # collected, or torn down at exit): the beat thread would fault.
        self._stop_beats = weakref.finalize(self, _pool.beat_remove_range,
                                            self._address, self.table_nbytes)
        self._thread_lock = threading.RLock()
        self._lock_depth = 0               # nesting of locked() in the holding thread
        self.claims: dict[int, int] = {}   # entry -> token, claimed here
        self.fischer_retries = 0           # late writes that backed off
        self.pid = os.getpid()             # a forked child releases nothing

    # Table words, always written back / re-read from memory.
    def _load(self, word: int, n: int = 1) -> list[int]:
        _pool.flush(self._address + 8 * word, 8 * n, True)
        return list(self._words[word:word + n])

    def _store(self, word: int, values: list[int]) -> None:
        self._words[word:word + len(values)] = memoryview(
            struct.pack(f"<{len(values)}Q", *values)).cast("Q")
        _pool.flush(self._address + 8 * word, 8 * len(values), False)

    @staticmethod
    def _entry_word(index: int) -> int:
        return (ENTRIES_AT + index * LINE) // 8

    # --------------------------------------------------------------- format
    def header(self) -> dict:
        magic, version, nentries, capacity, align, data_at = self._load(0, 6)
        uuid = self._load(6, 2)
        return {"magic": magic, "version": version, "nentries": nentries,
                "capacity": capacity, "align": align, "data_offset": data_at,
                "uuid": f"{uuid[0]:016x}{uuid[1]:016x}"}

    def check_header(self, format_if_empty: bool) -> None:
        """Raise unless offset 0 holds a table of this version (formatting a
        device that is all zeros there when `format_if_empty`).  Whatever
        is not a ready table is looked at again under the lock: several
        jobs may meet a new pool file at once, one of them formatting it."""
        if self._table_error(format_if_empty=False) is None:
            return
        with self.locked():
            problem = self._table_error(format_if_empty)
            if problem == "empty":
                self._format()
            elif problem is not None:
                raise CXLMPIPoolError(problem)

    def _table_error(self, format_if_empty: bool) -> str | None:
        """None (a table of this version, this geometry), "empty" (all
        zeros but the lock line, and `format_if_empty`), or what is wrong."""
        h = self.header()
        if h["magic"] == TABLE_MAGIC and h["version"] == TABLE_VERSION:
            if h["capacity"] != self.capacity or h["align"] != self.align:
                return (f"{self.spec}: the partition table describes {h['capacity']} bytes "
                        f"aligned to {h['align']}, the device has {self.capacity} aligned "
                        f"to {self.align}; reformat with `python -m cxlmpi --pool "
                        f"{self.spec} --pool-reset all` once no job uses it")
            return None
        if h["magic"] == TABLE_MAGIC:
            return (f"{self.spec}: partition table version {h['version']} was written by "
                    f"another cxlmpi version (this one reads {TABLE_VERSION}); let the jobs "
                    f"of that version finish, then `python -m cxlmpi --pool {self.spec} "
                    f"--pool-reset all`")
        words = self._load(0, TABLE_NBYTES // 8)
        lock = slice(LOCK_AT // 8, (LOCK_AT + LINE) // 8)
        del words[lock]     # (the lock line is busy while anyone formats)
        if any(words) or not format_if_empty:
            return (f"{self.spec}: offset 0 does not hold a cxlmpi partition table; "
                    f"refusing to overwrite what is there.  If nothing else uses this "
                    f"memory: `python -m cxlmpi --pool {self.spec} --pool-reset all`")
        return "empty"

    def _format(self) -> None:
        """Write an empty table (under the lock)."""
        for i in range(NENTRIES):
            self._store(self._entry_word(i), [0] * E_WORDS)
        uuid = [secrets.randbits(64), secrets.randbits(64)]
        self._store(1, [TABLE_VERSION, NENTRIES, self.capacity, self.align,
                        self.table_nbytes, *uuid])
        self._store(0, [TABLE_MAGIC])

    @property
    def wipes(self) -> bool:
        """Whether memory of a new partition may still hold an earlier
        job's data: a devdax device (nothing to hole-punch), or a file on a
        filesystem not known to punch holes, where freed partitions keep
        their bytes."""
        return self.spec.kind == "dax" or not _punches_holes(self.fd)

    @property
    def identity(self) -> str:
        """What ranks that map this same memory have in common (and ranks
        that map another copy of a same-named file do not)."""
        return f"{self.spec.kind}:{self.header()['uuid']}"


    # ----------------------------------------------------------- partitions
    def entries(self, watch: Watch | None = None) -> list[dict]:
        """The table, one dict per entry in use; `liveness` of its job:
        alive, dead or unknown (another host's job, when `watch` has not
        seen its heartbeats for long enough)."""
        out = []
        for i in range(NENTRIES):
            w = self._load(self._entry_word(i), E_WORDS)
            if w[E_STATE] == FREE:
                continue
            name = struct.pack("<4Q", *w[E_NAME:E_NAME + 4]).rstrip(b"\0").decode(
                "utf-8", "replace")
            liveness = self._liveness(i, w, watch or Watch())
            out.append({"index": i, "state": STATE_NAMES.get(w[E_STATE], "?"),
                        "token": w[E_TOKEN], "offset": w[E_OFFSET], "nbytes": w[E_NBYTES],
                        "host": name, "this_host": w[E_HOST] == HOST, "pid": w[E_PID],
                        "start": w[E_START], "since_ns": w[E_TIME], "uid": w[E_UID],
                        "nranks": w[E_NRANKS], "liveness": liveness,
                        "stale": liveness == DEAD})
        return out

    def _liveness(self, index: int, w: list[int], watch: Watch) -> str:
        """DEAD when nobody uses the partition of entry `w` any more: its
        leader is gone (or released it) and no rank is still attached;
        ALIVE when one is shown to live; UNKNOWN otherwise (never
        reclaimed)."""
        if w[E_STATE] == FREE:
            return DEAD
        verdicts = []
        if w[E_STATE] == CLAIMED:
            verdicts.append(verdict(w[E_HOST], w[E_PID], w[E_START],
                                    (self.fd, 8 * self._entry_word(index)), watch,
                                    ("entry", index, w[E_TOKEN]), w[E_BEAT], w[E_PERIOD]))
            if verdicts[0] == ALIVE:
                return ALIVE
        verdicts += self._rank_verdicts(w, watch)
        if ALIVE in verdicts:
            return ALIVE
        return UNKNOWN if UNKNOWN in verdicts else DEAD

    def _rank_verdicts(self, w: list[int], watch: Watch) -> list[str]:
        """The liveness of each rank whose control line in the partition of
        entry `w` says it still maps it."""
        offset = w[E_OFFSET]
        lines = self._control_lines(offset, w[E_NRANKS])
        if lines is None:
            return [UNKNOWN]          # cannot look: never judged gone
        out = []
        for r, words in enumerate(lines):
            if not words[CTRL_ATTACHED]:
                continue
            out.append(verdict(words[CTRL_HOST], words[CTRL_PID], words[CTRL_START],
                               (self.fd, offset + CTRL_AT + r * CTRL_LINE), watch,
                               ("rank", offset, w[E_TOKEN], r),
                               words[CTRL_BEAT], words[CTRL_PERIOD]))
        return out

    def attached_ranks(self, offset: int, nranks: int) -> list[int]:
        """The ranks whose control line in the partition at `offset` says
        they still map it, alive or not."""
        return [r for r, words in enumerate(self._control_lines(offset, nranks) or [])
                if words[CTRL_ATTACHED]]

    def _control_lines(self, offset: int, nranks: int) -> list[tuple[int, ...]] | None:
        """The words of the control lines of the partition at `offset`,
        re-read from memory (None where they cannot be mapped)."""
        length = round_up(CTRL_AT + nranks * CTRL_LINE, self.align)
        if self._never_written(offset + CTRL_AT, nranks * CTRL_LINE):
            return [(0,) * (CTRL_LINE // 8)] * nranks
        try:
            m = mmap.mmap(self.fd, length, mmap.MAP_SHARED,
                          mmap.PROT_READ | mmap.PROT_WRITE, offset=offset)
        except (OSError, ValueError):
            return None
        try:
            _pool.flush(ctypes.addressof(ctypes.c_char.from_buffer(m, CTRL_AT)),
                        nranks * CTRL_LINE, True)
            return [struct.unpack_from(f"<{CTRL_LINE // 8}Q", m, CTRL_AT + r * CTRL_LINE)
                    for r in range(nranks)]
        finally:
            m.close()

    def _never_written(self, at: int, nbytes: int) -> bool:
        """Whether bytes [at, at + nbytes) of a pool file hold no data (a
        hole: a partition whose memory could not be reserved, or one freed):
        they read as zeros, and must not be read through a mapping, where
        on a full tmpfs the page a read faults in cannot be had and the
        process dies of SIGBUS."""
        if self.spec.kind != "file":
            return False
        try:
            return os.lseek(self.fd, at, os.SEEK_DATA) >= at + nbytes
        except OSError as exc:
            return exc.errno == errno.ENXIO          # no data from `at` on

    def claim(self, nbytes: int, nranks: int) -> tuple[int, int, int, int]:
        """Claim a partition of at least `nbytes` for a pool of `nranks`:
        (entry, token, offset, length).  Partitions whose jobs are shown
        gone are reclaimed; when there is no room otherwise, the heartbeats
        of other hosts' jobs are watched for their lease first."""
        length = round_up(nbytes, self.align)
        watch = Watch()
        for attempt in (0, 1):
            with self.locked():
                if not self._has_table():
                    raise CXLMPIPoolError(f"{self.spec}: no partition table "
                                          f"(check_header first)")
                found, used = self._place(length, watch)
                if found is not None:
                    entry, offset = found
                    token = secrets.randbits(63) | 1
                    pid = os.getpid()
                    name = socket.gethostname().encode()[:32].ljust(32, b"\0")
                    word = self._entry_word(entry)
                    self._hold(entry)
                    self._store(word + 1, [token, offset, length, HOST, pid,
                                           start_time(pid), time.time_ns(), os.getuid(),
                                           nranks, *struct.unpack("<4Q", name), 0,
                                           _pool.heartbeat()[0]])
                    try:
                        _pool.beat_add(self._address + 8 * (word + E_BEAT),
                                       self._address + 8 * (word + E_TOKEN), token)
                    except BaseException:
                        self._store(word, [FREE, 0])
                        drop(self.fd, 8 * word)
                        raise
                    self._store(word, [CLAIMED])
                    self.claims[entry] = token
                    return entry, token, offset, length
            if attempt == 0 and watch.longest_lease_s:
                watch.wait()      # (not holding the lock)
        in_use = sum(b - a for a, b in used)
        raise CXLMPIPoolError(
            f"{self.spec}: {NO_ROOM} {length >> 20} MiB partition "
            f"({len(used)} partitions, {in_use >> 20} MiB of "
            f"{(self.capacity - self.table_nbytes) >> 20} MiB in use); lower "
            f"CXLMPI_POOL_SIZE, free communicators, or `python -m cxlmpi "
            f"--pool {self.spec} --pool-status` to see who holds it")

    def _place(self, length: int, watch: Watch
               ) -> tuple[tuple[int, int] | None, list[tuple[int, int]]]:
        """(free entry, offset) for a partition of `length` (under the
        lock), freeing entries whose jobs are shown gone -- None: no room --
        and the byte ranges in use."""
        used = []
        free_entry = None
        for i in range(NENTRIES):
            w = self._load(self._entry_word(i), E_WORDS)
            if w[E_STATE] != FREE and self._liveness(i, w, watch) == DEAD:
                self._free_entry(i, w[E_OFFSET], w[E_NBYTES])
                w[E_STATE] = FREE
            if w[E_STATE] == FREE:
                free_entry = i if free_entry is None else free_entry
            else:
                used.append((w[E_OFFSET], w[E_OFFSET] + w[E_NBYTES]))
        offset = self._first_fit(sorted(used), length)
        if offset is None or free_entry is None:
            return None, used
        return (free_entry, offset), used

    def _first_fit(self, used: list[tuple[int, int]], length: int) -> int | None:
        at = self.table_nbytes
        for lo, hi in used:
            if lo - at >= length:
                return at
            at = max(at, hi)
        return at if self.capacity - at >= length else None

    def release(self, entry: int, token: int) -> None:
        """This rank is done with partition `entry` (token `token`).  Its
        leader marks it released; whoever finds no rank still attached to a
        released partition frees it (the last one out, or the next claim)."""
        if os.getpid() != self.pid:
            return  # a child made by fork(): the partition is its parent's
        leader = self.claims.pop(entry, None) == token
        word = self._entry_word(entry)
        if leader:
            _pool.beat_remove(self._address + 8 * (word + E_BEAT))
            drop(self.fd, 8 * word)
        with self.locked():
            w = self._load(word, E_WORDS)
            if w[E_TOKEN] != token or w[E_STATE] == FREE:
                return  # reset by an operator meanwhile: not ours any more
            if leader and w[E_STATE] == CLAIMED:
                self._store(word, [RELEASED])
                w[E_STATE] = RELEASED
            if w[E_STATE] == RELEASED and self._liveness(entry, w, Watch()) == DEAD:
                self._free_entry(entry, w[E_OFFSET], w[E_NBYTES])

    def _hold(self, entry: int) -> None:
        """Lock entry `entry`'s byte for this process (cxlmpi.memory.liveness)."""
        try:
            hold(self.fd, 8 * self._entry_word(entry))
        except OSError as exc:
            raise CXLMPIPoolError(
                f"{self.spec}: cannot lock a byte of it ({exc.strerror}): jobs on this "
                f"host tell live partitions from stale ones by such locks; put the pool "
                f"file on a file system that takes fcntl locks (tmpfs, ext4, xfs)") from None

    def _revoke(self, offset: int) -> None:
        """Wipe the token in the header of the partition at `offset` before
        it is freed: a job judged gone that only stood still (another host's,
        past its lease) finds at its next step that the memory is no longer
        its own (where holes are punched, the hole does the same)."""
        if self._never_written(offset, HEADER_TOKEN + 8):
            return
        try:
            m = mmap.mmap(self.fd, self.align, mmap.MAP_SHARED,
                          mmap.PROT_READ | mmap.PROT_WRITE, offset=offset)
        except (OSError, ValueError):
            return
        try:
            m[HEADER_TOKEN:HEADER_TOKEN + 8] = bytes(8)
            _pool.flush(ctypes.addressof(ctypes.c_char.from_buffer(m, HEADER_TOKEN)), 8, False)
        finally:
            m.close()

    def _free_entry(self, entry: int, offset: int, nbytes: int) -> None:
        self._revoke(offset)
        self._store(self._entry_word(entry), [FREE, 0])
        if self.spec.kind == "file":  # give tmpfs / page-cache memory back
            _punch_hole(self.fd, offset, nbytes)

    def reset(self, everything: bool) -> list[int]:
        """Free the partitions whose jobs are shown gone, watching other
        hosts' heartbeats for their lease (every partition, and rewrite the
        table, with `everything`); the entries freed."""
        if everything:
            with self.locked():
                freed = [e["index"] for e in self.entries()] if self._has_table() else []
                self._format()
                if self.spec.kind == "file":
                    _punch_hole(self.fd, self.table_nbytes,
                                self.capacity - self.table_nbytes)
                return freed
        watch = Watch()
        self.entries(watch)                 # first looks at the heartbeats
        if watch.longest_lease_s:
            watch.wait()
        with self.locked():
            freed = []
            for e in self.entries(watch):
                if e["stale"]:
                    self._free_entry(e["index"], e["offset"], e["nbytes"])
                    freed.append(e["index"])
            return freed

    def _has_table(self) -> bool:
        h = self.header()
        return h["magic"] == TABLE_MAGIC and h["version"] == TABLE_VERSION

    def close(self) -> None:
        for entry in self.claims:
            _pool.beat_remove(self._address + 8 * (self._entry_word(entry) + E_BEAT))
            drop(self.fd, 8 * self._entry_word(entry))
        self.claims.clear()
        self._stop_beats()
        self._words.release()
        self._map.close()
        os.close(self.fd)


def round_up(n: int, align: int) -> int:
    return (n + align - 1) // align * align


libc = ctypes.CDLL(None, use_errno=True)
_FALLOC_FL_KEEP_SIZE, _FALLOC_FL_PUNCH_HOLE = 1, 2


# Filesystems whose fallocate(PUNCH_HOLE) frees a partition's pages (what
# is read afterwards is zeros): tmpfs, hugetlbfs, ext4, xfs, btrfs.
_PUNCHING_FS = {0x01021994, 0x958458F6, 0xEF53, 0x58465342, 0x9123683E}


def _punches_holes(fd: int) -> bool:
    buf = ctypes.create_string_buffer(120)
    if libc.fstatfs(fd, buf) != 0:
        return False
    return struct.unpack_from("<q", buf, 0)[0] in _PUNCHING_FS


def _punch_hole(fd: int, offset: int, nbytes: int) -> None:
    """Give the pages of a freed partition back (tmpfs, page cache);
    harmless where the filesystem cannot."""
    libc.fallocate(fd, _FALLOC_FL_KEEP_SIZE | _FALLOC_FL_PUNCH_HOLE,
                    ctypes.c_long(offset), ctypes.c_long(nbytes))


