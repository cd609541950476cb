"""The partition table of pool files and (emulated) devdax devices shared
between jobs: claims (aligned, disjoint, released; those of killed jobs
reclaimed, live ones never touched, concurrent ones apart), who may use pool
memory (file mode, pool group, a new file's first use, memory zeroed for the
next job), and liveness without pids (reused pids, start times, the Fischer
bound, other pid namespaces, the heartbeat, jobs sent to MPI for lack of
room).  Specs, sysfs facts, bad input and the CLI: tests/test_backends.py."""

from __future__ import annotations

import ctypes
import grp
import json
import multiprocessing
import os
import select
import signal
import struct
import subprocess
import sys
import time
from pathlib import Path

import pytest
from cxlmpi._pool import Pool
from harness import ROOT, mpi_env, run_mpi
from pool_files import MIB, dax_fixture, fresh, make_file, start_claimer

from cxlmpi import _pool, config
from cxlmpi.errors import CXLMPIConfigError, CXLMPIError, CXLMPIPoolError
from cxlmpi.memory import backends, liveness, partitions, table_lock

# --------------------------------------------------------- partition table

def test_claims_are_aligned_disjoint_and_released(tmp_path: Path) -> None:
    dev = fresh(f"file:{make_file(tmp_path / 'pool', 64 * MIB)}")
    claims = [dev.claim(5 * MIB + 7, 2) for _ in range(3)]
    spans = sorted((off, off + n) for _, _, off, n in claims)
    assert all(n == 5 * MIB + 4096 for *_, n in claims)
    assert spans[0][0] >= dev.table_nbytes
    assert all(a[1] <= b[0] for a, b in zip(spans, spans[1:]))
    assert [e["state"] for e in dev.entries()] == ["claimed"] * 3
    entry, token, *_ = claims[1]
    dev.release(entry, token)
    assert [e["index"] for e in dev.entries()] == [claims[0][0], claims[2][0]]
    again = dev.claim(MIB, 2)      # first fit: the hole just freed
    assert again[2] == claims[1][2]
    dev.close()


def test_device_full_names_the_setting(tmp_path: Path) -> None:
    dev = fresh(f"file:{make_file(tmp_path / 'pool', 16 * MIB)}")
    dev.claim(10 * MIB, 2)
    with pytest.raises(CXLMPIPoolError, match="CXLMPI_POOL_SIZE"):
        dev.claim(10 * MIB, 2)
    dev.close()
def test_partition_of_a_killed_job_is_reclaimed(tmp_path: Path) -> None:
    spec = f"file:{make_file(tmp_path / 'pool', 32 * MIB)}"
    proc, entry, offset = start_claimer(spec, "die")
    assert proc.wait() == -signal.SIGKILL
    dev = fresh(spec)
    [e] = dev.entries()
    assert (e["index"], e["state"], e["stale"]) == (entry, "claimed", True)
    assert dev.claim(4 * MIB, 2)[2] == offset  # reclaimed, then reused
    assert len(dev.entries()) == 1
    dev.close()


def test_live_partition_is_never_overwritten(tmp_path: Path) -> None:
    spec = f"file:{make_file(tmp_path / 'pool', 24 * MIB)}"
    proc, entry, offset = start_claimer(spec, "live")
    try:
        dev = fresh(spec)
        [e] = dev.entries()
        assert not e["stale"]
        assert dev.reset(everything=False) == []
        mine = [dev.claim(4 * MIB, 2) for _ in range(4)]
        assert all(o + n <= offset or o >= offset + 4 * MIB for _, _, o, n in mine)
        with pytest.raises(CXLMPIPoolError, match="no room"):
            dev.claim(4 * MIB, 2)
        dev.close()
    finally:
        proc.stdin.close()
        assert proc.wait(timeout=30) == 0
    dev = fresh(spec)
    assert [e["index"] for e in dev.entries()] == [c[0] for c in mine]
    dev.close()


