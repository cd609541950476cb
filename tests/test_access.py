"""Pool memory and POSIX ACLs (cxlmpi.memory.access): a pool file whose access
ACL lets someone outside this user (and CXLMPI_POOL_GROUP) read or write
it is refused, whatever its mode bits say -- exactly where the kernel lets
that someone read the file (checked as user nobody)."""

from __future__ import annotations

import grp
import os
import shutil
import struct
import subprocess
import tempfile
from pathlib import Path

import pytest
from pool_files import MIB, fresh, make_file

from cxlmpi import config
from cxlmpi.errors import CXLMPIConfigError
from cxlmpi.memory import access

NOBODY = 65534


def acl_xattr(named: list[tuple[int, int, int]], mode: int) -> bytes:
    """An access ACL as the kernel's xattr: owner, group and other from
    `mode`, the `named` (tag, id, permissions) entries, and a mask of the
    mode's group bits (as `setfacl -m u:ID:rw` on a file of that mode
    leaves it with `chmod` after)."""
    entries = [(0x01, 0xFFFFFFFF, (mode >> 6) & 7), (0x04, 0xFFFFFFFF, (mode >> 3) & 7),
               *named, (0x10, 0xFFFFFFFF, (mode >> 3) & 7), (0x20, 0xFFFFFFFF, mode & 7)]
    entries.sort(key=lambda e: (e[0], e[1] if e[0] in (0x02, 0x08) else 0))
    return struct.pack("<I", 2) + b"".join(struct.pack("<HHI", tag, perm, ident)
                                           for tag, ident, perm in entries)


def set_acl(path: Path, named: list[tuple[int, int, int]], mode: int) -> None:
    os.setxattr(path, access.ACL_XATTR, acl_xattr(named, mode))
    assert os.stat(path).st_mode & 0o777 == mode


def outsider_reads(path: Path) -> bool:
    """Whether user nobody can read `path` (the kernel's verdict)."""
    proc = subprocess.run(["runuser", "-u", "nobody", "--", "head", "-c", "1", str(path)],
                          capture_output=True, timeout=60)
    return proc.returncode == 0


@pytest.fixture
def acl_dir():
    """A folder user nobody can reach (pytest's tmp_path is under a 0700
    one): only the files in it are private."""
    if os.geteuid() != 0:
        pytest.skip("needs root to run as user nobody")
    folder = Path(tempfile.mkdtemp(prefix="cxlmpi-acl-"))
    try:
        folder.chmod(0o755)
        probe = make_file(folder / "probe", 4096)
        try:
            set_acl(probe, [], 0o600)
        except OSError as exc:
            pytest.skip(f"{folder}: no POSIX ACLs here ({exc.strerror})")
        yield folder
    finally:
        shutil.rmtree(folder)


@pytest.mark.parametrize("pool_group", [False, True])
def test_pool_files_are_refused_exactly_where_an_acl_lets_outsiders_in(
        acl_dir: Path, monkeypatch, pool_group: bool) -> None:
    """Files of mode 600 (660 in CXLMPI_POOL_GROUP) with ACL entries for
    user or group nobody, with and without read and write, and for the
    pool group itself: cxlmpi refuses a file exactly where the kernel lets
    user nobody read it (before: only the mode bits were read, and a 660
    file that nobody could read through its ACL was taken).  (At mode 600
    the ACL's mask is empty and no named entry grants anything.)"""
    mode = 0o660 if pool_group else 0o600
    if pool_group:
        group = grp.getgrgid(0).gr_name   # (root's: nobody is not in it)
        monkeypatch.setenv("CXLMPI_POOL_GROUP", group)
    config.reload()
    refused = 0
    try:
        cases = [[(0x02, NOBODY, 6)], [(0x02, NOBODY, 4)], [(0x08, NOBODY, 6)],
                 [(0x02, NOBODY, 0)], [(0x02, NOBODY, 1)], [(0x08, 0, 6)], []]
        for i, named in enumerate(cases):
            path = make_file(acl_dir / f"pool{i}", 16 * MIB, mode)
            set_acl(path, named, mode)
            if outsider_reads(path):
                refused += 1
                with pytest.raises(CXLMPIConfigError, match="ACL"):
                    fresh(f"file:{path}")
            else:
                fresh(f"file:{path}").close()
    finally:
        monkeypatch.delenv("CXLMPI_POOL_GROUP", raising=False)
        config.reload()
    assert refused == (3 if pool_group else 0)


def test_a_pool_file_cxlmpi_creates_drops_an_inherited_acl(acl_dir: Path,
                                                            monkeypatch) -> None:
    """A directory whose default ACL gives user nobody read and write, and
    CXLMPI_POOL_GROUP: a file made there mode 660 lets nobody read it; the
    pool file cxlmpi creates there (mode 660) carries no ACL, nobody cannot
    read it, and it opens (before: it inherited the entry, and cxlmpi
    refused its own file -- or, without the ACL check, nobody read the job's
    messages)."""
    os.setxattr(acl_dir, "system.posix_acl_default", acl_xattr([(0x02, NOBODY, 6)], 0o775))
    inherits = acl_dir / "inherits"
    os.close(os.open(inherits, os.O_CREAT | os.O_WRONLY | os.O_CLOEXEC, 0o660))
    inherits.write_bytes(b"x")
    assert outsider_reads(inherits)
    monkeypatch.setenv("CXLMPI_POOL_GROUP", grp.getgrgid(0).gr_name)
    config.reload()
    try:
        path = acl_dir / "pool"
        fresh(f"file:{path}").close()
    finally:
        monkeypatch.delenv("CXLMPI_POOL_GROUP")
        config.reload()
    assert not outsider_reads(path)
    with pytest.raises(OSError):
        os.getxattr(path, access.ACL_XATTR)
