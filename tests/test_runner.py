"""`python -m cxlmpi`, `import cxlmpi.auto`, patch()/unpatch(), failure
handling and segment cleanup, the examples and tools/compare.py, end to end
under mpiexec (--info, the stats tables and the settings every rank must
share: tests/test_runner_info.py).

Each test launches whole MPI jobs (two ranks unless said otherwise) running
the helper programs in tests/scripts/, and compares with stock mpi4py where
there is a result: in the same job on the same MPI handle
(``MPI.Intracomm(MPI.COMM_WORLD)`` is a plain communicator on it), or against
a run of the same program without cxlmpi.  Nothing synchronises by sleeping:
jobs that must fail are launched with `launch_mpi`, which kills a job still
running at its timeout instead of letting the test hang.

"""

from __future__ import annotations

import json
import os
import re
import runpy
import subprocess
import sys

import pytest
from harness import (
    EXAMPLES,
    ROOT,
    launch_mpi,
    leaked_segments,
    mpi_env,
    our_segments,
    run_mpi,
)
from runner_jobs import (
    ALL_POOL,
    ARGS,
    FAIL_TIMEOUT,
    FAILING,
    NO_POOL_TIMEOUT,
    NRANKS,
    PATCHING,
    PROBE,
    PROMPT,
    SCRIPTS_PATH,
    ZOMBIE_PEER,
    stats_tables,
    tagged,
    tagged_json,
)

# ---------------------------------------------------------------- 1. running


@pytest.fixture(scope="module")
def stock_probe() -> list[dict]:
    """The probe run with stock mpi4py (no cxlmpi anywhere)."""
    proc = run_mpi(NRANKS, [PROBE, *ARGS])
    reports = tagged_json(proc.stdout, "PROBE")
    for rep in reports:
        assert rep["is_cxlcomm"] is False and rep["pool_calls"] is None
        assert rep["comm_type"] == "mpi4py.MPI.Intracomm"
    return reports


FORMS = {
    "file": [PROBE],
    "module": ["-m", "probe"],
    "cmd": ["-c", "from probe import main; main()"],
}


@pytest.mark.parametrize("form", list(FORMS))
def test_run_patched(form: str, stock_probe: list[dict]) -> None:
    """`python -m cxlmpi (script.py | -m module | -c cmd) args...` runs the
    unmodified program with COMM_WORLD wrapped and sys.argv as Python sets
    it; its large collectives go through the pool and agree with stock MPI;
    a normal run leaves no segment behind and prints no stats table."""
    before = our_segments()
    proc = run_mpi(NRANKS, ["-m", "cxlmpi", *FORMS[form], *ARGS],
                   env={**SCRIPTS_PATH, **ALL_POOL})
    reports = tagged_json(proc.stdout, "PROBE")
    assert [rep["rank"] for rep in reports] == list(range(NRANKS))
    for rep, stock in zip(reports, stock_probe):
        argv = rep["argv"]
        if form == "file":
            assert argv == [PROBE, *ARGS]
        elif form == "module":
            assert os.path.basename(argv[0]) == "probe.py" and argv[1:] == ARGS
        else:
            assert argv == ["-c", *ARGS]
        if form != "cmd":
            assert rep["name"] == "__main__"
        assert rep["is_cxlcomm"], rep
        assert rep["comm_type"] == "cxlmpi.communicator.cxlcomm.CXLComm"
        assert rep["from_import_type"] == "cxlmpi.communicator.cxlcomm.CXLComm"
        assert rep["plain_type"] == "mpi4py.MPI.Intracomm" and rep["same_handle"]
        assert rep["allreduce_int_equal"] and rep["allreduce_float_close"]
        assert rep["bcast_equal"] and rep["reduce_equal"]
        assert rep["checksum"] == stock["checksum"]  # same sum as a stock run
        calls = rep["pool_calls"]
        assert (calls["allreduce"], calls["bcast"], calls["reduce"]) == (2, 1, 1), calls
        assert calls["barrier"] == 1, calls
    assert "cxlmpi stats" not in proc.stderr
    assert leaked_segments(before) == []


def _later(out: subprocess.CompletedProcess) -> list[dict]:
    [line] = [x for x in out.stdout.splitlines() if x.startswith("LATER ")]
    found = json.loads(line[len("LATER "):])
    assert len(found) == NRANKS, line
    return found


