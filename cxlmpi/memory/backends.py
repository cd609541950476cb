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
any writer can take, read it back; a claimer that took longer between its
read and its write than that bound backs off), serialized within a host by
a file lock.  Every table store is flushed and every load invalidated,
since hosts may not keep their caches coherent for each other.

Who lives is judged as cxlmpi.memory.liveness tells: on this kernel (any pid
namespace) by the lock each owner holds on a byte of the file -- its table
entry's, its control line's -- which the kernel keeps while the owner
lives, stopped or not; in this pid namespace by pid and start time too;
on other hosts by a heartbeat, a counter the owner's beat thread advances,
judged by this process's own monotonic clock.  A partition is reclaimed
only when its leader and every attached rank are shown gone; what cannot
be judged is left alone.  A partition reclaimed from a job of another host
that stood still past its lease has its token wiped: the job finds out at
its next step (cxlmpi._pool) and stops with an error.  `python -m cxlmpi --pool-status`
shows the table, `--pool-reset` frees stale partitions (or, with `all`,
every partition).

Pool memory belongs to its users only: a pool file is created atomically,
mode 0600 (0660 for CXLMPI_POOL_GROUP), never through a symbolic link, and
a file or device that anyone else can read or write -- by its mode or its
ACL -- is refused (cxlmpi.memory.access).  Memory a
new partition hands out is zero (hole-punched files, wiped by the arena
where the memory cannot be given back, as on devdax).
"""


from __future__ import annotations

import atexit
import ctypes
import errno
import grp
import mmap
import os
import secrets
import stat
import struct
import threading
from pathlib import Path

from .. import config
from ..errors import CXLMPIConfigError
from ..spec import PoolSpec, parse_spec
from .access import check_private, drop_acl
from .partitions import NO_ROOM, TABLE_NBYTES, Device, libc, round_up

__all__ = ["PoolSpec", "parse_spec", "Device", "open_device", "dax_geometry",
           "numa_check", "sysfs_root", "NO_ROOM"]

MIB = 1 << 20
DEFAULT_DAX_ALIGN = 2 * MIB
NEW_FILE_NBYTES = 64 << 30      # size of a pool file cxlmpi creates (sparse)


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
    gid = _pool_group()
    if spec.kind == "file" and create and not os.path.lexists(path):
        _create_file(what, path, gid)
    try:
        fd = os.open(path, os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise CXLMPIConfigError(
                f"{what}: {path} is a symbolic link (to {os.path.realpath(path)}); "
                f"cxlmpi does not follow links to pool memory, which could lead "
                f"anywhere: name the file or device itself") from None
        hint = ("is the device configured? (`daxctl list`) and readable and writable "
                "by this user?" if spec.kind == "dax" else
                "does it exist and may this user read and write it?")
        raise CXLMPIConfigError(f"{what}: cannot open {path}: {exc.strerror}; {hint}") from None
    try:
        st = os.fstat(fd)
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
        if capacity < round_up(TABLE_NBYTES, align) + align:
            raise CXLMPIConfigError(
                f"{what}: {capacity} bytes is too small for a partition table and one "
                f"partition; grow it (`truncate -s 4G {path}`)")
        check_private(what, path, st, gid, fd)
        return Device(spec, fd, capacity, align)
    except BaseException:
        os.close(fd)
        raise


def _pool_group() -> int | None:
    """The gid of CXLMPI_POOL_GROUP (a name or a number), None if unset."""
    name = config.get().pool_group.strip()
    if not name:
        return None
    try:
        return grp.getgrnam(name).gr_gid
    except KeyError:
        if name.isdigit():
            return int(name)
        raise CXLMPIConfigError(f"CXLMPI_POOL_GROUP={name}: no such group "
                                f"(`getent group` lists them)") from None


def _create_file(what: str, path: str, gid: int | None) -> None:
    """Create the pool file at `path` in one step, whole (sized, its mode
    and group set) or not at all: built under a private temporary name,
    then linked into place -- a job that meets the file never sees it half
    made, and two jobs creating it at once both end up with the one that
    got there first."""
    directory = os.path.dirname(path) or "."
    temp = os.path.join(directory, f".{os.path.basename(path)}.{secrets.token_hex(8)}")
    flags = os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        fd = os.open(temp, flags, 0o600)
    except OSError as exc:
        raise CXLMPIConfigError(
            f"{what}: cannot create {path}: {exc.strerror}; create it yourself "
            f"(`truncate -s 4G {path} && chmod 600 {path}`) or pick a writable "
            f"directory") from None
    try:
        if gid is not None:
            os.fchown(fd, -1, gid)
        os.fchmod(fd, 0o600 if gid is None else 0o660)
        drop_acl(fd)                    # (one the directory's default ACL gave it)
        os.ftruncate(fd, NEW_FILE_NBYTES)
        try:
            os.link(temp, path)
        except FileExistsError:
            pass                        # another job was first: use its file
    except OSError as exc:
        raise CXLMPIConfigError(f"{what}: cannot create {path}: {exc.strerror}") from None
    finally:
        os.close(fd)
        os.unlink(temp)


_HUGETLBFS_MAGIC = 0x958458F6


def _file_align(fd: int) -> int:
    """Mapping granularity of a file: the huge page size on hugetlbfs, else
    the page size."""
    buf = ctypes.create_string_buffer(120)
    if libc.fstatfs(fd, buf) == 0:
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
