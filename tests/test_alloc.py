"""The NumPy allocation hook (CXLMPI_ALLOC=1, `python -m cxlmpi --alloc`):
unmodified code's large arrays live in the pool, and collectives on them
give stock MPI's results."""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys

import pytest
from harness import EXAMPLES, ROOT, launch_mpi, mpi_env, mpiexec, run_launcher, run_mpi

SCRIPT = "tests/scripts/alloc_hook.py"
ENV = {"CXLMPI_ZEROCOPY_THRESHOLD": "64K", "CXLMPI_ARENA_SIZE": "64M",
       "CXLMPI_TUNING": "pool"}


def findings(stdout: str) -> list[dict]:
    [line] = [x for x in stdout.splitlines() if x.startswith("ALLOC ")]
    return json.loads(line[len("ALLOC "):])


@pytest.mark.parametrize("nranks", [2, 3])
def test_numpy_arrays_land_in_the_pool(nranks: int) -> None:
    out = run_mpi(nranks, ["-m", "cxlmpi", "--alloc", SCRIPT], env=ENV)
    for rank, got in enumerate(findings(out.stdout)):
        assert got["active"] and got["a_in_pool"] and got["b_in_pool"], (rank, got)
        assert not got["small_in_pool"], (rank, got)
        assert got["allreduce_ok"] and got["bcast_ok"] and got["after_free_ok"], (rank, got)
        assert got["pool_allocs"] >= 4 and got["live_after_del"] == 0, (rank, got)
        # the node heap: used in place by a Dup too; NumPy may fill the arena
        assert got["dup_in_pool"] and got["dup_zerocopy"] == 1, (rank, got)
        assert got["arena_bytes"] == 64 << 20 and got["most_of_arena_in_pool"], (rank, got)


def test_alloc_threshold_sets_the_hook_apart() -> None:
    """CXLMPI_ALLOC_THRESHOLD above the script's 2 MiB arrays: the hook is
    on, but they stay private (CXLMPI_ZEROCOPY_THRESHOLD still 64K); results
    as stock MPI's."""
    out = run_mpi(2, ["-m", "cxlmpi", "--alloc", SCRIPT],
                  env=dict(ENV, CXLMPI_ALLOC_THRESHOLD="4M"))
    for got in findings(out.stdout):
        assert got["active"] and not got["a_in_pool"] and not got["b_in_pool"], got
        assert got["allreduce_ok"] and got["bcast_ok"] and got["after_free_ok"], got


def test_off_by_default() -> None:
    out = run_mpi(2, ["-m", "cxlmpi", SCRIPT], env=ENV)
    for got in findings(out.stdout):
        assert not got["active"] and not got["a_in_pool"], got
        assert got["allreduce_ok"] and got["bcast_ok"] and got["after_free_ok"], got


@pytest.mark.parametrize("pool", ["shm", "file"])
@pytest.mark.parametrize("when", ["early", "late"])
def test_arrays_after_mpi_finalize(pool: str, when: str, tmp_path) -> None:
    """After an explicit MPI.Finalize() (arrays a program makes at its
    end), cxlmpi.zeros gives a private array as NumPy would, with the hook
    on too; a pool array made before keeps its contents.  Before, it set a
    pool up through MPI: MPICH aborted the process ("after finalizing")."""
    env = dict(ENV, AFTER_FINALIZE=when,
               CXLMPI_POOL="shm" if pool == "shm" else f"file:{tmp_path / 'pool'}")
    out = run_mpi(2, ["-m", "cxlmpi", "--alloc", "tests/scripts/after_finalize.py"], env=env)
    # (the ranks' lines may reach mpiexec's output run together)
    found = [json.loads(x) for x in re.findall(r"AFTER (\{[^}]*\})", out.stdout)]
    assert len(found) == 2, out.stdout
    for got in found:
        assert all(got.values()) and len(got) == (2 if when == "early" else 4), got


