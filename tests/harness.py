"""Helpers of the driver tests (plain pytest, one process): launching MPI
jobs and looking at /dev/shm."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

# Test-sized pool: tiny slots and chunks so that small arrays exercise the
# pool path, multi-chunk pipelining and messages larger than a slot.
SMALL_POOL_ENV = {
    "CXLMPI_POOL_SIZE": "256K",
    "CXLMPI_ARENA_SIZE": "1M",
    "CXLMPI_ZEROCOPY_THRESHOLD": "1K",
    "CXLMPI_CHUNK_SIZE": "4K",
    "CXLMPI_THRESHOLD": "64",
    "CXLMPI_TUNING": "pool",
    "CXLMPI_OBJECTS": "1",
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


# Open MPI's launcher (PRRTE) now and then fails to start its PMIx server
# before it starts any rank -- a known, rare race of the launcher
# (lfortran/lfortran#8610 meets it in CI too).  No rank ran, so nothing
# of the test's was tried: the launch is tried again, and only then.
LAUNCH_TRIES = 3
_LAUNCHER_FAILURES = ("The PMIx server's listener thread failed to start",)


def launcher_failed(returncode: int | None, stderr: str) -> bool:
    """Whether a job ended because its launcher could not start (never for
    anything a rank printed: cxlmpi prints none of these)."""
    return returncode not in (0, None) and any(m in stderr for m in _LAUNCHER_FAILURES)


def run_launcher(cmd: list[str], **kwargs) -> subprocess.CompletedProcess:
    """`subprocess.run(cmd, capture_output=True, text=True, **kwargs)` for a
    command that starts an MPI launcher, tried again where the launcher
    could not start."""
    for _ in range(LAUNCH_TRIES):
        proc = subprocess.run(cmd, capture_output=True, text=True, **kwargs)
        if not launcher_failed(proc.returncode, proc.stderr):
            break
    return proc


def run_mpi(nranks: int, args: list[str], env: dict[str, str] | None = None,
            timeout: float = 240, check: bool = True) -> subprocess.CompletedProcess:
    """Run `python args...` on `nranks` ranks; fail with the output if it fails."""
    full_env = mpi_env(env)
    cmd = [*mpiexec(), "-n", str(nranks), sys.executable, *args]
    proc = run_launcher(cmd, cwd=ROOT, env=full_env, timeout=timeout)
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


# ---------------------------------------------------------------------------
# Jobs that are expected to fail or could hang (tests/test_runner.py)

SCRIPTS = ROOT / "tests" / "scripts"


@dataclasses.dataclass
class MPIJob:
    """The outcome of `launch_mpi`: `returncode` is None when the job was still
    running at the timeout and had to be killed."""

    cmd: list[str]
    returncode: int | None
    stdout: str
    stderr: str
    seconds: float

    @property
    def timed_out(self) -> bool:
        return self.returncode is None

    def describe(self) -> str:
        """Everything about the run, for assertion messages."""
        status = "timed out" if self.timed_out else f"exited {self.returncode}"
        return (f"{' '.join(self.cmd)} {status} after {self.seconds:.1f} s\n"
                f"--- stdout\n{self.stdout[-6000:]}\n--- stderr\n{self.stderr[-6000:]}")


def mpi_env(env: dict[str, str] | None = None) -> dict[str, str]:
    """The environment `run_mpi` gives its jobs, plus `env`."""
    full_env = dict(os.environ)
    full_env.setdefault("OMPI_ALLOW_RUN_AS_ROOT", "1")
    full_env.setdefault("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
    full_env["PYTHONPATH"] = os.pathsep.join(
        [str(ROOT), full_env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    if env:
        full_env.update(env)
    return full_env


def _descendants(pid: int) -> list[int]:
    """Process ids of every live descendant of `pid` (from /proc)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        children.setdefault(ppid, []).append(int(entry))
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def launch_mpi(nranks: int, args: list[str], env: dict[str, str] | None = None,
               timeout: float = 60, launcher_args: list[str] | None = None) -> MPIJob:
    """Run `python args...` on `nranks` ranks and return how it ended, never
    raising: for jobs that must fail, and jobs that might hang.

    Output goes to files, not pipes, so that a rank outliving the launcher
    cannot block the test; at the timeout the launcher gets SIGTERM (hydra and
    mpirun then kill their ranks) and, 10 s later, the launcher and every
    process it started that is still there get SIGKILL."""
    cmd = [*mpiexec(), *(launcher_args or []), "-n", str(nranks), sys.executable, *args]
    for _ in range(LAUNCH_TRIES):
        job = _launch_once(cmd, env, timeout)
        if not launcher_failed(job.returncode, job.stderr):
            break
    return job