@pytest.mark.parametrize("level", ["multiple", "funneled"])
@pytest.mark.parametrize("how", ["import", "runner"])
def test_a_program_that_starts_mpi_itself(how: str, level: str) -> None:
    """``mpi4py.rc.initialize = False`` and ``MPI.Init_thread()`` of its own:
    with cxlmpi imported before that, or run by ``python -m cxlmpi`` (which
    imports it before the program: the level asked for in the environment,
    MPI4PY_RC_THREAD_LEVEL), the program's Init_thread returns the level
    stock gives it, its COMM_WORLD is cxlmpi's and its Allreduce
    equals stock's.  Before, importing cxlmpi looked MPI up before MPI_Init
    (MPICH aborted the process), and under the runner the program's own
    Init_thread failed: MPI was started already."""
    stock = _later(run_mpi(NRANKS, ["tests/scripts/init_later.py"],
                           env={"INIT_LATER": "stock", "INIT_LEVEL": level,
                                "MPI4PY_RC_THREAD_LEVEL": level}))
    args = ["tests/scripts/init_later.py"] if how == "import" else \
        ["-m", "cxlmpi", "tests/scripts/init_later.py"]
    found = _later(run_mpi(NRANKS, args, env={"INIT_LATER": how, "INIT_LEVEL": level,
                                              "MPI4PY_RC_THREAD_LEVEL": level,
                                              "CXLMPI_THRESHOLD": "0"}))
    for got, want in zip(found, stock):
        assert got == {"provided": want["provided"], "wrapped": True, "equal": True}, got


@pytest.mark.parametrize("settings", [
    [], ["errors=fatal"], ["errors=abort"], ["initialize=false"],
    ["initialize=false", "threads=false"], ["thread_level=funneled", "errors=fatal"]])
def test_a_programs_mpi4py_rc_applies_under_the_runner(settings: list[str]) -> None:
    """The program's ``mpi4py.rc`` settings (made before it imports
    mpi4py.MPI, as mpi4py's demo/init-fini does) hold under ``python -m
    cxlmpi`` as without it: whether importing MPI starts it, the error
    handlers, the thread level; and its COMM_WORLD is cxlmpi's once MPI runs.
    Before, the runner started MPI before the program: 9 of mpi4py's 20
    init-fini cases failed (an unstarted MPI asserted, rc.errors ignored)."""
    script = "tests/scripts/rc_program.py"
    stock = tagged_json(run_mpi(NRANKS, [script, *settings]).stdout, "RC")
    found = tagged_json(run_mpi(NRANKS, ["-m", "cxlmpi", script, *settings],
                                env={"CXLMPI_THRESHOLD": "0"}).stdout, "RC")
    assert [rank["wrapped"] for rank in stock] == [False] * NRANKS
    for got, want in zip(found, stock):
        assert got == {**want, "wrapped": True}, (got, want)


@pytest.mark.parametrize("runners", [1, 2])
def test_another_threads_cxlmpi_import_does_not_hold_the_patch_back(runners: int) -> None:
    """A helper thread blocks inside the import of a cxlmpi module while the
    main thread imports mpi4py.MPI: COMM_WORLD is cxlmpi's right after that
    import (the patch waits only for the importing thread's own cxlmpi
    imports; a count shared by the threads deferred it), and an allreduce
    on it gives stock's sum.  `runners` 2: ``python -m cxlmpi -m cxlmpi``,
    whose two finders called each other for ever."""
    script = "tests/scripts/runner_threads.py"
    job = launch_mpi(NRANKS, ["-m", "cxlmpi"] * runners + [script], timeout=FAIL_TIMEOUT)
    assert job.returncode == 0, job.describe()
    got = tagged_json(job.stdout, "THREADS")
    assert got == [{"patched": True, "sum": sum(range(NRANKS))}] * NRANKS, job.describe()


def test_run_cmd_can_pickle_its_own_classes() -> None:
    code = ("import sys\n"
            "from mpi4py import MPI\n"
            "class Point:\n"
            "    pass\n"
            "got = MPI.COMM_WORLD.bcast(Point() if MPI.COMM_WORLD.rank == 0 else None)\n"
            "sys.stdout.write(f'GOT {type(got).__name__}\\n')\n")
    assert run_mpi(NRANKS, ["-c", code]).stdout.count("GOT Point") == NRANKS  # stock
    job = launch_mpi(NRANKS, ["-m", "cxlmpi", "-c", code], timeout=FAIL_TIMEOUT)
    assert job.returncode == 0, job.describe()
    assert job.stdout.count("GOT Point") == NRANKS, job.describe()