@pytest.mark.parametrize("pool", ["shm", "file"])
def test_forked_child_never_touches_the_parent_pool(pool: str, tmp_path) -> None:
    """A forked child's allocations are private, its frees of inherited pool
    arrays and its pool close are no-ops for the parent: the parent's later
    pool arrays keep their contents, and every rank stays attached."""
    env = dict(ENV, CXLMPI_POOL="shm" if pool == "shm" else f"file:{tmp_path / 'pool'}")
    out = run_mpi(2, ["-m", "cxlmpi", "--alloc", "tests/scripts/fork_child.py"], env=env)
    [line] = [x for x in out.stdout.splitlines() if x.startswith("FORK ")]
    for rank, got in enumerate(json.loads(line[len("FORK "):])):
        assert got["hooked"] and got["later_in_pool"], (rank, got)
        assert got["child_hook_private"] and got["child_empty_private"], (rank, got)
        assert got["child_sees_inherited"] and got["parent_arrays_intact"], (rank, got)
        assert got["allreduce_ok"], (rank, got)
        if pool == "file":
            assert got["attached"] == [0, 1], (rank, got)


def _small_shm_job(env: dict[str, str], args: list[str] | None = None,
                   runner: tuple[str, ...] = ("-m", "cxlmpi", "--alloc"),
                   before: str = "") -> subprocess.CompletedProcess:
    """The job of `python -m cxlmpi --alloc` (`runner`) with `args` (default
    tests/scripts/small_shm.py) on 2 ranks in a private mount namespace
    whose /dev/shm is a 64 MiB tmpfs (Docker's default), after the shell
    commands `before` (run there)."""
    if shutil.which("unshare") is None:
        pytest.skip("no unshare")
    probe = subprocess.run(["unshare", "-m", "sh", "-c",
                            "mount -t tmpfs -o size=64m tmpfs /dev/shm"],
                           capture_output=True)
    if probe.returncode != 0:
        pytest.skip("private mount namespaces are not permitted here")
    cmd = " ".join(shlex.quote(x) for x in [*mpiexec(), "-n", "2", sys.executable, *runner,
                                            *(args or ["tests/scripts/small_shm.py"])])
    return run_launcher(
        ["unshare", "-m", "sh", "-c",
         f"mount -t tmpfs -o size=64m tmpfs /dev/shm && {before or 'true'} && {cmd}"],
        cwd=ROOT, env=mpi_env(env), timeout=240)


@pytest.mark.parametrize("pool_size", ["64M", "4M"])
def test_small_dev_shm_never_sigbus(pool_size: str) -> None:
    """64M: the pool itself cannot be had (MPI pass-through); 4M: the pool
    can, the 32 MiB arrays mostly cannot (private memory).  Either way the
    results equal stock MPI's and each rank warns once."""
    out = _small_shm_job({"CXLMPI_POOL_SIZE": pool_size, "CXLMPI_TUNING": "pool",
                          "CXLMPI_TIMEOUT": "60"})
    assert out.returncode == 0, out.stderr[-4000:]
    [line] = [x for x in out.stdout.splitlines() if x.startswith("SMALL ")]
    assert all(r["ok"] for r in json.loads(line[len("SMALL "):])), line
    warnings = [x for x in out.stderr.splitlines() if x.startswith("cxlmpi: warning")]
    assert 1 <= len(warnings) <= 2, out.stderr[-4000:]
    assert "shared memory" in warnings[0], warnings