def _claim_many(spec: str, barrier, n: int, out) -> None:
    dev = backends.open_device(backends.parse_spec(spec))
    barrier.wait()
    out.put([dev.claim(MIB, 2)[2] for _ in range(n)])
    barrier.wait()  # alive until all have claimed (else theirs are stale)


def test_concurrent_claims_do_not_collide(tmp_path: Path) -> None:
    """Four processes claim at once (the file lock and Fischer's protocol
    serialize them): every partition is distinct."""
    spec = f"file:{make_file(tmp_path / 'pool', 64 * MIB)}"
    fresh(spec).close()
    ctx = multiprocessing.get_context("spawn")
    barrier, out = ctx.Barrier(4), ctx.Queue()
    procs = [ctx.Process(target=_claim_many, args=(spec, barrier, 6, out)) for _ in range(4)]
    for p in procs:
        p.start()
    offsets = [o for _ in procs for o in out.get(timeout=60)]
    for p in procs:
        p.join()
    assert len(offsets) == 24 and len(set(offsets)) == 24


def test_partition_contents_survive_a_new_claim(tmp_path: Path) -> None:
    """Formatting a claimed partition wipes the stale control lines left in
    it, and only its own bytes."""
    path = make_file(tmp_path / "pool", 16 * MIB)
    dev = fresh(f"file:{path}")
    e1, t1, o1, n1 = dev.claim(4 * MIB, 2)
    e2, t2, o2, n2 = dev.claim(4 * MIB, 2)
    with open(path, "r+b") as f:
        f.seek(o2)
        f.write(b"\xab" * 8192)
        f.seek(o1 + 4096)
        f.write(struct.pack("<Q", 999))  # a stale step of an earlier job
    pool = Pool.map_partition(dev.fd, o1, 4 * MIB, 0, 2, True, t1, "p")
    assert pool.seqs() == [0, 0]
    with pytest.raises(OSError, match="does not match"):
        Pool.map_partition(dev.fd, o1, 4 * MIB, 1, 2, False, t2, "p")
    pool.close()
    assert path.read_bytes()[o2:o2 + 8192] == b"\xab" * 8192
    dev.close()


# ------------------------------------------------ who may use pool memory

def test_created_pool_file_is_private(tmp_path: Path) -> None:
    """A pool file cxlmpi creates is its user's alone whatever the umask
    (the README's `truncate -s` under umask 022 made one that user nobody
    could read), and another user cannot open it."""
    path = tmp_path / "pool"
    old = os.umask(0)
    try:
        fresh(f"file:{path}").close()
    finally:
        os.umask(old)
    st = path.stat()
    assert (st.st_mode & 0o777, st.st_uid) == (0o600, os.geteuid())
    assert [p.name for p in tmp_path.iterdir()] == ["pool"]  # no temporary left
    if os.geteuid() == 0:
        tmp_path.chmod(0o755)
        peek = subprocess.run(["runuser", "-u", "nobody", "--", "head", "-c", "8", str(path)],
                              capture_output=True, text=True)
        assert peek.returncode != 0 and "Permission denied" in peek.stderr, peek


def test_pool_group_shares_a_file_with_its_group_only(tmp_path: Path, monkeypatch) -> None:
    """CXLMPI_POOL_GROUP names the one group besides the owner that may use
    a pool file: cxlmpi creates it 0660 in that group, accepts a 0660 file
    of the group, and still refuses one that others can read or that
    belongs to another group."""
    if os.geteuid() != 0:
        pytest.skip("needs root to create files of another group")
    group = grp.getgrgid(65534).gr_name                      # nogroup
    monkeypatch.setenv("CXLMPI_POOL_GROUP", group)
    config.reload()
    try:
        created = tmp_path / "created"
        fresh(f"file:{created}").close()
        st = created.stat()
        assert (st.st_mode & 0o777, st.st_gid) == (0o660, 65534)
        shared = make_file(tmp_path / "shared", 16 * MIB, 0o660)
        os.chown(shared, 65534, 65534)                       # another user's, our group
        fresh(f"file:{shared}").close()
        shared.chmod(0o664)
        with pytest.raises(CXLMPIConfigError, match="users outside the group"):
            fresh(f"file:{shared}")
        os.chown(shared, 65534, 0)
        shared.chmod(0o660)
        with pytest.raises(CXLMPIConfigError, match="not to CXLMPI_POOL_GROUP"):
            fresh(f"file:{shared}")
    finally:
        monkeypatch.delenv("CXLMPI_POOL_GROUP")
        config.reload()
    with pytest.raises(CXLMPIConfigError, match="mode 660: other users"):
        fresh(f"file:{created}")


