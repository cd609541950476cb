"""Pool backends (cxlmpi.memory.backends): specs, the sysfs facts of devdax devices
and NUMA nodes (on fixture trees), the bad input around pool files and
devices, and the command line's view of a pool (--pool-status, --pool-reset,
releases).  The partition table shared between jobs, who may use pool memory
and liveness: tests/test_partitions.py; the collectives over each backend:
tests/test_collectives.py."""

from __future__ import annotations

import os
import struct
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from harness import ROOT, SMALL_POOL_ENV, mpi_env, run_mpi
from pool_files import MIB, dax_fixture, fresh, make_file, start_claimer

from cxlmpi import config
from cxlmpi.errors import CXLMPIConfigError, CXLMPIPoolError
from cxlmpi.memory import backends

# ------------------------------------------------------------------ specs

@pytest.mark.parametrize("text, want", [
    ("shm", backends.PoolSpec("shm")),
    ("numa:1", backends.PoolSpec("numa", node=1)),
    ("file:/dev/shm/p", backends.PoolSpec("file", path="/dev/shm/p")),
    ("dax:/dev/dax0.0", backends.PoolSpec("dax", path="/dev/dax0.0")),
])
def test_parse_spec(text: str, want: backends.PoolSpec) -> None:
    assert backends.parse_spec(text) == want
    assert str(backends.parse_spec(str(want))) == str(want)


@pytest.mark.parametrize("text", ["", "shm:x", "numa", "numa:-1", "numa:a", "file:",
                                  "dax:", "cxl:/dev/dax0.0"])
def test_bad_spec(text: str) -> None:
    with pytest.raises(CXLMPIConfigError, match="CXLMPI_POOL"):
        config.Config({"CXLMPI_POOL": text})


def test_bad_pool_groups() -> None:
    with pytest.raises(CXLMPIConfigError, match="CXLMPI_POOL_GROUPS"):
        config.Config({"CXLMPI_POOL_GROUPS": "0"})


# ------------------------------------------------------- sysfs, on fixtures

def test_dax_geometry_from_sysfs(tmp_path: Path) -> None:
    root = dax_fixture(tmp_path, "dax3.1", 4 << 30, 1 << 30)
    assert backends.dax_geometry("/dev/dax3.1", root) == (4 << 30, 1 << 30)


def test_dax_alignment_defaults_to_2mib(tmp_path: Path) -> None:
    root = dax_fixture(tmp_path, "dax0.0", 64 * MIB, None)
    assert backends.dax_geometry("/dev/dax0.0", root) == (64 * MIB, 2 * MIB)


@pytest.mark.parametrize("size, align, match", [
    (None, None, "cannot read its size"),
    (64 * MIB, 3 * 4096, "power-of-two"),
    (MIB, 2 * MIB, "smaller than its alignment"),
])
def test_dax_geometry_errors(tmp_path: Path, size, align, match) -> None:
    if size is not None:
        dax_fixture(tmp_path, "dax0.0", size, align)
    with pytest.raises(CXLMPIConfigError, match=match):
        backends.dax_geometry("/dev/dax0.0", tmp_path)


def test_numa_node_check(tmp_path: Path) -> None:
    nodes = tmp_path / "devices" / "system" / "node"
    for n in (0, 2):
        (nodes / f"node{n}").mkdir(parents=True)
    (nodes / "has_memory").write_text("0\n")
    backends.numa_check(0, tmp_path)
    with pytest.raises(CXLMPIConfigError, match="no NUMA node 1 .*node0, node2"):
        backends.numa_check(1, tmp_path)
    with pytest.raises(CXLMPIConfigError, match="node 2 has no memory"):
        backends.numa_check(2, tmp_path)
    backends.numa_check(0)  # this machine's node 0
    with pytest.raises(CXLMPIConfigError, match="no NUMA node 4095"):
        backends.numa_check(4095)


# -------------------------------------------------------------- bad input

def test_other_version_and_foreign_contents(tmp_path: Path) -> None:
    path = make_file(tmp_path / "pool", 16 * MIB)
    fresh(f"file:{path}").close()
    with open(path, "r+b") as f:
        f.seek(8)
        f.write(struct.pack("<Q", 99))
    with pytest.raises(CXLMPIPoolError, match="version 99 .*another cxlmpi version"):
        fresh(f"file:{path}")
    other = make_file(tmp_path / "other", 16 * MIB)
    with open(other, "r+b") as f:
        f.write(b"not a cxlmpi table")
    with pytest.raises(CXLMPIPoolError, match="refusing to overwrite"):
        fresh(f"file:{other}")
    assert other.read_bytes()[:18] == b"not a cxlmpi table"


@pytest.mark.parametrize("case, match", [
    ("world", "mode 666: other users"),
    ("group", "mode 640: other users"),
    ("other-user", "belongs to uid 65534, not to this user"),
    ("symlink", "is a symbolic link"),
    ("dir", "is a directory"),
    ("missing-dax", "cannot open"),
    ("tiny", "too small"),
    ("chr", "not a devdax device|cannot read its size"),
    ("regular-dax", "not a character device"),
])
def test_bad_pool_files(tmp_path: Path, monkeypatch, case: str, match: str) -> None:
    monkeypatch.delenv("CXLMPI_SYSFS", raising=False)
    spec = {
        "world": lambda: f"file:{make_file(tmp_path / 'pool', 16 * MIB, 0o666)}",
        "group": lambda: f"file:{make_file(tmp_path / 'pool', 16 * MIB, 0o640)}",
        "other-user": lambda: f"file:{owned_by_nobody(make_file(tmp_path / 'pool', 16 * MIB))}",
        "symlink": lambda: f"file:{link_to(make_file(tmp_path / 'pool', 16 * MIB))}",
        "dir": lambda: f"file:{tmp_path}",
        "missing-dax": lambda: "dax:/dev/dax97.3",
        "tiny": lambda: f"file:{make_file(tmp_path / 'pool', 64 * 1024)}",
        "chr": lambda: f"dax:{private_char_device()}",
        "regular-dax": lambda: f"dax:{make_file(tmp_path / 'pool', 16 * MIB)}",
    }[case]()
    with pytest.raises(CXLMPIConfigError, match=match):
        fresh(spec)