@pytest.mark.parametrize("when", ["first", "later"])
def test_a_file_pool_on_a_full_dev_shm_goes_to_mpi(when: str) -> None:
    """A file: pool on a /dev/shm that another process has filled (a few
    pages left): before the pool file exists ("first": no room for its
    partition table) or after its table and a partition were made
    ("later": no room for another partition).  Stock MPI runs there, so
    cxlmpi must: its Allreduces go to MPI, equal stock's, with a warning.
    Before, reading the unreserved table, or the control lines of the
    partition it gave back, killed the process with SIGBUS.  ("first"
    leaves 16 KiB, a quarter of the table: Open MPI's own shared memory
    faults pages in as it goes, and on a tmpfs with none left it dies of
    SIGBUS itself, cxlmpi or not.)"""
    out = _small_shm_job({"CXLMPI_POOL": "file:/dev/shm/cxlmpi-pool", "CXLMPI_TUNING": "pool",
                          "CXLMPI_POOL_SIZE": "4M", "CXLMPI_ARENA_SIZE": "0",
                          "CXLMPI_TIMEOUT": "60", "FULL_SHM": when,
                          "FULL_SHM_LEAVE": "16384" if when == "first" else "0"},
                         ["tests/scripts/full_shm.py"], runner=("-m", "cxlmpi"))
    assert out.returncode == 0, out.stderr[-4000:]
    [line] = [x for x in out.stdout.splitlines() if x.startswith("FULL ")]
    assert all(r["ok"] for r in json.loads(line[len("FULL "):])), line
    assert "shared memory" in out.stderr, out.stderr[-4000:]


def test_a_kept_pool_makes_room_for_a_new_one() -> None:
    """On a 64 MiB /dev/shm with 40 MiB pools, a freed communicator's pool
    (kept for the next communicator of the same ranks) is let go when
    another set of ranks needs a pool that does not fit beside it: that
    communicator's Allreduce still goes through the pool, with no warning,
    and equals stock's.  Before, it found no room and went to MPI."""
    out = _small_shm_job({"CXLMPI_POOL_SIZE": "40M", "CXLMPI_TUNING": "pool",
                          "CXLMPI_ARENA_SIZE": "0", "CXLMPI_TIMEOUT": "60"},
                         ["tests/scripts/spare_room.py"], runner=())
    assert out.returncode == 0, out.stderr[-4000:]
    [line] = [x for x in out.stdout.splitlines() if x.startswith("SPARE ")]
    assert json.loads(line[len("SPARE "):]) == {"ok": True, "pool": 2}, line
    assert "cxlmpi: warning" not in out.stderr, out.stderr[-4000:]


def test_a_short_pool_goes_to_mpi_without_asking_again() -> None:
    """A 32 MiB pool on a 64 MiB /dev/shm that a 40 MiB file fills: its
    data halves cannot be had.  Rank 0 tries to reserve them once (at the
    first call; no spares to let go; the one file every rank maps: the
    others never ask), refused before fallocate runs, so /dev/shm never
    fills up; the 40 Allreduces and Bcasts go to MPI and
    equal stock's.  Before, every call ran the ready step again, and its
    fallocate filled the tmpfs page by page before giving up (~100 ms a
    call, other processes' writes to /dev/shm failing meanwhile)."""
    out = _small_shm_job({"CXLMPI_POOL_SIZE": "32M", "CXLMPI_ARENA_SIZE": "0",
                          "CXLMPI_TUNING": "pool", "CXLMPI_TIMEOUT": "60"},
                         ["tests/scripts/short_retry.py"], runner=(),
                         before="dd if=/dev/zero of=/dev/shm/filler bs=1M count=40 "
                                "status=none")
    assert out.returncode == 0, out.stderr[-4000:]
    [line] = [x for x in out.stdout.splitlines() if x.startswith("SHORT ")]
    found = json.loads(line[len("SHORT "):])
    assert found == [{"ok": True, "ready_steps": 1, "refused": 1 - (rank > 0), "pool": 0}
                     for rank in range(2)], found
    warnings = [x for x in out.stderr.splitlines() if x.startswith("cxlmpi: warning")]
    assert len(warnings) == 2 and all("shared memory" in w for w in warnings), warnings


