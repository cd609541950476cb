"""What the backend and partition tests share (tests/test_backends.py,
tests/test_partitions.py, tests/test_access.py): pool files of a given size
and mode, Devices opened anew, fixture sysfs trees of devdax devices, and a
process that claims a partition and holds it (or is killed holding it)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from harness import ROOT, mpi_env

from cxlmpi.memory import backends

MIB = 1 << 20


def make_file(path: Path, nbytes: int, mode: int = 0o600) -> Path:
    with open(path, "wb") as f:
        f.truncate(nbytes)
    os.chmod(path, mode)
    return path


def fresh(spec: str) -> backends.Device:
    """A Device of `spec` opened anew (not the per-process cached one)."""
    dev = backends._open(backends.parse_spec(spec), create=True)
    dev.check_header(format_if_empty=True)
    return dev


def dax_fixture(root: Path, name: str, size: int, align: int | None) -> Path:
    """A sysfs tree describing devdax device `name`."""
    d = root / "bus" / "dax" / "devices" / name
    d.mkdir(parents=True)
    (d / "size").write_text(f"{size}\n")
    if align is not None:
        (d / "align").write_text(f"{align}\n")
    return root


CLAIMER = """
import os, signal, sys
from cxlmpi.memory import backends
from cxlmpi._pool import Pool
dev = backends.open_device(backends.parse_spec(sys.argv[1]), create=True)
dev.check_header(format_if_empty=True)
entry, token, offset, length = dev.claim(4 << 20, 2)
pool = Pool.map_partition(dev.fd, offset, 4 << 20, 0, 2, True, token, "p")
print(entry, offset, flush=True)
if sys.argv[2] == "die":
    os.kill(os.getpid(), signal.SIGKILL)
sys.stdin.read()          # hold the partition until the test closes stdin
pool.close()
dev.release(entry, token)
"""


def start_claimer(spec: str, how: str) -> tuple[subprocess.Popen, int, int]:
    proc = subprocess.Popen([sys.executable, "-c", CLAIMER, spec, how], cwd=ROOT,
                            env=mpi_env(), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            text=True)
    entry, offset = map(int, proc.stdout.readline().split())
    return proc, entry, offset