# ------------------------------------------------- 2, 6. failures and cleanup


@pytest.mark.parametrize("action,when,then", [
    ("raise", "start", "allreduce"),  # the others set up the pool (MPI collectives)
    ("raise", "start", "barrier"),  # the others wait in MPI's Barrier
    ("raise", "pool", "allreduce"),  # the others wait inside the pool
    ("raise", "pool", "barrier"),  # ditto, the pool's Barrier
    ("exit", "start", "barrier"),
    ("exit", "pool", "allreduce"),
])
def test_failure_in_one_rank_aborts_job(action: str, when: str, then: str,
                                        tmp_path) -> None:
    """An uncaught exception or sys.exit(3) in rank 1 only aborts the whole
    job at once (the others are blocked in a collective) and leaves no
    segment behind.  (That rank 1's traceback reaches stderr is checked by
    test_failure_traceback_reaches_stderr.)"""
    before = our_segments()
    pool_file = tmp_path / "pool-name"
    job = launch_mpi(NRANKS, ["-m", "cxlmpi", FAILING, action, when, then],
                     env={**NO_POOL_TIMEOUT, "FAILING_POOL_FILE": str(pool_file)},
                     timeout=FAIL_TIMEOUT)
    assert not job.timed_out, job.describe()
    assert job.returncode != 0, job.describe()
    assert job.seconds < PROMPT, job.describe()
    assert "SURVIVED" not in job.stdout, job.describe()
    if when == "pool":  # the premise: the pool existed when rank 1 failed
        assert pool_file.read_text().lstrip("/").startswith("cxlmpi-"), job.describe()
    assert leaked_segments(before) == []


def test_a_rank_that_fails_before_it_starts_mpi_aborts_the_job() -> None:
    """Rank 1 raises before the program imports mpi4py, its peers wait for
    it in MPI (MPICH's in MPI_Init, for ever): the runner starts MPI on the
    failed rank only to abort the job, at once.  (Before, with MPI started
    before the program, the abort had MPI at hand; once the runner left
    starting MPI to the program, the job hung.)"""
    job = launch_mpi(NRANKS, ["-m", "cxlmpi", "tests/scripts/failing_early.py"],
                     timeout=FAIL_TIMEOUT)
    assert not job.timed_out, job.describe()
    assert job.returncode != 0 and job.seconds < PROMPT, job.describe()
    assert "SURVIVED" not in job.stdout and "fails before it starts MPI" in job.stderr, \
        job.describe()


# Enough runs to catch a 1-in-10 loss most of the time on MPICH, where it was
# seen (0.35 s a run); a few on Open MPI, where it was not (2 s a run).
TRACEBACK_RUNS = 3 if os.environ.get("CXLMPI_TEST_OPENMPI") else 16


def test_failure_traceback_reaches_stderr() -> None:
    """The failing rank's whole traceback reaches mpiexec's stderr, every
    time (the job is run TRACEBACK_RUNS times: the loss is a race)."""
    lost = []
    for _ in range(TRACEBACK_RUNS):
        job = launch_mpi(NRANKS, ["-m", "cxlmpi", FAILING, "raise", "pool", "barrier"],
                         env=NO_POOL_TIMEOUT, timeout=FAIL_TIMEOUT)
        assert job.returncode not in (0, None), job.describe()
        if not ("Traceback (most recent call last)" in job.stderr
                and 'failing.py", line' in job.stderr
                and "RuntimeError: deliberate failure in rank 1" in job.stderr):
            lost.append(job.stderr)
    assert lost == [], f"traceback incomplete in {len(lost)} of {TRACEBACK_RUNS} runs"


def test_exit_status_of_sys_exit_is_kept() -> None:
    """sys.exit(3) in one rank: mpiexec exits 3, as under `python -m mpi4py`."""
    stock = launch_mpi(NRANKS, ["-m", "mpi4py", FAILING, "exit", "start", "barrier"],
                       timeout=FAIL_TIMEOUT)
    assert stock.returncode == 3, stock.describe()
    job = launch_mpi(NRANKS, ["-m", "cxlmpi", FAILING, "exit", "pool", "allreduce"],
                     env=NO_POOL_TIMEOUT, timeout=FAIL_TIMEOUT)
    assert job.returncode == 3, job.describe()