def test_a_short_group_pool_beside_a_group_of_one_goes_to_mpi() -> None:
    """3 ranks in 2 pool groups ([0, 1] with the node heap, [2] a group of
    one without), and a pool larger than /dev/shm (the kernel refuses it at
    once): every rank reaches the same verdict, MPI alone, and the
    Allreduces equal stock's.  Before, only the group that had asked for
    arenas of its own retried without them, its retry's collectives paired
    with the others' different ones, and rank 2 waited in Split for ever."""
    fs = os.statvfs("/dev/shm")
    if fs.f_blocks == 0:
        pytest.skip("/dev/shm has no size limit here")
    beyond = (fs.f_blocks * fs.f_frsize >> 30) + 2
    job = launch_mpi(3, ["tests/scripts/groups_short.py"], env={
        "CXLMPI_POOL_GROUPS": "2", "CXLMPI_POOL_SIZE": f"{beyond}G",
        "CXLMPI_ARENA_SIZE": "8M", "CXLMPI_TUNING": "pool", "CXLMPI_TIMEOUT": "30"},
        timeout=90)
    assert job.returncode == 0, job.describe()
    [line] = [x for x in job.stdout.splitlines() if x.startswith("GROUPS ")]
    assert json.loads(line[len("GROUPS "):]) == {"ok": True, "pool": 0, "mpi": 3}, line


@pytest.mark.parametrize("tuning", ["adaptive", "pool"])
def test_many_dups_cost_what_their_pools_carry(tuning: str) -> None:
    """40 live Dups, each with one 64 KiB Allreduce, on a 64 MiB /dev/shm
    with 16 MiB pools: each Dup's pool reserves its data halves only when
    a call first moves data through it.  adaptive: the one call of each
    goes to MPI (a class's first call), and the Dups take less /dev/shm
    than one pool (before, 16 MiB each until /dev/shm was full, where
    Open MPI's own shared memory dies of SIGBUS).  pool: the first Dups'
    calls run in their pools until /dev/shm is full, the others' go to MPI
    (their pools agree on it at their first call), with one warning a
    rank.  Results equal stock's either way."""
    out = _small_shm_job({"CXLMPI_POOL_SIZE": "16M", "CXLMPI_TUNING": tuning,
                          "CXLMPI_CACHE": "off", "CXLMPI_ARENA_SIZE": "0",
                          "CXLMPI_TIMEOUT": "60", "MANY_DUPS": "40"},
                         ["tests/scripts/many_dups.py"], runner=())
    assert out.returncode == 0, out.stderr[-4000:]
    [line] = [x for x in out.stdout.splitlines() if x.startswith("DUPS ")]
    got = json.loads(line[len("DUPS "):])
    assert got["ok"], got
    warnings = [x for x in out.stderr.splitlines() if x.startswith("cxlmpi: warning")]
    if tuning == "adaptive":
        assert got["pool"] == 0 and got["taken_mib"] < 16, got
        assert not warnings, out.stderr[-4000:]
    else:
        assert got["pool"] > 0 and got["mpi"] > 0, got
        assert len(warnings) == 2 and all("shared memory" in w for w in warnings), warnings


@pytest.mark.parametrize("pool_size", ["64M", "2G"])
def test_a_limited_address_space_falls_back(pool_size: str) -> None:
    """Under ulimit -v 2000000 (which stock MPI runs within) the node heap
    (1 GiB a rank) cannot be mapped: pool-resident arrays are private, and
    the 64M pool still runs the Allreduces; a 2G pool cannot be mapped
    either, and they go to MPI.  Results equal stock's, one warning a rank.
    Before, mmap's ENOMEM aborted the job."""
    script = ["tests/scripts/address_space.py"]
    limit = "ulimit -v 2000000; "
    stock = run_launcher(["bash", "-c", limit + " ".join(
        shlex.quote(x) for x in [*mpiexec(), "-n", "2", sys.executable, *script])],
        cwd=ROOT, env=mpi_env({"ASPACE_STOCK": "1"}), timeout=240)
    assert stock.returncode == 0, stock.stderr[-4000:]
    assert "ASPACE " in stock.stdout and '"ok": false' not in stock.stdout, stock.stdout
    out = run_launcher(["bash", "-c", limit + " ".join(
        shlex.quote(x) for x in [*mpiexec(), "-n", "2", sys.executable, "-m", "cxlmpi",
                                 *script])],
        cwd=ROOT, env=mpi_env({"CXLMPI_POOL_SIZE": pool_size, "CXLMPI_TUNING": "pool",
                               "CXLMPI_TIMEOUT": "60"}),
        timeout=240)
    assert out.returncode == 0, out.stderr[-4000:]
    [line] = [x for x in out.stdout.splitlines() if x.startswith("ASPACE ")]
    found = json.loads(line[len("ASPACE "):])
    assert all(r["ok"] for r in found), found
    if pool_size == "64M":
        assert all(r["pool"] == 3 for r in found), found
    else:
        assert all(r["mpi"] == 3 for r in found), found
    warnings = [x for x in out.stderr.splitlines() if x.startswith("cxlmpi: warning")]
    assert len(warnings) == 2 and all("ulimit -v" in w for w in warnings), warnings


