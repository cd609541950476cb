"""Reliability: differential fuzzing against stock MPI, threads, the pool
segment's privacy, SIGINT, and bounded memory.

Every test launches whole MPI jobs (the programs in tests/scripts/ and
tools/fuzz.py) and compares with stock mpi4py where there is a result, in
the same job on the same MPI handle.  Nothing synchronises by sleeping: jobs
are read until they say they are ready, processes are waited for through
pidfds, and every launch has a timeout that kills what is left.
"""

from __future__ import annotations

import json
import os
import pwd
import re
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time

import pytest
from cxlmpi._pool import Pool
from harness import (
    ROOT,
    SMALL_POOL_ENV,
    _descendants,
    _remove_mpi_leftovers,
    _shm_names,
    launch_mpi,
    leaked_segments,
    mpi_env,
    mpiexec,
    our_segments,
)

FUZZ = "tools/fuzz.py"
THREADS = "tests/scripts/threads.py"
THREAD_RACES = "tests/scripts/thread_races.py"
SEGMENT = "tests/scripts/segment.py"
FOREVER = "tests/scripts/forever.py"
MEMORY = "tests/scripts/memory.py"
LARGE_COUNT = "tests/scripts/large_count.py"
TIMEOUT = 120  # s: kill a job still running after this


def tagged_json(stdout: str, tag: str):
    """The JSON after `tag` on the one line of `stdout` that starts with it."""
    found = [line[len(tag) + 1:] for line in stdout.splitlines()
             if line.startswith(tag + " ")]
    assert len(found) == 1, f"expected one {tag} line in:\n{stdout}"
    return json.loads(found[0])


# ------------------------------------------------------------- a. fuzzing


@pytest.mark.parametrize("nranks", [2, 3, 4])
def test_fuzz_small_pool(nranks: int) -> None:
    """A seeded random program of every collective, type, op, size, root,
    IN_PLACE, message form and communicator (tools/fuzz.py) gives the same
    results through the test-sized pool as stock MPI."""
    before = our_segments()
    ops = 1500
    job = launch_mpi(nranks, [FUZZ, "--ops", str(ops), "--seed", str(1000 + nranks)],
                     env=SMALL_POOL_ENV, timeout=TIMEOUT)
    assert job.returncode == 0, job.describe()
    found = re.findall(r"^FUZZ ops=(\d+) mismatches=(\d+) seconds=", job.stdout, re.M)
    assert found == [(str(ops), "0")], job.describe()
    calls = re.search(r"^fuzz: rank 0's pool calls: (.*)$", job.stdout, re.M)
    assert calls and "allreduce=" in calls.group(1), job.describe()  # the pool was used
    assert leaked_segments(before) == []


# ------------------------------------------------------------- b. threads