# Rank 1 fails while a worker thread of its (not a daemon) waits for work.
LIVE_THREAD = """\
import threading
from mpi4py import MPI
comm = MPI.COMM_WORLD
if comm.Get_rank() == 1:
    threading.Thread(target=threading.Event().wait).start()
    raise RuntimeError("deliberate failure in rank 1")
comm.Barrier()
print("SURVIVED")
"""


def test_failure_with_a_live_thread_aborts_job() -> None:
    """A rank that raises while a thread of its still runs aborts the job at
    once, traceback shown.  Python joins such threads before it exits, so an
    abort left to the exit (mpi4py.run's set_abort_status) never came, and
    the other rank waited in the Barrier until the launcher was killed."""
    job = launch_mpi(NRANKS, ["-m", "cxlmpi", "-c", LIVE_THREAD], env=NO_POOL_TIMEOUT,
                     timeout=FAIL_TIMEOUT)
    assert not job.timed_out, job.describe()
    assert job.returncode == 1 and job.seconds < PROMPT, job.describe()
    assert "SURVIVED" not in job.stdout, job.describe()
    assert "RuntimeError: deliberate failure in rank 1" in job.stderr, job.describe()


@pytest.mark.parametrize("then", ["allreduce", "barrier"])
def test_killed_rank_stops_job_and_leaves_no_segment(then: str, tmp_path) -> None:
    """Rank 1 is SIGKILLed right after the pool exists while rank 0 waits in
    the next pool collective: the job stops with an error (cxlmpi's dead-peer
    check or the launcher's abort), never hangs, and no segment remains."""
    before = our_segments()
    pool_file = tmp_path / "pool-name"
    job = launch_mpi(NRANKS, ["-m", "cxlmpi", FAILING, "kill", "pool", then],
                     env={**NO_POOL_TIMEOUT, "FAILING_POOL_FILE": str(pool_file)},
                     timeout=FAIL_TIMEOUT)
    assert not job.timed_out, job.describe()
    assert job.returncode != 0, job.describe()
    assert job.seconds < PROMPT, job.describe()
    assert "SURVIVED" not in job.stdout, job.describe()
    pool = pool_file.read_text().lstrip("/")
    assert pool.startswith("cxlmpi-") and pool not in our_segments()
    assert leaked_segments(before) == []


