"""Shared helpers for the driver tests (run by plain pytest, one process)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

# Test-sized pool: tiny slots and chunks so that small arrays exercise the
# pool path, multi-chunk pipelining and messages larger than a slot.
SMALL_POOL_ENV = {
    "CXLMPI_POOL_SIZE": "256K",
    "CXLMPI_CHUNK_SIZE": "4K",
    "CXLMPI_THRESHOLD": "64",
    "CXLMPI_RSAG_THRESHOLD": "1K",
    "CXLMPI_TIMEOUT": "60",
}


def mpiexec() -> list[str]:
    """The launcher: $MPIEXEC, else mpiexec next to this Python, else PATH."""
    cmd = os.environ.get("MPIEXEC")
    if cmd:
        return cmd.split()
    local = Path(sys.executable).parent / "mpiexec"
    found = str(local) if local.exists() else shutil.which("mpiexec")
    if found is None:
        pytest.skip("no mpiexec found")
    args = [found]
    if os.environ.get("CXLMPI_TEST_OPENMPI"):
        args += ["--oversubscribe"]
    return args


def run_mpi(nranks: int, args: list[str], env: dict[str, str] | None = None,
            timeout: float = 240, check: bool = True) -> subprocess.CompletedProcess:
    """Run `python args...` on `nranks` ranks; fail with the output if it fails."""
    full_env = dict(os.environ)
    full_env.setdefault("OMPI_ALLOW_RUN_AS_ROOT", "1")
    full_env.setdefault("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
    full_env["PYTHONPATH"] = os.pathsep.join(
        [str(ROOT), full_env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    if env:
        full_env.update(env)
    cmd = [*mpiexec(), "-n", str(nranks), sys.executable, *args]
    proc = subprocess.run(cmd, cwd=ROOT, env=full_env, capture_output=True,
                          text=True, timeout=timeout)
    if check and proc.returncode != 0:
        pytest.fail(f"{' '.join(cmd)} exited {proc.returncode}\n"
                    f"--- stdout\n{proc.stdout[-6000:]}\n--- stderr\n{proc.stderr[-6000:]}")
    return proc


def our_segments() -> list[str]:
    """cxlmpi's segments currently in /dev/shm."""
    try:
        return sorted(n for n in os.listdir("/dev/shm") if n.startswith("cxlmpi-"))
    except FileNotFoundError:
        return []
