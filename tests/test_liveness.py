"""A rank that only stands still is not dead where the kernel can tell
(cxlmpi.memory.liveness, pyx/pool/liveness.pxi): whole MPI jobs whose rank 1 is
stopped (SIGSTOP, as docker pause or a debugger would) for many times its
lease while rank 0 waits for it in the pool (tests/scripts/paused_peer.py).
The partition table's side (claimers) is in tests/test_partitions.py."""

from __future__ import annotations

import json
import os
import shutil
import stat
import sys

import pytest
from harness import launch_mpi

from cxlmpi.memory import liveness

PAUSED = "tests/scripts/paused_peer.py"
HANDED_OVER = "tests/scripts/handed_over.py"
HANDED_HEAP = "tests/scripts/handed_heap.py"
TIMEOUT = 120                                           # s: kill a job still running after
LEASE = {"CXLMPI_HEARTBEAT": "0.05", "CXLMPI_LEASE_BEATS": "5"}   # 0.25 s; paused 2 s
# (MPI itself across pid namespaces: TCP, no cross-memory attach)
APART = {"UCX_TLS": "tcp,self", "MPIR_CVAR_CH4_CMA_ENABLE": "0"}


def _result(stdout: str) -> dict:
    [line] = [x for x in stdout.splitlines() if x.startswith("RESULT ")]
    return json.loads(line[len("RESULT "):])


def test_a_paused_rank_in_another_pid_namespace_is_waited_for() -> None:
    """Rank 1 in a pid namespace of its own, stopped for eight leases in
    the middle of a pool Allreduce: rank 0 waits, as with stock MPI, and
    both get stock MPI's result (before: "rank 1 died in the middle of the
    collective", judged by the still heartbeat)."""
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        pytest.skip("needs root and unshare(1)")
    if os.environ.get("CXLMPI_TEST_OPENMPI"):
        pytest.skip("MPICH's launcher syntax and settings")
    job = launch_mpi(1, [PAUSED, "namespace", ":", "-n", "1", "unshare", "--pid", "--fork",
                         "--mount-proc", "sh", "-c",
                         f"{sys.executable} {PAUSED} namespace; exit"],
                     env={"CXLMPI_TUNING": "pool", **LEASE, **APART}, timeout=TIMEOUT)
    assert job.returncode == 0, job.describe()
    result = _result(job.stdout)
    here, there = result["hosts"]          # the premise: one kernel, two pid namespaces
    assert here != there and liveness.same_kernel(here, there), result
    assert result == {**result, "ok": [True, True], "errors": [None, None]}, result


def test_a_paused_rank_on_another_host_is_named_with_its_lease() -> None:
    """Rank 1 as if on another host (only its heartbeat can be judged),
    stopped past its lease: rank 0 stops with an error that says how long
    it stood still, its lease, and which setting to raise (before: only
    "rank 1 died")."""
    job = launch_mpi(2, [PAUSED, "other-host"], env={"CXLMPI_TUNING": "pool", **LEASE},
                     timeout=TIMEOUT)
    assert job.returncode == 0, job.describe()
    error = _result(job.stdout)["errors"][0]
    assert error is not None and error.startswith("CXLMPIPeerError"), error
    assert "rank 1 runs on another host" in error and "stood still for" in error, error
    assert "lease of 0.25 s" in error and "raise CXLMPI_LEASE_BEATS" in error, error


def test_a_free_lock_of_a_device_proves_nothing(tmp_path) -> None:
    """A lock held through one node of a device is not seen through another
    node of it (each node is an inode of its own; containers given a devdax
    device by ``--device`` each have theirs): there a free lock is no
    verdict (the heartbeat decides), where on a regular file it is one.
    Before, a live owner seen through another node was "dead", and its
    partition handed to the next job."""
    other_node = tmp_path / "zero"
    try:
        os.mknod(other_node, 0o600 | stat.S_IFCHR, os.makedev(1, 5))   # /dev/zero again
    except OSError as exc:
        pytest.skip(f"cannot make a device node here: {exc}")
    regular = tmp_path / "pool"
    regular.write_bytes(b"\0" * 4096)
    for owner_path, observer_path, free_says in ((regular, regular, liveness.DEAD),
                                                  ("/dev/zero", other_node, liveness.UNKNOWN)):
        owner = os.open(owner_path, os.O_RDWR)
        observer = os.open(observer_path, os.O_RDWR)
        try:
            liveness.hold(owner, 64)
            seen_held = liveness.lock_verdict(observer, 64)
            liveness.drop(owner, 64)
            seen_free = liveness.lock_verdict(observer, 64)
        finally:
            os.close(owner)
            os.close(observer)
        if owner_path == observer_path:
            assert seen_held == liveness.ALIVE
        assert seen_free == free_says, (owner_path, observer_path, seen_free)
def _handed_over(tmp_path, script: str, arena_size: str) -> dict:
    """Run `script` (a handover between two calls) on 2 ranks over a file
    pool of its own; its RESULT."""
    pool = tmp_path / "pool"
    with open(pool, "wb") as f:
        f.truncate(64 << 20)
    pool.chmod(0o600)
    job = launch_mpi(2, ["-m", "mpi4py", script], timeout=TIMEOUT,
                     env={"CXLMPI_TUNING": "pool", "CXLMPI_POOL": f"file:{pool}",
                          "CXLMPI_POOL_SIZE": "1M", "CXLMPI_ARENA_SIZE": arena_size,
                          "CXLMPI_TIMEOUT": "60"})
    assert job.returncode == 0, job.describe()
    return _result(job.stdout)


def test_a_partition_handed_to_another_job_stops_its_old_job(tmp_path) -> None:
    """A partition freed and written by another job under a running job
    (a claimer on another host, after the job stood still past its lease):
    each rank's next pool call raises an error that says so and which
    setting to raise, before it writes anything, and its calls sent to MPI
    write nothing there either: the other job's bytes stay intact, and the
    job ends cleanly (before: 0x42... read as doubles; a pass-through call
    stored its count in the other job's memory; every rank died of SIGSEGV
    at exit, its heartbeat thread flushing the unmapped partition)."""
    result = _handed_over(tmp_path, HANDED_OVER, "0")
    assert result["intact"], result
    assert result["small"] == [True, True] and result["untouched"] == [True, True], result
    for error in result["errors"]:
        assert error is not None and error.startswith("CXLMPIPoolError"), result
        assert "handed to another job" in error and "CXLMPI_LEASE_BEATS" in error, error


def test_a_node_heap_handed_to_another_job_stops_its_old_job(tmp_path) -> None:
    """The node heap's partition (pool-resident arrays), not the pool's,
    freed and written by another job: each rank's next pool call on heap
    arrays raises before it reads or writes them, cxlmpi.empty refuses a
    new array, and the other job's bytes stay intact (before: the call ran
    on 0x42... and wrote its result over the other job's bytes; only the
    pool's own token was checked)."""
    result = _handed_over(tmp_path, HANDED_HEAP, "4M")
    assert result["before"] and result["intact"], result
    for error in result["errors"] + result["allocations"]:
        assert error is not None and error.startswith("CXLMPIPoolError"), result
        assert "handed to another job" in error and "CXLMPI_LEASE_BEATS" in error, error