@pytest.mark.parametrize("pool", ["shm", "file", "adaptive"])
def test_threads_each_with_own_communicator(pool: str, tmp_path) -> None:
    """MPI_THREAD_MULTIPLE: three threads per rank, each on its own wrapped
    communicator, run pool Allreduce/Bcast/Allgather at the same time; every
    result equals stock MPI's on the thread's own plain communicator.
    First each thread sets up 100 fresh communicators in turn, so that the
    threads' pool set-ups overlap: a set-up step that waits for a peer with
    the GIL held (mpi4py's lower-case allreduce makes a duplicate
    communicator so) deadlocked 3 runs in 8.  On a
    pool file every partition is given back at exit -- the communicators'
    and every node heap (threads setting pools up at once may each make
    one).  `adaptive`: the threads' communicators learn at once, and every
    rank counts the same learning calls (whether a call is timed was
    process-wide state that another thread's call changed: the counts
    differed between ranks in 2 runs of 3)."""
    from cxlmpi.memory import backends

    nthreads, iterations, fresh = 3, 150, 100
    env = dict(SMALL_POOL_ENV)
    if pool == "file":
        env["CXLMPI_POOL"] = f"file:{tmp_path / 'pool'}"
    if pool == "adaptive":
        env.update(CXLMPI_TUNING="adaptive", CXLMPI_CACHE="off")
    job = launch_mpi(2, [THREADS, str(nthreads), str(iterations), str(fresh)], env=env,
                     timeout=TIMEOUT)
    assert job.returncode == 0, job.describe()
    if job.stdout.startswith("SKIP "):
        pytest.skip(job.stdout.strip())
    everyone = tagged_json(job.stdout, "THREADS")
    assert [rep["rank"] for rep in everyone] == [0, 1]
    for rep in everyone:
        assert len(rep["threads"]) == nthreads
        for thread in rep["threads"]:
            assert thread == {"ok": True, "calls": 4 * iterations, "error": None}, rep
        if pool == "adaptive":
            continue
        # Every call of every thread took the pool path.
        assert rep["pool_calls"] == {"allreduce": nthreads * (2 * iterations + fresh),
                                     "bcast": nthreads * iterations,
                                     "allgather": nthreads * iterations}, rep
    if pool == "file":
        dev = backends._open(backends.parse_spec(env["CXLMPI_POOL"]), create=False)
        dev.check_header(format_if_empty=False)
        assert dev.entries() == [], dev.entries()
    if pool == "adaptive":
        learning = [rep["learning"] for rep in everyone]
        assert learning[0] == learning[1] and sum(learning[0].values()) > 0, learning


@pytest.mark.parametrize("mode, args, env, jobs", [
    # a pool file whose one-host and several-host windows differ: hung 9
    # runs in 21 (CXLMPITimeoutError on one rank, MPI on the other)
    ("tables", ["200"], {"CXLMPI_HOSTS_THRESHOLD": "1M"}, 1),
    # first calls at once: hung 3 runs in 32 (4 and 8 threads), failed 2
    # jobs in 15 here; a process reads its settings once, so several jobs
    ("first-calls", ["8"], {}, 4),
    # a finalizer inside the switch of the cached communicator: wrong
    # blocks in every run
    ("finalizer", [], {}, 1),
])
def test_threads_never_share_a_calls_state(mode: str, args: list[str], env: dict,
                                           jobs: int, tmp_path) -> None:
    """What one call of the hot path keeps between its steps is its own:
    another thread's call (or a finalizer) in between never changes the
    windows it reads, the settings it starts from, or the communicator it
    runs on.  Every result equals stock MPI's; the failures before are
    noted by each case."""
    env = {**SMALL_POOL_ENV, "CXLMPI_TIMEOUT": "20", **env}
    if mode == "tables":
        env["CXLMPI_POOL"] = f"file:{tmp_path / 'pool'}"
    for _ in range(jobs):
        job = launch_mpi(2, [THREAD_RACES, mode, *args], env=env, timeout=TIMEOUT)
        assert job.returncode == 0, job.describe()
        for rep in tagged_json(job.stdout, "RESULT"):
            assert rep["error"] is None and rep["wrong"] == 0 and rep["calls"] >= 1, rep


# ------------------------------------------------------------ c. security


