"""Where pools live: the backends behind CXLMPI_POOL, and the partition table
that lets several jobs share one CXL device or pool file.

    shm            POSIX shared memory, one private segment per pool (default)
    numa:N         the same, with its pages bound to NUMA node N (a CXL
                   memory expander in system-ram mode is a CPU-less node)
    file:PATH      a file on tmpfs, hugetlbfs or an fsdax mount, mapped
                   MAP_SHARED; created (sparse, 0600) when missing
    dax:/dev/daxX.Y  a devdax character device; size and alignment from sysfs

A file or device is shared by every job that names it, so it starts with a
partition table (PartitionTable): each pool claims a partition (an aligned
byte range) and releases it when the communicator is freed or the process
exits.  Claims need no atomic read-modify-write across hosts (CXL 2.0
multi-host sharing does not promise one): a table-wide lock is taken with
Fischer's timed protocol on plain stores (write your token, wait longer than
any writer can take, read it back), serialized within a host by a file lock.
Every table store is flushed and every load invalidated, since hosts may not
keep their caches coherent for each other.

A partition whose leader process is gone (same host) and whose ranks have
all detached or died is stale and reclaimed by the next claim;
`python -m cxlmpi --pool-status` shows the table, `--pool-reset` frees stale
partitions (or, with `all`, every partition).
"""

from __future__ import annotations

import atexit
import ctypes
import fcntl
import hashlib
import mmap
import os
import re
import secrets
import socket
import stat
import struct
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from . import _pool
from .errors import CXLMPIConfigError, CXLMPIPoolError

__all__ = ["PoolSpec", "parse_spec", "Device", "open_device", "dax_geometry",
           "numa_check", "sysfs_root"]

MIB = 1 << 20
DEFAULT_DAX_ALIGN = 2 * MIB
NEW_FILE_NBYTES = 64 << 30      # size of a pool file cxlmpi creates (sparse)
TABLE_MAGIC = 0x3130544150495843  # "CXIPAT01" little-endian
TABLE_VERSION = 1
TABLE_NBYTES = 64 * 1024        # the table; partitions start after it, aligned
NENTRIES = 255
LINE = 128                       # one writer per 128-byte line
LOCK_AT = LINE                   # lock line: token, host, pid, time_ns
ENTRIES_AT = 2 * LINE
FISCHER_DELAY_S = 0.005          # > the longest read-then-write of a claimer
LOCK_STALE_S = 10.0              # a lock held this long belongs to a dead claimer

FREE, CLAIMED, RELEASED = 0, 1, 2
STATE_NAMES = {FREE: "free", CLAIMED: "claimed", RELEASED: "released"}
# Where a partition's control lines are, and the words read from them: the
# layout pyx/cxl_layout.h declares (cxlmpi._pool.LAYOUT).
CTRL_AT = _pool.LAYOUT["header_nbytes"]
CTRL_LINE = _pool.LAYOUT["ctrl_nbytes"]
CTRL_PID = _pool.LAYOUT["ctrl_pid"] // 8
CTRL_HOST = _pool.LAYOUT["ctrl_host"] // 8
CTRL_ATTACHED = _pool.LAYOUT["ctrl_attached"] // 8

# Entry words: state, token, offset, nbytes, host, pid, pid start time,
# claimed time (ns), uid, nranks, then the host name (32 bytes).
E_STATE, E_TOKEN, E_OFFSET, E_NBYTES, E_HOST, E_PID, E_START, E_TIME, E_UID, \
    E_NRANKS, E_NAME = range(11)


@dataclass(frozen=True)
class PoolSpec:
    """A parsed CXLMPI_POOL: `kind` is shm, numa, file or dax."""

    kind: str
    path: str = ""
    node: int = -1

    def __str__(self) -> str:
        if self.kind == "shm":
            return "shm"
        if self.kind == "numa":
            return f"numa:{self.node}"
        return f"{self.kind}:{self.path}"

    @property
    def shared_file(self) -> bool:
        """Whether pools are partitions of one file or device."""
        return self.kind in ("file", "dax")