def _first_use(path: str, barrier, out) -> None:
    barrier.wait()
    try:
        dev = backends._open(backends.parse_spec(f"file:{path}"), create=True)
        dev.check_header(format_if_empty=True)
        out.put(dev.identity)
    except Exception as exc:  # noqa: BLE001 -- reported to the test
        out.put(f"failed: {exc}")


def test_concurrent_first_use_of_a_new_pool_file(tmp_path: Path) -> None:
    """Jobs that meet a pool file that does not exist yet all at once all
    end up with the same file and the same table (before, one failed: the
    file was created, then sized; the table checked outside the lock)."""
    ctx = multiprocessing.get_context("spawn")
    for attempt in range(2):
        path = tmp_path / f"pool{attempt}"
        barrier, out = ctx.Barrier(4), ctx.Queue()
        procs = [ctx.Process(target=_first_use, args=(str(path), barrier, out))
                 for _ in range(4)]
        for p in procs:
            p.start()
        seen = [out.get(timeout=60) for _ in procs]
        for p in procs:
            p.join()
        assert len(set(seen)) == 1 and not seen[0].startswith("failed"), seen


def test_partition_memory_is_zero_for_the_next_job(tmp_path: Path, monkeypatch) -> None:
    """On a device whose freed partitions cannot be hole-punched (devdax;
    here its stand-in), what a job left in its data halves and its
    pool-resident arrays is gone before the next job's arrays are handed
    out."""
    device = make_file(tmp_path / "dax0.0", 64 * MIB)
    monkeypatch.setenv("CXLMPI_SYSFS", str(dax_fixture(tmp_path / "sys", "dax0.0",
                                                       64 * MIB, None)))
    spec = f"dax:{device}"
    dev = fresh(spec)
    seen = []
    for _job in range(2):
        entry, token, offset, length = dev.claim(8 * MIB, 2)
        pool = Pool.map_partition(dev.fd, offset, 4 * MIB, 0, 2, True, token, "p",
                                  arena_nbytes=2 * MIB)
        slot, half = Pool.layout(2, 4 * MIB)
        block = pool.allocate(MIB)
        view = memoryview(block).cast("B")
        halves = device.read_bytes()[offset + slot:offset + slot + 2 * half]
        seen.append((bytes(view[:4096]), halves))
        view[:] = b"\xab" * MIB                              # the job's data
        with open(device, "r+b") as f:
            f.seek(offset + slot)
            f.write(b"\xcd" * 2 * half)
        del view, block
        pool.close()
        dev.release(entry, token)
    assert seen[1][0] == bytes(4096)
    assert seen[1][1] == bytes(len(seen[1][1]))
    dev.close()


# ------------------------------------------------- liveness without pids