def test_segment_private_and_unlinked_once_mapped() -> None:
    """Inside a job, after the first pool collective: its two segments --
    the communicator's pool, without arenas, and the node heap of
    pool-resident arrays it shares -- have no name in /dev/shm (they never
    had one: O_TMPFILE), each rank maps each of them once, files of
    /dev/shm, "(deleted)", at its size, and (where
    /proc/self/map_files is readable) the files are mode 0600 and owned by
    the job's user."""
    before = our_segments()
    job = launch_mpi(2, [SEGMENT], env={"CXLMPI_POOL_SIZE": "4M", "CXLMPI_ARENA_SIZE": "2M",
                                        "CXLMPI_TUNING": "pool"},
                     timeout=TIMEOUT)
    assert job.returncode == 0, job.describe()
    everyone = tagged_json(job.stdout, "SEGMENT")
    assert len({json.dumps(rep["segments"]) for rep in everyone}) == 1, everyone
    pool, heap = everyone[0]["segments"]
    assert pool["nbytes"] == Pool.mapping_nbytes(2, 4 << 20, 0), pool
    assert heap["arena"] == 2 << 20 and heap["nbytes"] > 2 * heap["arena"], heap
    for rep in everyone:
        assert rep["allreduce_close"] and rep["pool_calls"] == 1, rep
        assert {m["path"] for m in rep["maps"]} == {
            f"/dev/shm/#{seg['inode']} (deleted)" for seg in (pool, heap)}, rep
        for seg in (pool, heap):
            assert seg["name"].startswith("/cxlmpi-") and not seg["exists"], rep
            # one mapping (the heap's arenas, asked for huge pages, may be a
            # second kernel area right after the first)
            areas = sorted((int(m["range"].split("-")[0], 16), int(m["range"].split("-")[1], 16))
                           for m in rep["maps"] if m["inode"] == seg["inode"])
            assert all(a[1] == b[0] for a, b in zip(areas, areas[1:])), rep
            assert areas[-1][1] - areas[0][0] == seg["nbytes"], rep
            assert all(m["perms"] == "rw-s" for m in rep["maps"]), rep
        for file in rep["files"]:
            if file["mode"] is not None:
                assert file["mode"] == 0o600 and file["uid"] == rep["uid"], rep
    assert leaked_segments(before) == []


# Holds a live segment: created with Pool.create (unnamed: argv[1] == "1"),
# what others open it by (its /dev/shm path, or its /proc/PID/fd path) and
# whether /dev/shm shows it on stdout; closed (unmapped and unlinked) when a
# line arrives on stdin, or killed.  A process of its own so that the test
# process never initializes MPI (importing cxlmpi does).
_OWNER = """\
import os, sys
from cxlmpi._pool import Pool
pool = Pool.create(0, 2, 1 << 20, unnamed=sys.argv[1] == "1")
path = pool.locator[0] if isinstance(pool.locator, tuple) else "/dev/shm" + pool.name
st = os.stat(path)
print(path, oct(st.st_mode & 0o7777), st.st_uid, os.path.exists("/dev/shm" + pool.name),
      flush=True)
sys.stdin.readline()
pool.close()
print("CLOSED", os.path.exists("/dev/shm" + pool.name), flush=True)
"""

# Run as another user: try to open the segment.
_INTRUDER = """\
import os, sys
print("UID", os.getuid(), flush=True)
try:
    with open(sys.argv[1], "rb") as f:
        print("OPENED", len(f.read(64)), flush=True)
except OSError as exc:
    print("REFUSED", type(exc).__name__, flush=True)
"""


def _run_as(user: pwd.struct_passwd, args: list[str]) -> subprocess.CompletedProcess:
    """Run `python -I -S -c args...` as `user` (skipping the test when no
    Python this user may execute is found)."""
    why = []
    # This interpreter may live where the user cannot go (a venv under /root).
    for python in dict.fromkeys([sys.executable, shutil.which("python3", path="/usr/bin:/bin")]):
        if python is None:
            continue
        try:
            proc = subprocess.run([python, "-I", "-S", "-c", *args], cwd="/", env={},
                                  user=user.pw_uid, group=user.pw_gid, extra_groups=[],
                                  capture_output=True, text=True, timeout=60)
        except (OSError, subprocess.SubprocessError) as exc:
            why.append(f"{python}: {exc}")
            continue
        if f"UID {user.pw_uid}" in proc.stdout:
            return proc
        why.append(f"{python}: {proc.stderr.strip()}")
    pytest.skip(f"cannot run Python as {user.pw_name}: {'; '.join(why)}")