def test_pool_notices_dead_unreaped_peer() -> None:
    """A pool wait notices a peer that died even before its parent reaps it
    (e.g. `mpiexec -disable-auto-cleanup`): PoolFailure for a dead peer, well
    before the pool's timeout.  No MPI in this one (see the script)."""
    proc = subprocess.run([sys.executable, ZOMBIE_PEER], cwd=ROOT, env=mpi_env(),
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert tagged(proc.stdout, "RESULT").split()[0] == "peer_gone", proc.stdout


FOREIGN_PEER = "tests/scripts/foreign_peer.py"


@pytest.mark.parametrize("how, outcome", [("die", "peer_gone"), ("late", "completed")])
def test_pool_judges_a_foreign_peer_by_its_heartbeat(how: str, outcome: str) -> None:
    """A peer in another pid namespace (a container; another host) is judged
    by its heartbeat, never by its pid looked up here: killed, the pool's
    wait says so well before its timeout (before: it waited the timeout
    out, or called a live peer whose pid is not here dead); late by ten
    leases, it is waited for."""
    if os.geteuid() != 0 or subprocess.run(["unshare", "--pid", "--fork", "--mount-proc",
                                            "true"]).returncode != 0:
        pytest.skip("needs root and unshare(1)")
    env = {**mpi_env(), "CXLMPI_HEARTBEAT": "0.02", "CXLMPI_LEASE_BEATS": "10"}
    proc = subprocess.run([sys.executable, FOREIGN_PEER, how], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert tagged(proc.stdout, "RESULT").split()[0] == outcome, proc.stdout


# --------------------------------------------------------------- 3. patching


def test_auto_patch_unpatch() -> None:
    """`import cxlmpi` alone changes nothing; `import cxlmpi.auto` wraps
    COMM_WORLD and COMM_SELF (also for `from mpi4py.MPI import ...` after
    it); unpatch() puts the stock objects back; patch() is idempotent.  The
    Allreduce agrees with stock MPI in every state and goes through the pool
    exactly when patched.  CXLMPI_STATS=1 prints one table per rank."""
    proc = run_mpi(NRANKS, [PATCHING], env={"CXLMPI_STATS": "1", **ALL_POOL})
    everyone = tagged_json(proc.stdout, "CHECKS")
    assert len(everyone) == NRANKS
    for rank, checks in enumerate(everyone):
        failed = [name for name, ok in checks.items() if not ok]
        assert failed == [], f"rank {rank}: {failed}"
        assert "repatched_allreduce_in_pool" in checks  # it ran to the end
    assert sorted(stats_tables(proc.stderr)) == list(range(NRANKS)), proc.stderr


# How a program takes its communicator and patches, line by line; `comm` is
# the communicator it then uses.  `wrap` holds a wrapped COMM_WORLD early.
TAKE = {
    "world early": "comm = MPI.COMM_WORLD\nimport cxlmpi.auto",
    "from-import early": "from mpi4py.MPI import COMM_WORLD as comm\nimport cxlmpi.auto",
    "self early, patch()": ("import cxlmpi\nme = MPI.COMM_SELF\ncxlmpi.patch()\n"
                            "comm = MPI.COMM_WORLD"),
    "world early in a function": ("def main():\n    world = MPI.COMM_WORLD\n"
                                  "    import cxlmpi.auto\n    return world\n"
                                  "comm = main()"),
    "auto first": "import cxlmpi.auto\ncomm = MPI.COMM_WORLD",
    "wrap early": "import cxlmpi\ncomm = cxlmpi.wrap(MPI.COMM_WORLD)\nimport cxlmpi.auto",
    "dup early": "comm = MPI.COMM_WORLD.Dup()\nimport cxlmpi.auto",
}
# Then one 512 KiB Allreduce on `comm`, against stock on a plain duplicate.
HELD_PROGRAM = """\
import json, warnings
caught = []
warnings.showwarning = lambda msg, cat, filename, lineno, *rest: caught.append(
    [str(msg), cat.__name__, filename, lineno])
import numpy as np
from mpi4py import MPI
{take}
import cxlmpi
stock = MPI.Intracomm(MPI.COMM_WORLD).Dup()
data = np.arange(1 << 16, dtype=np.int64) * (stock.rank + 1)
want, got = np.empty_like(data), np.empty_like(data)
stock.Allreduce(data, want)
before = cxlmpi.stats()["allreduce"]["pool_calls"]
comm.Allreduce(data, got)
result = dict(equal=bool(np.array_equal(got, want)), warnings=caught,
              pool=cxlmpi.stats()["allreduce"]["pool_calls"] - before)
everyone = stock.gather(result, root=0)
if stock.rank == 0:
    print("RESULT " + json.dumps(everyone))
"""


@pytest.mark.parametrize("order", TAKE)
def test_communicator_taken_before_patching_warns(order: str) -> None:
    """A stock COMM_WORLD or COMM_SELF that the program took before `import
    cxlmpi.auto` / cxlmpi.patch() stays plain, silently: patching warns once,
    at the program's line, naming the variable and the fix.  The right order,
    a wrapped communicator and a duplicate (not the predefined handle) do
    not warn.  Every result equals stock's; the warning tells the truth
    (a warned-about COMM_WORLD ran its Allreduce in MPI)."""
    program = HELD_PROGRAM.format(take=TAKE[order])
    everyone = tagged_json(run_mpi(NRANKS, ["-c", program], env=ALL_POOL).stdout, "RESULT")
    held = {"world early": "__main__.comm", "from-import early": "__main__.comm",
            "self early, patch()": "__main__.me",
            "world early in a function": "__main__.main().world"}.get(order)
    for rank, result in enumerate(everyone):
        assert result["equal"], (rank, result)
        if held is None:
            assert result["warnings"] == [], (rank, result)
            assert result["pool"] == (0 if order == "dup early" else 1), (rank, result)
            continue
        [(message, category, filename, lineno)] = result["warnings"]
        assert category == "UserWarning"
        assert message.startswith(f"cxlmpi: {held} was taken from MPI before"), message
        assert "import cxlmpi.auto" in message.lower() and "cxlmpi.wrap(comm)" in message
        # The line of the program that patched: `import cxlmpi.auto` or patch().
        assert filename == "<string>", result
        patch_line = next(i for i, line in enumerate(program.splitlines(), 1)
                          if "cxlmpi.auto" in line or "patch()" in line)
        assert lineno == patch_line, (result, program)
        # `comm` is the early COMM_WORLD, except where COMM_SELF was held.
        assert result["pool"] == (1 if held == "__main__.me" else 0), (rank, result)


# --------------------------------------------------------------- 7. examples


@pytest.mark.parametrize("tuning", ["pool", "adaptive"])
@pytest.mark.parametrize("name", list(EXAMPLES))
def test_example_same_result(name: str, tuning: str) -> None:
    """examples/<name>.py prints the same RESULT line under stock mpi4py and
    under `python -m cxlmpi`: with the pool forced (CXLMPI_TUNING=pool), when
    every rank used it, and with the default adaptive selection, which may as
    well have picked MPI for every call: what it picks is timing, never a
    result to test."""
    script = f"examples/{name}.py"
    stock = run_mpi(NRANKS, [script, *EXAMPLES[name]])
    patched = run_mpi(NRANKS, ["-m", "cxlmpi", "--stats", script, *EXAMPLES[name]],
                      env={"CXLMPI_TUNING": tuning})
    want = tagged(stock.stdout, "RESULT")
    assert want.startswith(f"{name} ")
    assert tagged(patched.stdout, "RESULT") == want
    tables = stats_tables(patched.stderr)
    assert sorted(tables) == list(range(NRANKS)), patched.stderr
    if tuning == "pool":
        assert all(sum(row[0] for row in t.values()) > 0 for t in tables.values()), tables


@pytest.mark.parametrize("options", [[], ["--alloc"]])
def test_numpy_is_not_imported_before_the_program(options: list[str]) -> None:
    """A program may set OMP_NUM_THREADS & co. before it imports NumPy;
    cxlmpi must not start NumPy (and its BLAS threads) first (a training
    loop ran 5-20x slower with two BLAS threads per rank), not even to
    install the --alloc hook (it goes in when the program imports NumPy)."""
    # One write per rank: print() writes its pieces separately, and the
    # two ranks' pieces interleaved ("NUMPYNUMPY  FalseFalse").
    code = "import sys; sys.stdout.write(f'NUMPY {\"numpy\" in sys.modules}\\n')"
    out = run_mpi(2, ["-m", "cxlmpi", *options, "-c", code])
    assert out.stdout.split().count("False") == 2, out.stdout


# ------------------------------------------------------ 6. tools/compare.py

THREADS_PROGRAM = """\
import os, sys
from mpi4py import MPI
if MPI.COMM_WORLD.Get_rank() == 0:
    print("# a comment line, not compared")
    print("RESULT threads", os.environ.get("OMP_NUM_THREADS"), sys.argv[1:])
    print("TIME 0.25")
"""


@pytest.mark.parametrize("user_threads", [None, "3"])
def test_compare_runs_one_blas_thread_unless_told(user_threads: str | None,
                                                  tmp_path) -> None:
    """tools/compare.py runs both sides with OMP_NUM_THREADS=1 (threaded BLAS
    on every rank made the timings too noisy to compare) unless the user
    set it; it passes the program's arguments, reads its TIME line and
    compares its other lines."""
    program = tmp_path / "threads.py"
    program.write_text(THREADS_PROGRAM)
    env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}
    if user_threads:
        env["OMP_NUM_THREADS"] = user_threads
    proc = subprocess.run([sys.executable, "tools/compare.py", "-n", "2", "--repeat", "1",
                           str(program), "--", "x", "-y"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    want = user_threads or "1"
    assert f"results agree: yes   (RESULT threads {want} ['x', '-y'])" in proc.stdout, \
        proc.stdout
    assert re.search(r"^program TIME \(s\)\s+0\.250\s+0\.250\s+1\.00x\s+1\.00x$", proc.stdout,
                     re.M), proc.stdout
    assert f"OMP_NUM_THREADS={want}" in proc.stdout.splitlines()[0], proc.stdout


def test_compare_pairs_the_runs_taken_in_turn() -> None:
    """The per-pair speedup is the median of stock/cxlmpi over the run pairs:
    a machine that slows down and speeds up within a job moves the two
    medians' ratio (0.67x here) but not the pairs' (each 1.33x but one)."""
    paired = runpy.run_path(str(ROOT / "tools" / "compare.py"))["paired_speedup"]
    assert paired([4.0, 2.0, 2.0], [3.0, 3.0, 1.5]) == pytest.approx(4 / 3)
    assert paired([1.0], [2.0]) == pytest.approx(0.5)