def _lock_line(dev: backends.Device) -> list[int]:
    return dev._load(table_lock.LOCK_AT // 8, table_lock.L_WORDS)


def test_lock_of_a_reused_pid_is_stale(tmp_path: Path, monkeypatch) -> None:
    """A lock left by a dead claimer whose pid now belongs to another
    process (start times differ) is taken at once, not after a minute."""
    dev = fresh(f"file:{make_file(tmp_path / 'pool', 16 * MIB)}")
    other = os.getppid()                                   # alive, not the holder
    word = table_lock.LOCK_AT // 8
    dev._store(word, [12345])
    dev._store(word + table_lock.L_HOST, [liveness.HOST, other,
                                        liveness.start_time(other) + 1, 0, 0, 12345])
    monkeypatch.setattr(table_lock, "LOCK_WAIT_S", 2.0)
    with dev.locked():
        assert _lock_line(dev)[table_lock.L_PID] == os.getpid()
    assert _lock_line(dev) == [0] * table_lock.L_WORDS
    dev.close()


@pytest.mark.parametrize("reused", [True, False])
def test_a_rank_whose_pid_was_reused_holds_no_partition(tmp_path: Path, reused: bool) -> None:
    """A released partition whose rank 1 control line names a pid of this
    host (and pid namespace) that a later process has now (its start time
    differs: a container restarted into a namespace with the same inode and
    the same pids) is freed when its leader lets it go; before, it stayed
    claimed for as long as that later process lived.  Named by the process
    that does live there (`reused` False), it stays."""
    path = make_file(tmp_path / "pool", 16 * MIB)
    dev = fresh(f"file:{path}")
    entry, token, offset, _length = dev.claim(4 * MIB, 2)
    other = os.getppid()                                   # alive
    line = [0] * (partitions.CTRL_LINE // 8)
    line[partitions.CTRL_HOST] = liveness.HOST
    line[partitions.CTRL_PID] = other
    line[partitions.CTRL_START] = liveness.start_time(other) + (1 if reused else 0)
    line[partitions.CTRL_ATTACHED] = 1
    with open(path, "r+b") as f:
        f.seek(offset + partitions.CTRL_AT + partitions.CTRL_LINE)
        f.write(struct.pack(f"<{len(line)}Q", *line))
    dev.release(entry, token)
    if reused:
        assert dev.entries() == []
    else:
        [e] = dev.entries()
        assert (e["state"], e["liveness"]) == ("released", "alive"), e
    dev.close()


def test_a_rank_names_its_start_time_in_its_control_line(tmp_path: Path) -> None:
    """What the test above reads: a rank that maps a partition writes its
    pid and its process's start time into its control line."""
    dev = fresh(f"file:{make_file(tmp_path / 'pool', 16 * MIB)}")
    entry, token, offset, _length = dev.claim(4 * MIB, 2)
    pool = Pool.map_partition(dev.fd, offset, 2 * MIB, 0, 2, True, token, "p")
    mine = dev._control_lines(offset, 2)[0]
    assert mine[partitions.CTRL_PID] == os.getpid() and mine[partitions.CTRL_ATTACHED] == 1
    assert mine[partitions.CTRL_START] == liveness.start_time(os.getpid()) > 0
    pool.close()
    dev.release(entry, token)
    dev.close()


def test_fischer_bound_exceeded_backs_off(tmp_path: Path, monkeypatch) -> None:
    """A claimer paused between reading the lock free and writing its token
    (longer than Fischer's delay) may have overwritten a holder that got in
    meanwhile: it hands that holder's token back and does not enter until
    the holder is gone."""
    dev = fresh(f"file:{make_file(tmp_path / 'pool', 16 * MIB)}")
    word = table_lock.LOCK_AT // 8
    clock = [0.0]
    real = time.monotonic
    monkeypatch.setattr(table_lock.time, "monotonic", lambda: real() + clock[0])
    store = dev._store
    events = []

    def paused_store(at: int, values: list[int]) -> None:
        if at == word and len(values) == 1 and values[0] and not events:
            # paused here: meanwhile a holder (of a process that will die)
            # took the lock and said so
            events.append("paused")
            clock[0] += 1.0
            store(word, [777])
            store(word + table_lock.L_HOST, [liveness.HOST, 2 ** 22 + 1, 1, 0, 0, 777])
        store(at, values)
        if at == word and values == [777]:
            events.append("handed back")

    monkeypatch.setattr(dev, "_store", paused_store)
    with dev.locked():
        assert _lock_line(dev)[table_lock.L_INSIDE] == _lock_line(dev)[table_lock.L_TOKEN] != 777
    assert events == ["paused", "handed back"]
    assert dev.fischer_retries == 1
    dev.close()


FOREIGN_CLAIMER = """
import os, sys
from cxlmpi.memory import backends
from cxlmpi import config
from cxlmpi._pool import Pool
config.get()
dev = backends.open_device(backends.parse_spec(sys.argv[1]))
entry, token, offset, length = dev.claim(4 << 20, 1)
if sys.argv[2] == "rank":   # mapped by its rank, released by its leader
    pool = Pool.map_partition(dev.fd, offset, length, 0, 1, True, token, "p", 0, dev.wipes)
    dev.release(entry, token)
with open(sys.argv[1][5:], "r+b") as f:
    f.seek(offset + length - 4096)
    f.write(b"\\xee" * 4096)
print(os.getpid(), offset, flush=True)
sys.stdin.read()
"""


def _process_in(namespace_root: int) -> int:
    """The pid (here) of the process that `unshare --fork` (pid
    `namespace_root`) started."""
    children = Path(f"/proc/{namespace_root}/task/{namespace_root}/children")
    [child] = children.read_text().split()
    return int(child)


@pytest.mark.parametrize("holder", ["leader", "rank"])
def test_paused_job_in_another_pid_namespace_keeps_its_partition(
        tmp_path: Path, monkeypatch, holder: str) -> None:
    """A job in another pid namespace on this host (a container; its pids
    mean nothing here) holds a partition -- by its leader's claim, or by a
    rank that maps it after the leader released it.  Stopped (SIGSTOP, as
    docker pause or a debugger would) for many times its lease, it keeps
    the partition: the kernel still holds its lock, so a claimer here that
    needs the room fails with "no room" instead of reclaiming it (before:
    judged dead by its still heartbeat, the memory punched and handed out,
    the job computing on another's bytes after SIGCONT).  Killed, it is
    reclaimed at once, without waiting for a lease."""
    if os.geteuid() != 0 or subprocess.run(["unshare", "--pid", "--fork", "--mount-proc",
                                            "true"]).returncode != 0:
        pytest.skip("needs root and unshare(1)")
    path = make_file(tmp_path / "pool", 24 * MIB)
    spec = f"file:{path}"
    fresh(spec).close()
    beats = {"CXLMPI_HEARTBEAT": "0.02", "CXLMPI_LEASE_BEATS": "10"}   # a 0.2 s lease
    for name, value in beats.items():
        monkeypatch.setenv(name, value)
    config.reload()
    proc = subprocess.Popen(["unshare", "--pid", "--fork", "--mount-proc", "--kill-child",
                             sys.executable, "-c", FOREIGN_CLAIMER, spec, holder],
                            cwd=ROOT, env={**mpi_env(), **beats}, stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)
    try:
        inner_pid, offset = map(int, proc.stdout.readline().split())
        assert inner_pid == 1                        # the premise: a namespace of its own
        job = _process_in(proc.pid)
        exited = os.pidfd_open(job)   # (readable once the job has exited)
        dev = fresh(spec)
        [theirs] = dev.entries()
        assert not theirs["this_host"] and theirs["liveness"] == "alive", theirs
        assert theirs["state"] == ("claimed" if holder == "leader" else "released")
        os.kill(job, signal.SIGSTOP)
        try:
            time.sleep(1.0)          # the scenario: stopped for five times its lease
            mine = []
            with pytest.raises(CXLMPIPoolError, match="no room"):
                while True:   # (a claim without room watches unjudged heartbeats a lease)
                    mine.append(dev.claim(4 * MIB, 1))
            assert offset not in [c[2] for c in mine]
            [theirs] = [e for e in dev.entries() if e["offset"] == offset]
            assert theirs["liveness"] == "alive" and not theirs["stale"]
            assert dev.reset(everything=False) == []
        finally:
            os.kill(job, signal.SIGCONT)
        with open(path, "rb") as f:
            f.seek(offset + 4 * MIB - 4096)
            assert f.read(4096) == b"\xee" * 4096          # their data, intact
        proc.kill()
        proc.wait()
        # (unshare --kill-child kills the job once unshare is gone: wait for it)
        assert select.select([exited], [], [], 60)[0], "the job outlived unshare"
        os.close(exited)
        assert dev.claim(4 * MIB, 1)[2] == offset           # gone now: reclaimed
        dev.close()
    finally:
        proc.kill()
        for name in beats:
            monkeypatch.delenv(name)
        config.reload()


def _rounds_pass(n: int) -> None:
    """Return once the heartbeat thread has beaten `n` more times."""
    start = _pool.heartbeat()[2]
    deadline = time.monotonic() + 60
    while _pool.heartbeat()[2] < start + n:
        assert time.monotonic() < deadline, "the heartbeat thread stopped"
        time.sleep(0.01)


def test_heartbeat_stops_when_the_memory_changes_hands() -> None:
    """A counter beats while its owner word holds the token it was
    registered with; once the word says otherwise (the process was judged
    gone while stopped and its partition or entry is another job's now),
    the beat thread never writes there again."""
    words = (ctypes.c_uint64 * 2)(0, 42)          # [counter, owner]
    counter, owner = ctypes.addressof(words), ctypes.addressof(words) + 8
    _pool.beat_add(counter, owner, 42)
    try:
        _rounds_pass(2)
        assert words[0] >= 1
        words[1] = 7                                # another owner's token now
        _rounds_pass(2)
        frozen = words[0]
        _rounds_pass(3)
        assert words[0] == frozen
    finally:
        _pool.beat_remove(counter)


def test_communicators_without_room_go_to_mpi(tmp_path: Path) -> None:
    """A pool file with room for a few partitions: the communicators that
    find none left run their collectives with MPI, with one warning per
    process, and every result is stock MPI's."""
    pool = make_file(tmp_path / "pool", 4 * MIB)
    proc = run_mpi(2, ["tests/scripts/no_room.py"],
                   env={"CXLMPI_POOL": f"file:{pool}", "CXLMPI_POOL_SIZE": "1M",
                        "CXLMPI_ARENA_SIZE": "0", "CXLMPI_TUNING": "pool"})
    result = json.loads(proc.stdout.split("RESULT ", 1)[1].splitlines()[0])
    assert result["ok"] and result["pool"] >= 1 and result["passed"] >= 1, result
    assert result["pool"] + result["passed"] == 6, result
    assert proc.stderr.count("no room for a") == 2, proc.stderr


@pytest.mark.parametrize("errors, kind", [
    (["rank 1: not enough shared memory for its partition table"], CXLMPIPoolError),
    (["rank 0: not enough shared memory for x", "rank 1: not enough shared memory for y"],
     CXLMPIPoolError),
    (["rank 0: not enough shared memory for x", "rank 1: /pool has mode 644"],
     CXLMPIConfigError),
])
def test_only_a_lack_of_memory_everywhere_sends_the_job_to_mpi(monkeypatch, errors,
                                                               kind) -> None:
    """A pool set-up's errors, gathered from every rank, raise as the
    configuration error they are -- but where every failing rank lacked
    memory (a full /dev/shm), as a pool error, which sends the job to MPI
    with a warning; a configuration error beside one is not hidden so."""
    from mpi4py import MPI

    from cxlmpi.pools import group

    monkeypatch.setattr(group.agree, "allgather", lambda comm, mine: [None, *errors])
    with pytest.raises(CXLMPIError) as raised:
        group._raise_any(MPI.COMM_SELF, None, CXLMPIConfigError)
    assert type(raised.value) is kind