def parse_spec(text: str) -> PoolSpec:
    """PoolSpec from 'shm', 'numa:1', 'file:/dev/shm/pool', 'dax:/dev/dax0.0'."""
    s = text.strip()
    kind, _, arg = s.partition(":")
    if kind == "shm" and not arg:
        return PoolSpec("shm")
    if kind == "numa" and re.fullmatch(r"\d+", arg):
        return PoolSpec("numa", node=int(arg))
    if kind in ("file", "dax") and arg:
        return PoolSpec(kind, path=os.path.abspath(arg))
    raise ValueError(f"not a pool: {text!r} (use shm, numa:N, file:PATH or "
                     f"dax:/dev/daxX.Y)")


def sysfs_root() -> Path:
    """/sys, or the fixture tree named by CXLMPI_SYSFS (tests: it also lets
    a regular file stand in for a devdax device)."""
    return Path(os.environ.get("CXLMPI_SYSFS", "/sys"))


def _read_sysfs_int(path: Path) -> int:
    return int(path.read_text().strip(), 0)


def dax_geometry(device: str, root: Path | None = None) -> tuple[int, int]:
    """(size, alignment) of devdax `device` (/dev/daxX.Y) from sysfs;
    alignment 2 MiB where the kernel does not report one."""
    root = sysfs_root() if root is None else root
    name = os.path.basename(device)
    base = root / "bus" / "dax" / "devices" / name
    try:
        size = _read_sysfs_int(base / "size")
    except (OSError, ValueError) as exc:
        raise CXLMPIConfigError(
            f"CXLMPI_POOL=dax:{device}: cannot read its size from {base}/size "
            f"({exc}); is it a devdax device? (`daxctl list` shows them; "
            f"`daxctl reconfigure-device --mode=devdax {name}`)") from None
    try:
        align = _read_sysfs_int(base / "align")
    except FileNotFoundError:
        align = DEFAULT_DAX_ALIGN
    except (OSError, ValueError) as exc:
        raise CXLMPIConfigError(f"dax:{device}: unreadable {base}/align: {exc}") from None
    if align <= 0 or align & (align - 1) or align % mmap.PAGESIZE:
        raise CXLMPIConfigError(f"dax:{device}: alignment {align} from {base}/align "
                                f"is not a power-of-two multiple of the page size")
    if size < align:
        raise CXLMPIConfigError(f"dax:{device}: size {size} from sysfs is smaller "
                                f"than its alignment {align}")
    return size, align


def numa_check(node: int, root: Path | None = None) -> None:
    """Raise CXLMPIConfigError unless NUMA node `node` exists and has memory."""
    root = sysfs_root() if root is None else root
    nodes = root / "devices" / "system" / "node"
    if not (nodes / f"node{node}").is_dir():
        have = sorted(p.name for p in nodes.glob("node[0-9]*")) if nodes.is_dir() else []
        raise CXLMPIConfigError(
            f"CXLMPI_POOL=numa:{node}: this machine has no NUMA node {node} "
            f"(it has {', '.join(have) or 'none'}); a CXL expander in system-ram "
            f"mode appears as a CPU-less node (`daxctl reconfigure-device "
            f"--mode=system-ram`)")
    try:
        with_memory = _parse_list((nodes / "has_memory").read_text())
    except OSError:
        return
    if node not in with_memory:
        raise CXLMPIConfigError(f"CXLMPI_POOL=numa:{node}: node {node} has no memory")


def _parse_list(text: str) -> set[int]:
    """{0, 2, 3} from a sysfs list such as '0,2-3'."""
    out: set[int] = set()
    for part in text.strip().split(","):
        if not part:
            continue
        lo, _, hi = part.partition("-")
        out.update(range(int(lo), int(hi or lo) + 1))
    return out


# --------------------------------------------------------- host and process

def _host_id() -> int:
    """A 64-bit identity of this host and boot (pids mean something only
    on the host, and only during the boot, they were taken on)."""
    try:
        boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        boot = socket.gethostname()
    return int.from_bytes(hashlib.blake2b(boot.encode(), digest_size=8).digest(), "little")