def _launch_once(cmd: list[str], env: dict[str, str] | None, timeout: float) -> MPIJob:
    shm_before = _shm_names()
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        t0 = time.monotonic()
        proc = subprocess.Popen(cmd, cwd=ROOT, env=mpi_env(env), stdin=subprocess.DEVNULL,
                                stdout=out, stderr=err, text=True)
        try:
            returncode: int | None = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            returncode = None
            started = _descendants(proc.pid)
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            for pid in started:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        seconds = time.monotonic() - t0
        _remove_mpi_leftovers(shm_before)
        out.seek(0)
        err.seek(0)
        return MPIJob(cmd, returncode, out.read(), err.read(), seconds)


@contextlib.contextmanager
def cpu_bound_neighbour() -> Iterator[None]:
    """A process that keeps a core busy while the block runs (the machine
    of a real suite run, where the ranks share their cores)."""
    proc = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        yield
    finally:
        proc.kill()
        proc.wait()


# MPICH and Open MPI leave their own shared-memory segments behind when a
# job is aborted or killed; the failure tests abort jobs on purpose, so they
# remove what the MPI library of such a job left (never cxlmpi's own: the
# tests check that none of those remain).
_MPI_SEGMENT_PREFIXES = ("mpich_shm_", "sm_segment.", "vader_segment.")


def _shm_names() -> set[str]:
    try:
        return set(os.listdir("/dev/shm"))
    except FileNotFoundError:
        return set()


def _mapped_shm_names() -> set[str]:
    """Names of /dev/shm files some process on this machine still maps."""
    names: set[str] = set()
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/maps") as maps:
                for line in maps:
                    at = line.find("/dev/shm/")
                    if at >= 0:
                        names.add(line[at + 9:].split()[0])
        except OSError:
            continue
    return names


def _remove_mpi_leftovers(before: set[str]) -> None:
    """Remove MPI-library segments that appeared since `before` and that no
    process maps any more (never one a running job still uses)."""
    new = [n for n in _shm_names() - before if n.startswith(_MPI_SEGMENT_PREFIXES)]
    if not new:
        return
    mapped = _mapped_shm_names()
    for name in new:
        if name not in mapped:
            try:
                os.unlink(os.path.join("/dev/shm", name))
            except OSError:
                pass


def segment_creator(name: str) -> int:
    """Process id in a segment name (cxlmpi-<uid>-<pid>-<token>), or -1."""
    parts = name.split("-")
    return int(parts[2]) if len(parts) == 4 and parts[2].isdigit() else -1


def leaked_segments(before: list[str]) -> list[str]:
    """cxlmpi segments that appeared since `before` and whose creator has
    exited: leaked ones.  (A segment of some other job still running on this
    machine exists for a moment, between its creation and its unlinking, while
    its creator lives; it is not counted.)"""
    def alive(pid: int) -> bool:
        if pid <= 0:
            return False
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True
    return [n for n in our_segments()
            if n not in before and not alive(segment_creator(n))]


# Small runs of each example (tests/test_runner.py, tests/test_alloc.py).
EXAMPLES = {
    "train_allreduce": ["--steps", "20", "--params", "200000", "--samples", "512",
                        "--bucket-mib", "0.7", "--log-every", "10"],
    "jacobi_solver": ["--nx", "128", "--ny", "64", "--maxiter", "100",
                      "--log-every", "0"],
    "pagerank": ["--nodes", "30000", "--log-every", "0"],
    "kmeans": ["--clusters", "512", "--dim", "32", "--iters", "20", "--log-every", "0"],
}