def owned_by_nobody(path: Path) -> Path:
    if os.geteuid() != 0:
        pytest.skip("needs root to give a file away")
    os.chown(path, 65534, -1)
    return path


def link_to(path: Path) -> Path:
    link = path.with_name("link")
    link.symlink_to(path)
    return link


def private_char_device() -> str:
    """A character device this user may open read-write that is not
    world-writable (and not a devdax device)."""
    for path in ("/dev/kmsg", "/dev/mem", "/dev/port"):
        try:
            st = os.stat(path)
        except OSError:
            continue
        if not st.st_mode & 0o002 and os.access(path, os.R_OK | os.W_OK):
            return path
    pytest.skip("no private character device to open here")


def test_filesystem_that_cannot_share_memory() -> None:
    if os.geteuid() != 0:
        pytest.skip("needs a writable procfs file (root)")
    with pytest.raises(CXLMPIConfigError, match="cannot be mapped shared"):
        fresh("file:/proc/sys/kernel/hostname")


def test_dax_stand_in_uses_device_alignment(tmp_path: Path, monkeypatch) -> None:
    """A regular file standing in for /dev/daxX.Y (CXLMPI_SYSFS names the
    fixture tree): partitions and the table follow the 2 MiB alignment."""
    dev_path = make_file(tmp_path / "dax5.0", 64 * MIB)
    monkeypatch.setenv("CXLMPI_SYSFS", str(dax_fixture(tmp_path / "sys", "dax5.0",
                                                       64 * MIB, None)))
    dev = fresh(f"dax:{dev_path}")
    assert (dev.capacity, dev.align, dev.table_nbytes) == (64 * MIB, 2 * MIB, 2 * MIB)
    claims = [dev.claim(MIB + 1, 2) for _ in range(3)]
    assert all(off % (2 * MIB) == 0 and n == 2 * MIB for _, _, off, n in claims)
    dev.close()


# --------------------------------------------------------------------- CLI

def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "cxlmpi", *args], cwd=ROOT,
                          env=mpi_env(), capture_output=True, text=True, timeout=60)


def test_pool_status_and_reset(tmp_path: Path) -> None:
    spec = f"file:{make_file(tmp_path / 'pool', 32 * MIB)}"
    live, live_entry, _ = start_claimer(spec, "live")
    proc, entry, _ = start_claimer(spec, "die")
    proc.wait()
    try:
        out = cli("--pool", spec, "--pool-status")
        assert out.returncode == 0, out.stderr
        rows = {int(line.split()[0]): line for line in out.stdout.splitlines()[2:]}
        assert rows[entry].split()[-1] == "dead" and rows[live_entry].split()[-1] == "alive"
        out = cli("--pool", spec, "--pool-reset")
        assert out.returncode == 0 and f"freed 1 partition(s): [{entry}]" in out.stdout
        assert [e["index"] for e in fresh(spec).entries()] == [live_entry]
    finally:
        live.stdin.close()
        live.wait(timeout=30)
    out = cli("--pool", spec, "--pool-reset", "all")
    assert out.returncode == 0 and "rewrote the table" in out.stdout
    assert fresh(spec).entries() == []
    out = cli("--pool-status")
    assert out.returncode == 2 and "no partition table" in out.stderr


@pytest.mark.parametrize("kind", ["file", "dax"])
def test_arrays_alive_at_exit_give_the_partition_back(kind: str, tmp_path: Path,
                                                       monkeypatch) -> None:
    """A plain `mpiexec python app.py` whose pool arrays are alive at exit:
    the Allreduce on them equals stock MPI's, nothing is raised at exit, and
    the partition table is empty afterwards."""
    env = dict(SMALL_POOL_ENV)
    if kind == "file":
        env["CXLMPI_POOL"] = f"file:{tmp_path / 'pool'}"
    else:
        device = make_file(tmp_path / "dax0.0", 256 * MIB)
        env["CXLMPI_SYSFS"] = str(dax_fixture(tmp_path / "sys", "dax0.0", 256 * MIB, None))
        env["CXLMPI_POOL"] = f"dax:{device}"
        monkeypatch.setenv("CXLMPI_SYSFS", env["CXLMPI_SYSFS"])
    out = run_mpi(2, ["tests/scripts/exit_arrays.py"], env=env)
    assert "EXIT [true, true]" in out.stdout.splitlines(), out.stdout
    assert "Traceback" not in out.stderr and "Exception" not in out.stderr, out.stderr
    dev = backends._open(backends.parse_spec(env["CXLMPI_POOL"]), create=False)
    try:
        assert dev.entries() == []
    finally:
        dev.close()


def test_release_while_the_table_lock_is_held(tmp_path: Path) -> None:
    """A pool's last array collected by a garbage collection that runs inside
    claim() (the table lock held by this very thread) releases its partition
    there: it must not wait for itself."""
    dev = fresh(f"file:{make_file(tmp_path / 'pool', 64 * MIB)}")
    entry, token, _, _ = dev.claim(MIB, 1)
    done: list[bool] = []

    def nested() -> None:
        with dev.locked():
            dev.release(entry, token)
        done.append(True)

    worker = threading.Thread(target=nested, daemon=True)
    worker.start()
    worker.join(30)
    assert done == [True] and dev.entries() == []
