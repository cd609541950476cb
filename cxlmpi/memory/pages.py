"""Whether pool memory gets huge pages: read from the mount that holds it
and the kernel's settings, before any pool is made (CXLMPI_ALLOC=auto
turns the NumPy hook on where it does; ``python -m cxlmpi --info`` says
why or why not)."""

from __future__ import annotations

import os

__all__ = ["huge_pages", "mount_of"]


def _shmem_thp() -> str | None:
    """The kernel's shmem_enabled setting (/sys/kernel/mm/transparent_hugepage:
    always, within_size, advise, never, deny, force), or None where it does
    not say.  It rules the kernel's internal shared memory; of tmpfs mounts,
    which have their own huge= option, only `force` and `deny` apply."""
    try:
        with open("/sys/kernel/mm/transparent_hugepage/shmem_enabled") as f:
            chosen = [w[1:-1] for w in f.read().split() if w.startswith("[")]
    except OSError:
        return None
    return chosen[0] if chosen else None


def mount_of(path: str, mountinfo: str = "/proc/self/mountinfo") -> tuple[str, str, str]:
    """(mount point, filesystem type, options) of the mount that holds
    `path` (the last mounted over it wins), or ("", "", "") when unknown."""
    path = os.path.realpath(path)
    found = ("", "", "")
    try:
        with open(mountinfo) as f:
            lines = f.read().splitlines()
    except OSError:
        return found
    for line in lines:
        left, _, right = line.partition(" - ")
        fields, rest = left.split(), right.split()
        if len(fields) < 5 or len(rest) < 3:
            continue
        point = fields[4].replace("\\040", " ")
        inside = path == point or path.startswith(point.rstrip("/") + "/")
        if inside and len(point) >= len(found[0]):
            found = (point, rest[0], rest[2])
    return found


def huge_pages(pool: str) -> tuple[bool, str]:
    """Whether the kernel gives the memory of `pool` (a CXLMPI_POOL) huge
    pages once it is reserved (fallocate) and mapped, and why, in words."""
    from ..spec import parse_spec

    spec = parse_spec(pool)
    if spec.kind == "dax":
        return False, "a devdax device: pages of the device's alignment (--pool-status)"
    where = os.path.dirname(spec.path) if spec.kind == "file" else "/dev/shm"
    point, fstype, options = mount_of(where)
    if fstype == "hugetlbfs":
        return True, f"yes ({point} is hugetlbfs)"
    if fstype != "tmpfs":
        return False, (f"{where} is on {fstype or 'an unknown filesystem'}: huge pages "
                       f"as that filesystem gives them")
    mode = _shmem_thp()
    if mode in ("force", "deny"):
        return mode == "force", (f"{'yes' if mode == 'force' else 'no'} (the kernel's "
                                 f"shmem_enabled: {mode}, for every tmpfs)")
    huge = dict(o.partition("=")[::2] for o in options.split(",")).get("huge", "never")
    if huge in ("always", "within_size"):
        return True, f"yes (tmpfs {point} mounted with huge={huge})"
    if huge == "advise":
        return False, (f"no (tmpfs {point} mounted with huge=advise: pool memory is reserved "
                       f"with fallocate before it is mapped, so it gets 4 KiB pages)")
    return False, (f"no (tmpfs {point} mounted without huge=, i.e. never): 4 KiB pages, "
                   f"where NumPy's own large arrays get 2 MiB ones; mounting it with "
                   f"huge=within_size gives pool arrays huge pages")
