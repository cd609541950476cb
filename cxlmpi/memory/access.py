"""Who may use pool memory: a pool file or device is refused when anyone
but this user (or, with CXLMPI_POOL_GROUP, that group) could read or write
it -- by its mode bits, and by its POSIX access ACL, whose named-user and
named-group entries grant access that the mode bits do not show (a file of
mode 660 may still let one outsider read the job's messages)."""

from __future__ import annotations

import errno
import os
import stat
import struct

from ..errors import CXLMPIConfigError

__all__ = ["check_private", "acl_outsiders", "drop_acl"]

# The kernel's xattr form of an access ACL (linux/posix_acl_xattr.h): a
# version word, then entries of (tag u16, permissions u16, id u32).
ACL_XATTR = "system.posix_acl_access"
ACL_XATTR_VERSION = 2
ACL_USER, ACL_GROUP, ACL_MASK = 0x02, 0x08, 0x10
ACL_READ, ACL_WRITE = 0x04, 0x02
_HEADER, _ENTRY = struct.Struct("<I"), struct.Struct("<HHI")


def acl_outsiders(fd: int, gid: int | None) -> list[str]:
    """The named entries of the file's access ACL that let someone other
    than its owner (and the group `gid`) read or write it -- their rights
    within the ACL's mask -- as `setfacl` writes them ("user:65534:rw");
    an ACL that cannot be parsed counts as one ("unreadable ACL").  Empty
    where there is no ACL or the filesystem keeps none."""
    try:
        raw = os.getxattr(fd, ACL_XATTR)
    except OSError as exc:
        if exc.errno in (errno.ENODATA, errno.ENOTSUP, errno.EOPNOTSUPP):
            return []
        return [f"unreadable ACL ({exc.strerror})"]
    body = len(raw) - _HEADER.size
    if body < 0 or body % _ENTRY.size or _HEADER.unpack_from(raw)[0] != ACL_XATTR_VERSION:
        return ["unreadable ACL"]
    euid = os.geteuid()
    entries = [_ENTRY.unpack_from(raw, offset)
               for offset in range(_HEADER.size, len(raw), _ENTRY.size)]
    # (the mask bounds what a named entry grants: the mode's group bits)
    mask = next((perm for tag, perm, _ in entries if tag == ACL_MASK), 7)
    found = []
    for tag, perm, ident in entries:
        perm &= mask
        if not perm & (ACL_READ | ACL_WRITE):
            continue
        if (tag == ACL_USER and ident != euid) or (tag == ACL_GROUP and ident != gid):
            kind = "user" if tag == ACL_USER else "group"
            rights = ("r" if perm & ACL_READ else "-") + ("w" if perm & ACL_WRITE else "-")
            found.append(f"{kind}:{ident}:{rights}")
    return found


def drop_acl(fd: int) -> None:
    """Remove an access ACL a new file inherited from its directory's
    default ACL: the mode cxlmpi sets is then all there is."""
    try:
        os.removexattr(fd, ACL_XATTR)
    except OSError as exc:
        if exc.errno not in (errno.ENODATA, errno.ENOTSUP, errno.EOPNOTSUPP):
            raise


def check_private(what: str, path: str, st: os.stat_result, gid: int | None,
                  fd: int | None = None) -> None:
    """Refuse pool memory that someone other than this user (or, with
    CXLMPI_POOL_GROUP, that group) could read or write: it would read the
    job's messages, or corrupt them.  `fd`: the open file, whose ACL is
    checked too."""
    mode = stat.S_IMODE(st.st_mode)
    euid = os.geteuid()
    if gid is None:
        if st.st_uid != euid:
            raise CXLMPIConfigError(
                f"{what}: {path} belongs to uid {st.st_uid}, not to this user "
                f"(uid {euid}); use your own pool file, or share one between users "
                f"through a group: CXLMPI_POOL_GROUP=NAME with the file in that group, "
                f"mode 660")
        if mode & 0o077:
            raise CXLMPIConfigError(
                f"{what}: {path} has mode {mode:o}: other users could read or write "
                f"the job's messages; `chmod 600 {path}` (or, to share it with a "
                f"group: `chgrp NAME {path} && chmod 660 {path}` and "
                f"CXLMPI_POOL_GROUP=NAME)")
    else:
        if st.st_gid != gid:
            raise CXLMPIConfigError(
                f"{what}: {path} belongs to group {st.st_gid}, not to "
                f"CXLMPI_POOL_GROUP (gid {gid}); `chgrp {gid} {path}`")
        if st.st_uid != euid and not mode & stat.S_IWGRP:
            raise CXLMPIConfigError(f"{what}: {path} is not writable by its group; "
                                    f"`chmod g+rw {path}`")
        if mode & 0o007:
            raise CXLMPIConfigError(
                f"{what}: {path} has mode {mode:o}: users outside the group could read or "
                f"write the job's messages; `chmod o-rwx {path}`")
    outsiders = acl_outsiders(fd, gid) if fd is not None else []
    if outsiders:
        raise CXLMPIConfigError(
            f"{what}: {path} has an ACL that lets others read or write the job's "
            f"messages ({', '.join(outsiders)}), whatever its mode; `setfacl -b {path}` "
            f"(share it through CXLMPI_POOL_GROUP instead)")