def _start_time(pid: int) -> int:
    """Start time of process `pid` in clock ticks (0 if it is gone): tells a
    live process from a later one that reused its pid."""
    try:
        stat_line = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return 0
    fields = stat_line[stat_line.rindex(")") + 2:].split()
    if fields[0] in ("Z", "X"):
        return 0
    return int(fields[19])


def _alive(pid: int, start: int) -> bool:
    return pid > 0 and _start_time(pid) == start


HOST = _host_id()
_pool.set_host(HOST)


# ------------------------------------------------------------ the device

class Device:
    """One open pool file or devdax device and its partition table, shared
    by every pool of this process on it."""

    def __init__(self, spec: PoolSpec, fd: int, capacity: int, align: int) -> None:
        self.spec = spec
        self.fd = fd
        self.capacity = capacity
        self.align = align
        self.table_nbytes = _round_up(TABLE_NBYTES, align)
        self._map = mmap.mmap(fd, self.table_nbytes, mmap.MAP_SHARED,
                              mmap.PROT_READ | mmap.PROT_WRITE, offset=0)
        self._words = memoryview(self._map).cast("Q")
        self._address = ctypes.addressof(ctypes.c_char.from_buffer(self._map))
        self._thread_lock = threading.RLock()
        self._lock_depth = 0               # nesting of locked() in the holding thread
        self.claims: dict[int, int] = {}   # entry -> token, claimed here
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
        device that is all zeros there when `format_if_empty`)."""
        h = self.header()
        if h["magic"] == TABLE_MAGIC and h["version"] == TABLE_VERSION:
            if h["capacity"] != self.capacity or h["align"] != self.align:
                raise CXLMPIPoolError(
                    f"{self.spec}: the partition table describes {h['capacity']} bytes "
                    f"aligned to {h['align']}, the device has {self.capacity} aligned "
                    f"to {self.align}; reformat with `python -m cxlmpi --pool "
                    f"{self.spec} --pool-reset all` once no job uses it")
            return
        if h["magic"] == TABLE_MAGIC:
            raise CXLMPIPoolError(
                f"{self.spec}: partition table version {h['version']} was written by "
                f"another cxlmpi version (this one reads {TABLE_VERSION}); let the jobs "
                f"of that version finish, then `python -m cxlmpi --pool {self.spec} "
                f"--pool-reset all`")
        if any(self._load(0, TABLE_NBYTES // 8)) or not format_if_empty:
            raise CXLMPIPoolError(
                f"{self.spec}: offset 0 does not hold a cxlmpi partition table; "
                f"refusing to overwrite what is there.  If nothing else uses this "
                f"memory: `python -m cxlmpi --pool {self.spec} --pool-reset all`")
        with self.locked():
            if self._load(0)[0] != TABLE_MAGIC:
                self._format()

    def _format(self) -> None:
        """Write an empty table (under the lock)."""
        for i in range(NENTRIES):
            self._store(self._entry_word(i), [0] * (LINE // 8))
        uuid = [secrets.randbits(64), secrets.randbits(64)]
        self._store(1, [TABLE_VERSION, NENTRIES, self.capacity, self.align,
                        self.table_nbytes, *uuid])
        self._store(0, [TABLE_MAGIC])

    @property
    def identity(self) -> str:
        """What ranks that map this same memory have in common (and ranks
        that map another copy of a same-named file do not)."""
        return f"{self.spec.kind}:{self.header()['uuid']}"

    # ----------------------------------------------------------------- lock
    @contextmanager
    def locked(self) -> Iterator[None]:
        """Hold the table lock: a file lock among this host's processes, and
        Fischer's protocol on the lock line among hosts.  Re-entrant in the
        holding thread: a pool whose last array a garbage collection frees
        in the middle of claim() releases its partition right there."""
        with self._thread_lock:
            if self._lock_depth:
                self._lock_depth += 1
                try:
                    yield
                finally:
                    self._lock_depth -= 1
                return
            fcntl.lockf(self.fd, fcntl.LOCK_EX, 8, 0)
            try:
                token = secrets.randbits(63) | 1
                word = LOCK_AT // 8
                deadline = time.monotonic() + 60
                while True:
                    held, host, pid, since = self._load(word, 4)
                    if held and not self._lock_stale(host, pid, since):
                        if time.monotonic() > deadline:
                            raise CXLMPIPoolError(
                                f"{self.spec}: the partition table lock is held by pid "
                                f"{pid} on host {host:#x}; `--pool-reset` clears it")
                        time.sleep(FISCHER_DELAY_S)
                        continue
                    self._store(word, [token, HOST, os.getpid(), time.time_ns()])
                    time.sleep(FISCHER_DELAY_S)
                    if self._load(word)[0] == token:
                        break
                self._lock_depth = 1
                try:
                    yield
                finally:
                    self._lock_depth = 0
                    self._store(word, [0, 0, 0, 0])
            finally:
                fcntl.lockf(self.fd, fcntl.LOCK_UN, 8, 0)

    @staticmethod
    def _lock_stale(host: int, pid: int, since: int) -> bool:
        if host == HOST:
            return _start_time(pid) == 0 if pid else True
        return time.time_ns() - since > LOCK_STALE_S * 1e9

    # ----------------------------------------------------------- partitions
    def entries(self) -> list[dict]:
        """The table, one dict per entry in use."""
        out = []
        for i in range(NENTRIES):
            w = self._load(self._entry_word(i), 14)
            if w[E_STATE] == FREE:
                continue
            name = struct.pack("<4Q", *w[E_NAME:E_NAME + 4]).rstrip(b"\0").decode(
                "utf-8", "replace")
            out.append({"index": i, "state": STATE_NAMES.get(w[E_STATE], "?"),
                        "token": w[E_TOKEN], "offset": w[E_OFFSET], "nbytes": w[E_NBYTES],
                        "host": name, "this_host": w[E_HOST] == HOST, "pid": w[E_PID],
                        "start": w[E_START], "since_ns": w[E_TIME], "uid": w[E_UID],
                        "nranks": w[E_NRANKS], "stale": self._stale(w)})
        return out

    def _stale(self, w: list[int]) -> bool:
        """A partition nobody uses any more: its leader is gone (or released
        it) and no rank is still attached, as far as this host can tell."""
        if w[E_STATE] == FREE:
            return True
        if w[E_HOST] != HOST:
            return False
        if w[E_STATE] == CLAIMED and _alive(w[E_PID], w[E_START]):
            return False
        return not self._attached_ranks(w[E_OFFSET], w[E_NRANKS])

    def _attached_ranks(self, offset: int, nranks: int) -> list[int]:
        """Ranks whose control line in the partition at `offset` says they
        still map it and whose process (if on this host) lives."""
        length = _round_up(CTRL_AT + nranks * CTRL_LINE, self.align)
        try:
            m = mmap.mmap(self.fd, length, mmap.MAP_SHARED,
                          mmap.PROT_READ | mmap.PROT_WRITE, offset=offset)
        except (OSError, ValueError):
            return []
        try:
            _pool.flush(ctypes.addressof(ctypes.c_char.from_buffer(m, CTRL_AT)),
                        nranks * CTRL_LINE, True)
            out = []
            for r in range(nranks):
                words = struct.unpack_from("<6Q", m, CTRL_AT + r * CTRL_LINE)
                if words[CTRL_ATTACHED] and (words[CTRL_HOST] != HOST
                                             or _start_time(words[CTRL_PID])):
                    out.append(r)
            return out
        finally:
            m.close()

    def claim(self, nbytes: int, nranks: int) -> tuple[int, int, int, int]:
        """Claim a partition of at least `nbytes` for a pool of `nranks`:
        (entry, token, offset, length).  Stale partitions are reclaimed."""
        length = _round_up(nbytes, self.align)
        with self.locked():
            if not self._has_table():
                raise CXLMPIPoolError(f"{self.spec}: no partition table (check_header first)")
            used = []
            free_entry = None
            for i in range(NENTRIES):
                w = self._load(self._entry_word(i), 14)
                if w[E_STATE] != FREE and self._stale(w):
                    self._free_entry(i, w[E_OFFSET], w[E_NBYTES])
                    w[E_STATE] = FREE
                if w[E_STATE] == FREE:
                    free_entry = i if free_entry is None else free_entry
                else:
                    used.append((w[E_OFFSET], w[E_OFFSET] + w[E_NBYTES]))
            offset = self._first_fit(sorted(used), length)
            if offset is None or free_entry is None:
                in_use = sum(b - a for a, b in used)
                raise CXLMPIPoolError(
                    f"{self.spec}: no room for a {length >> 20} MiB partition "
                    f"({len(used)} partitions, {in_use >> 20} MiB of "
                    f"{(self.capacity - self.table_nbytes) >> 20} MiB in use); lower "
                    f"CXLMPI_POOL_SIZE, free communicators, or `python -m cxlmpi "
                    f"--pool {self.spec} --pool-status` to see who holds it")
            token = secrets.randbits(63) | 1
            pid = os.getpid()
            name = socket.gethostname().encode()[:32].ljust(32, b"\0")
            self._store(self._entry_word(free_entry) + 1,
                        [token, offset, length, HOST, pid, _start_time(pid),
                         time.time_ns(), os.getuid(), nranks,
                         *struct.unpack("<4Q", name)])
            self._store(self._entry_word(free_entry), [CLAIMED])
        self.claims[free_entry] = token
        return free_entry, token, offset, length

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
        with self.locked():
            word = self._entry_word(entry)
            w = self._load(word, E_NRANKS + 1)
            if w[E_TOKEN] != token or w[E_STATE] == FREE:
                return  # reset by an operator meanwhile: not ours any more
            if leader and w[E_STATE] == CLAIMED:
                self._store(word, [RELEASED])
                w[E_STATE] = RELEASED
            if w[E_STATE] == RELEASED and not self._attached_ranks(w[E_OFFSET],
                                                                   w[E_NRANKS]):
                self._free_entry(entry, w[E_OFFSET], w[E_NBYTES])

    def _free_entry(self, entry: int, offset: int, nbytes: int) -> None:
        self._store(self._entry_word(entry), [FREE, 0])
        if self.spec.kind == "file":  # give tmpfs / page-cache memory back
            _punch_hole(self.fd, offset, nbytes)

    def reset(self, everything: bool) -> list[int]:
        """Free stale partitions (every partition, and rewrite the table,
        with `everything`); the entries freed."""
        with self.locked():
            if everything:
                freed = [e["index"] for e in self.entries()] if self._has_table() else []
                self._format()
                if self.spec.kind == "file":
                    _punch_hole(self.fd, self.table_nbytes,
                                self.capacity - self.table_nbytes)
                return freed
            freed = []
            for e in self.entries():
                if e["stale"]:
                    self._free_entry(e["index"], e["offset"], e["nbytes"])
                    freed.append(e["index"])
            return freed

    def _has_table(self) -> bool:
        h = self.header()
        return h["magic"] == TABLE_MAGIC and h["version"] == TABLE_VERSION

    def close(self) -> None:
        self._words.release()
        self._map.close()
        os.close(self.fd)


def _round_up(n: int, align: int) -> int:
    return (n + align - 1) // align * align


_libc = ctypes.CDLL(None, use_errno=True)
_FALLOC_FL_KEEP_SIZE, _FALLOC_FL_PUNCH_HOLE = 1, 2


def _punch_hole(fd: int, offset: int, nbytes: int) -> None:
    """Give the pages of a freed partition back (tmpfs, page cache);
    harmless where the filesystem cannot."""
    _libc.fallocate(fd, _FALLOC_FL_KEEP_SIZE | _FALLOC_FL_PUNCH_HOLE,
                    ctypes.c_long(offset), ctypes.c_long(nbytes))


# ----------------------------------------------------------- opening

_devices: dict[str, Device] = {}
_devices_lock = threading.Lock()


def open_device(spec: PoolSpec, create: bool = False) -> Device:
    """The Device of `spec` (file or dax), opened once per process.  With
    `create`, a missing pool file is created (sparse, mode 0600)."""
    with _devices_lock:
        dev = _devices.get(str(spec))
        if dev is None:
            dev = _open(spec, create)
            _devices[str(spec)] = dev
        return dev


def _open(spec: PoolSpec, create: bool) -> Device:
    what = f"CXLMPI_POOL={spec}"
    path = spec.path
    if os.path.isdir(path):
        raise CXLMPIConfigError(f"{what}: {path} is a directory; name a file in it, "
                                f"e.g. file:{os.path.join(path, 'cxlmpi-pool')}")
    if spec.kind == "file" and create and not os.path.exists(path):
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
            try:
                os.ftruncate(fd, NEW_FILE_NBYTES)
            finally:
                os.close(fd)
        except FileExistsError:
            pass
        except OSError as exc:
            raise CXLMPIConfigError(f"{what}: cannot create {path}: {exc.strerror}; "
                                    f"create it yourself (`truncate -s 4G {path}`) "
                                    f"or pick a writable directory") from None
    try:
        fd = os.open(path, os.O_RDWR)
    except OSError as exc:
        hint = ("is the device configured? (`daxctl list`) and readable and writable "
                "by this user?" if spec.kind == "dax" else
                "does it exist and may this user read and write it?")
        raise CXLMPIConfigError(f"{what}: cannot open {path}: {exc.strerror}; {hint}") from None
    try:
        st = os.fstat(fd)
        if st.st_mode & stat.S_IWOTH:
            raise CXLMPIConfigError(
                f"{what}: {path} is world-writable, so any user could corrupt or read "
                f"the job's messages; `chmod o-w {path}` (share it through a group)")
        if spec.kind == "dax":
            emulated = "CXLMPI_SYSFS" in os.environ and stat.S_ISREG(st.st_mode)
            if not stat.S_ISCHR(st.st_mode) and not emulated:
                raise CXLMPIConfigError(f"{what}: {path} is not a character device "
                                        f"(devdax devices are /dev/daxX.Y)")
            capacity, align = dax_geometry(path)
        else:
            if not stat.S_ISREG(st.st_mode):
                raise CXLMPIConfigError(f"{what}: {path} is not a regular file")
            align = _file_align(fd)
            _check_shareable(fd, what, path, align)
            capacity = st.st_size - st.st_size % align
        if capacity < _round_up(TABLE_NBYTES, align) + align:
            raise CXLMPIConfigError(
                f"{what}: {capacity} bytes is too small for a partition table and one "
                f"partition; grow it (`truncate -s 4G {path}`)")
        return Device(spec, fd, capacity, align)
    except BaseException:
        os.close(fd)
        raise


_HUGETLBFS_MAGIC = 0x958458F6


def _file_align(fd: int) -> int:
    """Mapping granularity of a file: the huge page size on hugetlbfs, else
    the page size."""
    buf = ctypes.create_string_buffer(120)
    if _libc.fstatfs(fd, buf) == 0:
        f_type, f_bsize = struct.unpack_from("<qq", buf, 0)
        if f_type == _HUGETLBFS_MAGIC:
            return f_bsize
    return mmap.PAGESIZE


def _check_shareable(fd: int, what: str, path: str, align: int) -> None:
    """Map one unit MAP_SHARED: some filesystems (procfs, sysfs, FUSE
    without mmap support) cannot share memory."""
    try:
        m = mmap.mmap(fd, align, mmap.MAP_SHARED,
                      mmap.PROT_READ | mmap.PROT_WRITE, offset=0)
    except (OSError, ValueError) as exc:
        raise CXLMPIConfigError(
            f"{what}: {path} cannot be mapped shared ({exc}); use a file on tmpfs "
            f"(/dev/shm), hugetlbfs or an fsdax mount, or a devdax device") from None
    m.close()


def _close_all() -> None:
    with _devices_lock:
        for dev in _devices.values():
            try:
                dev.close()
            except (OSError, ValueError):
                pass
        _devices.clear()


atexit.register(_close_all)