@pytest.mark.parametrize("pool_size", ["64M", "4M"])
@pytest.mark.parametrize("name", ["train_allreduce", "jacobi_solver", "pagerank", "kmeans"])
def test_examples_on_a_small_dev_shm(name: str, pool_size: str) -> None:
    """Every example under --alloc in a container's 64 MiB /dev/shm prints
    stock MPI's RESULT: with the default pool (which does not fit: MPI
    alone) and with a 4 MiB one (the pool fits, most arrays do not)."""
    script = [f"examples/{name}.py", *EXAMPLES[name]]
    stock = run_mpi(2, script)
    out = _small_shm_job({"CXLMPI_POOL_SIZE": pool_size, "CXLMPI_TIMEOUT": "60"}, script)
    assert out.returncode == 0, out.stderr[-4000:]
    result = [x for x in stock.stdout.splitlines() if x.startswith("RESULT ")]
    assert len(result) == 1 and result[0] in out.stdout.splitlines(), out.stdout[-2000:]


@pytest.mark.parametrize("huge,flag", [(None, None), ("always", None), ("within_size", None),
                                       ("advise", None), ("always", "--no-alloc"),
                                       (None, "--alloc")])
def test_huge_pages_as_reported(huge: str | None, flag: str | None) -> None:
    """What `--info` says of huge pages for pool arrays is what the kernel
    does: a pool array's mapping is PMD-mapped (smaps) exactly when the
    report says yes -- on this machine's /dev/shm as it is, and on a tmpfs
    mounted with each huge= policy in a private mount namespace (huge pages
    there under always and within_size; not under advise, since pool memory
    is reserved before it is mapped).  NumPy's arrays go to the pool by
    default exactly there (CXLMPI_ALLOC=auto), unless --no-alloc; --alloc
    places them anywhere.  The Allreduce of such an array equals stock's."""
    cmd = [*mpiexec(), "-n", "2", sys.executable, "-m", "cxlmpi", *([flag] if flag else []),
           "tests/scripts/huge_pages.py"]
    env = mpi_env({"CXLMPI_ARENA_SIZE": "128M"})
    env.pop("CXLMPI_ALLOC", None)
    if huge is None:
        out = run_launcher(cmd, cwd=ROOT, env=env, timeout=120)
    else:
        if shutil.which("unshare") is None:
            pytest.skip("no unshare")
        mount = f"mount -t tmpfs -o size=1g,huge={huge} tmpfs /dev/shm"
        if subprocess.run(["unshare", "-m", "sh", "-c", mount], capture_output=True).returncode:
            pytest.skip("no private mount namespace, or no huge= for tmpfs here")
        out = run_launcher(["unshare", "-m", "sh", "-c",
                            f"{mount} && {' '.join(shlex.quote(x) for x in cmd)}"],
                           cwd=ROOT, env=env, timeout=120)
    assert out.returncode == 0, out.stderr[-4000:]
    [rows] = [json.loads(x[len("HUGE "):]) for x in out.stdout.splitlines()
              if x.startswith("HUGE ")]
    assert len(rows) == 2 and all(r["mapped"] == r["reported"] for r in rows), rows
    if huge in ("always", "within_size"):
        assert all(r["mapped"] for r in rows), rows
    hook = {"--alloc": True, "--no-alloc": False}.get(flag, rows[0]["reported"])
    assert all(r["hook"] == hook and r["placed"] == hook and r["same"] for r in rows), rows