def _start_owner(unnamed: bool) -> tuple[subprocess.Popen, list[str]]:
    owner = subprocess.Popen([sys.executable, "-c", _OWNER, "1" if unnamed else "0"],
                             cwd=ROOT, env=mpi_env(), stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    line = owner.stdout.readline()
    assert line, owner.communicate(timeout=30)[1]
    return owner, line.split()


@pytest.mark.parametrize("unnamed", [True, False])
def test_segment_closed_to_other_users(unnamed: bool) -> None:
    """A live segment (made by Pool.create and not unlinked) is mode 0600:
    a process running as `nobody` cannot open it (PermissionError), by its
    name in /dev/shm or, unnamed, through its creator's /proc/PID/fd;
    closing the pool unlinks a name."""
    if os.geteuid() != 0:
        pytest.skip("needs root to run a process as another user")
    try:
        nobody = pwd.getpwnam("nobody")
    except KeyError:
        pytest.skip("no user nobody")
    owner, (path, mode, uid, named) = _start_owner(unnamed)
    try:
        assert mode == "0o600" and int(uid) == os.getuid()
        assert path.startswith("/proc/" if unnamed else "/dev/shm/cxlmpi-"), path
        assert named == str(not unnamed)
        intruder = _run_as(nobody, [_INTRUDER, path])
        assert "REFUSED PermissionError" in intruder.stdout, intruder.stdout
        assert os.path.exists(path)  # still live while the test ran
    finally:
        out, err = owner.communicate("close\n", timeout=30)
    assert owner.returncode == 0, err
    assert out.split() == ["CLOSED", "False"], (out, err)


def test_a_killed_creator_leaves_no_segment() -> None:
    """A pool's segment has no name while it lives, so a job killed at any
    moment -- before its ranks have mapped it and the name was removed, as
    with a named one -- leaves nothing in /dev/shm (the named fallback,
    for ranks that cannot reach /proc, does)."""
    for unnamed in (True, False):
        before = set(our_segments())
        owner, (path, _, _, named) = _start_owner(unnamed)
        owner.kill()
        owner.communicate(timeout=30)
        left = set(our_segments()) - before
        if unnamed:
            assert named == "False" and not left, (path, left)
        else:   # (the fallback's window, removed here by hand)
            assert named == "True" and len(left) == 1, left
            os.unlink("/dev/shm/" + left.pop())


def test_a_rank_in_another_pid_namespace_gets_a_named_segment() -> None:
    """Rank 1 in a pid namespace of its own (a container, say) cannot open
    the pool's unnamed segment through rank 0's /proc: rank 0 names it,
    rank 1 maps it by the name, the name is removed once both have, and
    the pool's Allreduce equals stock MPI's."""
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        pytest.skip("needs root and unshare(1)")
    if os.environ.get("CXLMPI_TEST_OPENMPI"):
        pytest.skip("MPICH's launcher syntax and settings")
    before = our_segments()
    script = "tests/scripts/pid_namespace.py"
    # (MPI itself across pid namespaces: TCP, no cross-memory attach)
    job = launch_mpi(1, [script, ":", "-n", "1", "unshare", "--pid", "--fork",
                         "--mount-proc", sys.executable, script],
                     env={"CXLMPI_TUNING": "pool", "UCX_TLS": "tcp,self",
                          "MPIR_CVAR_CH4_CMA_ENABLE": "0"}, timeout=TIMEOUT)
    assert job.returncode == 0, job.describe()
    result = tagged_json(job.stdout, "RESULT")
    assert result["pids"][1] == 1, result          # the premise: a namespace of its own
    assert result["ok"] and result["pool_calls"] == [1, 1], result
    name = result["locators"][0]
    assert result["locators"] == [name, name] and name.startswith("/cxlmpi-"), result
    assert not os.path.exists("/dev/shm" + name)
    assert leaked_segments(before) == []


# -------------------------------------------------------------- d. SIGINT


def _read_until(stream, tag: str, deadline: float) -> str | None:
    """Read lines of a pipe until one starts with `tag` (returned) or the
    deadline passes or the pipe closes (None)."""
    buf = b""
    fd = stream.fileno()
    while True:
        left = deadline - time.monotonic()
        if left <= 0 or not select.select([fd], [], [], left)[0]:
            return None
        chunk = os.read(fd, 4096)
        if not chunk:
            return None
        buf += chunk
        for line in buf.decode(errors="replace").splitlines():
            if line.startswith(tag + " "):
                return line
        buf = buf[buf.rfind(b"\n") + 1:]


def _wait_gone(pids: list[int], deadline: float) -> list[int]:
    """Wait (pidfds, no polling) until every process in `pids` has ended or
    the deadline passes; returns those still running."""
    fds = {}
    for pid in pids:
        try:
            fds[os.pidfd_open(pid)] = pid
        except ProcessLookupError:
            pass
    try:
        waiting = set(fds)
        while waiting:
            left = deadline - time.monotonic()
            ready = select.select(list(waiting), [], [], max(left, 0))[0] if left > 0 else []
            if not ready:
                break
            waiting -= set(ready)
        return sorted(fds[fd] for fd in waiting)
    finally:
        for fd in fds:
            os.close(fd)


def test_sigint_ends_every_rank_and_leaves_no_segment() -> None:
    """SIGINT to mpiexec while both ranks loop in pool collectives: mpiexec
    exits, every rank ends within 20 s, and no segment is left."""
    if not hasattr(os, "pidfd_open"):
        pytest.skip("needs os.pidfd_open")
    before = our_segments()
    shm_before = _shm_names()
    cmd = [*mpiexec(), "-n", "2", sys.executable, "-m", "cxlmpi", FOREVER]
    with tempfile.TemporaryFile("w+") as err:
        proc = subprocess.Popen(cmd, cwd=ROOT, env=mpi_env(SMALL_POOL_ENV),
                                stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=err)
        pids: list[int] = []
        try:
            ready = _read_until(proc.stdout, "READY", time.monotonic() + 60)
            err.seek(0)
            assert ready is not None, f"no READY line; stderr:\n{err.read()[-4000:]}"
            pids = [int(p) for p in ready.split()[1:]]
            assert len(pids) == 2, ready
            proc.send_signal(signal.SIGINT)
            deadline = time.monotonic() + 20
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                pytest.fail("mpiexec still running 20 s after SIGINT")
            assert _wait_gone(pids, deadline) == [], "ranks still running 20 s after SIGINT"
        finally:
            if proc.poll() is None:
                for pid in _descendants(proc.pid) + pids:
                    try:
                        os.kill(pid, signal.SIGKILL)
                    except ProcessLookupError:
                        pass
                proc.kill()
                proc.wait()
            proc.stdout.close()
            _remove_mpi_leftovers(shm_before)  # MPI's own, left by the interrupt
    assert leaked_segments(before) == []
    assert [n for n in our_segments() if n not in before] == []


# ---------------------------------------------------------- e. memory bound


def test_memory_bounded() -> None:
    """2000 back-to-back pool collectives of 64 KiB to 3 MiB (each equal to
    stock MPI's) grow no rank's resident memory by 8 MiB after warm-up, and
    a 64 MiB Allreduce with an 8 MiB pool maps exactly 8 MiB."""
    env = {"CXLMPI_POOL_SIZE": "8M", "CXLMPI_ARENA_SIZE": "0", "CXLMPI_TUNING": "pool"}
    job = launch_mpi(2, [MEMORY, "2000", "64"], env=env, timeout=TIMEOUT)
    assert job.returncode == 0, job.describe()
    everyone = tagged_json(job.stdout, "MEMORY")
    assert [rep["rank"] for rep in everyone] == [0, 1]
    for rep in everyone:
        assert rep["ok"] and rep["big_ok"], rep
        assert rep["big_nbytes"] == 64 << 20
        assert rep["pool_calls"] == {"allreduce": 501, "bcast": 500, "allgather": 500,
                                     "reduce_scatter_block": 500}, rep
        grown = rep["rss_end"] - rep["rss_warm"]
        assert grown < 8 << 20, f"rank {rep['rank']}: VmRSS grew {grown / 2**20:.1f} MiB"
        assert rep["pool_mappings"] == [8 << 20], rep


# ------------------------------------------------------ f. a count above 2**31


def test_count_above_2_31_elements() -> None:
    """An Allreduce of 2**31 + 64 int8 elements through the pool equals
    stock's (mpi4py supports large counts; the pool must too)."""
    with open("/proc/meminfo") as f:
        avail_kib = next(int(line.split()[1]) for line in f if line.startswith("MemAvailable"))
    if avail_kib < 16 << 20:
        pytest.skip("needs 16 GiB of free memory (two ranks x three 2 GiB buffers)")
    job = launch_mpi(2, [LARGE_COUNT], timeout=240)
    assert job.returncode == 0, job.describe()
    assert "RESULT ok 2147483712" in job.stdout, job.describe()


# ------------------------------------------- g. counts whose byte size wraps


BAD_COUNTS = "tests/scripts/bad_counts.py"


def test_absurd_counts_raise_on_every_rank() -> None:
    """Counts and displacements whose byte size wraps a 64-bit integer
    around (2**61 + 1024 doubles "fit" an 8 KiB buffer), in every message
    form and collective, every rank passing the same: each call raises a
    clear ValueError before touching memory (stock's own exception where
    stock rejects the message), no crash, no hang, and the communicator is
    still in step afterwards (an Allreduce equal to stock's)."""
    env = dict(SMALL_POOL_ENV, CXLMPI_TIMEOUT="20")
    job = launch_mpi(2, [BAD_COUNTS], env=env, timeout=TIMEOUT)
    assert job.returncode == 0, job.describe()
    checks = tagged_json(job.stdout, "CHECKS")
    assert [name for name, ok in checks.items() if not ok] == [], job.describe()


# ---------------------------------- h. objects that one rank cannot send

OBJECTS_ERRORS = "tests/scripts/objects_errors.py"


@pytest.mark.parametrize("nranks", [2, 3])
def test_an_object_one_rank_cannot_send_fails_there_as_stock(nranks: int) -> None:
    """With CXLMPI_OBJECTS=1, a scatter list of the wrong length on the
    root, an alltoall list of the wrong length on one rank, an object that
    does not pickle in a gather or at a bcast's root: that rank raises
    stock mpi4py's own error, and the others wait in MPI, as under stock,
    where the raising rank's repeat of the call on the plain communicator
    gives them its data.  Before, that rank raised while the others waited
    in the pool's header step, and they were told it had died."""
    env = {"CXLMPI_OBJECTS": "1", "CXLMPI_TIMEOUT": "20"}
    job = launch_mpi(nranks, [OBJECTS_ERRORS], env=env, timeout=TIMEOUT)
    assert job.returncode == 0 and not job.timed_out, job.describe()
    results = tagged_json(job.stdout, "RESULT")

    def item(q: int) -> list:
        return [65536, f"{q % 251:02x}"]

    expected = {   # (the rank that cannot send, what each rank receives)
        "scatter: root's list one too long": (0, [item(q) for q in range(nranks)]),
        "alltoall: one rank's list one too short":
            (nranks - 1, [[item(q) for q in range(nranks)]] * nranks),
        "gather: one rank's object does not pickle":
            (nranks - 1, [[item(q) for q in range(nranks)]] + [None] * (nranks - 1)),
        "bcast: the root's object does not pickle": (0, [item(7)] * nranks),
    }
    for case, (bad, got) in expected.items():
        per_rank = results[case]
        for q, (error, stock_error, received) in enumerate(per_rank):
            if q == bad:
                assert error is not None and error == stock_error, (case, per_rank)
            else:
                assert error is None, (case, per_rank)
            assert received == got[q], (case, per_rank)
    assert results["allgather after"] == [True] * nranks
