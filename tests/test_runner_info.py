"""What jobs run by `python -m cxlmpi` report and check: --info (and its
warnings for unknown variables, the clear errors of malformed ones), the
stats tables (CXLMPI_STATS, cxlmpi.stats(), object collectives), and the
settings every rank must share (ranks that disagree fail clearly), end to
end under mpiexec.  Running, failures, patching, the examples and
tools/compare.py: tests/test_runner.py."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest
from harness import (
    ROOT,
    launch_mpi,
    mpi_env,
    run_mpi,
)
from runner_jobs import (
    ALL_POOL,
    FAIL_TIMEOUT,
    NRANKS,
    OBJECT_STATS,
    PROBE,
    STATS_CALLS,
    stats_tables,
    tagged,
    tagged_json,
)

# ------------------------------------------------------------------- 4. info


@pytest.fixture(scope="module")
def expected_info() -> dict:
    """What --info must show, from the package itself."""
    code = ("import json, mpi4py\n"
            "from mpi4py import MPI\n"
            "import cxlmpi\n"
            "from cxlmpi import config\n"
            "print('EXPECT ' + json.dumps({\n"
            "    'version': cxlmpi.__version__,\n"
            "    'mpi4py': mpi4py.__version__,\n"
            "    'library': ' '.join(MPI.Get_library_version().splitlines()[0].split()),\n"
            "    'variables': [v.name for v in config.VARIABLES],\n"
            "    'defaults': [v.default or '(none)' for v in config.VARIABLES],\n"
            "    'agreed': [v.agreed for v in config.VARIABLES]}))\n")
    return tagged_json(run_mpi(1, ["-c", code]).stdout, "EXPECT")


def test_info(expected_info: dict) -> None:
    """--info --all: version, MPI library, backend, pool size, threshold,
    coherence, CPU features, and a row per CXLMPI_* variable (--info
    alone: tests/test_first_hour.py)."""
    # One process, no launcher (MPI singleton), none of the caller's settings.
    env = {var: value for var, value in mpi_env().items()
           if not var.startswith("CXLMPI_")}
    env["CXLMPI_POOL_SIZE"] = "1M"
    cmd = [sys.executable, "-m", "cxlmpi", "--threshold", "8K", "--coherence=sw", "--info", "--all"]
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert f"cxlmpi {expected_info['version']}" in out
    assert f"mpi4py {expected_info['mpi4py']}" in out
    assert f"MPI library: {expected_info['library']}" in out
    version_line = tagged(out, "mpi4py")
    assert "  " not in version_line.strip(), version_line  # MPICH's padding is gone
    assert re.search(r"backend: shm\b", out)
    assert re.search(r"pool size: 1048576 B\b", out)
    assert re.search(r"threshold: 8192 B\b", out)
    assert re.search(r"coherence: sw\b", out)
    assert re.search(r"^CPU features: \S", out, re.M)
    # what the kernel gives pool arrays (checked against the kernel's own
    # account in tests/test_alloc.py::test_huge_pages_as_reported)
    assert re.search(r"^huge pages for pool arrays: (yes|no) \(.*/dev/shm", out, re.M), out
    # MPICH and Open MPI alike: their collectives are found where mpi4py's resolve
    assert re.search(r"^small calls passing through: straight to the MPI library", out,
                     re.M), out
    rows = {line.split()[0]: line.split()[1:] for line in out.splitlines()
            if line.startswith("CXLMPI_")}
    assert list(rows) == expected_info["variables"]
    for var, default, agreed in zip(expected_info["variables"], expected_info["defaults"],
                                    expected_info["agreed"]):
        shown = {"CXLMPI_POOL_SIZE": "1M", "CXLMPI_THRESHOLD": "8K",
                 "CXLMPI_COHERENCE": "sw"}.get(var, "(unset)")
        assert rows[var][:3] == [shown, default, "same" if agreed else "any"], (var, rows[var])
    # The table's columns line up: in every row the first five fields start
    # where the header's do (the widest name, CXLMPI_ZEROCOPY_THRESHOLD, too).
    table = [line for line in out.splitlines() if line.startswith(("variable ", "CXLMPI_"))]
    assert table[0].startswith("variable ") and len(table) == 1 + len(rows)

    def starts(line: str) -> list[int]:
        return [m.start() for m in re.finditer(r"\S+", line)][:5]

    for line in table[1:]:
        assert starts(line) == starts(table[0]), f"\n{table[0]}\n{line}"


def test_unknown_variable_warns_once(expected_info: dict) -> None:
    """A misspelled setting is not ignored without a word: --info warns on
    stderr (once), names the closest setting and lists it; a job warns
    once (rank 0), not once per rank; the internal names never warn."""
    env = {var: value for var, value in mpi_env().items()
           if not var.startswith("CXLMPI_")}
    env.update({"CXLMPI_THRESHHOLD": "1M", "CXLMPI_NO_SUCH_THING": "1",
                "CXLMPI_SYSFS": "/sys", "CXLMPI_EXPECT_FLUSH": "0"})
    proc = subprocess.run([sys.executable, "-m", "cxlmpi", "--info"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    warned = [line for line in proc.stderr.splitlines() if "warning" in line]
    assert len(warned) == 2, proc.stderr
    assert "CXLMPI_THRESHHOLD" in warned[1] and "did you mean CXLMPI_THRESHOLD?" in warned[1]
    assert "CXLMPI_NO_SUCH_THING" in warned[0] and "did you mean" not in warned[0]
    assert "SYSFS" not in proc.stderr and "EXPECT_FLUSH" not in proc.stderr
    listed = proc.stdout.split("unknown CXLMPI_* variables (ignored):\n", 1)[1]
    assert "  CXLMPI_THRESHHOLD=1M: " in listed and "did you mean CXLMPI_THRESHOLD?" in listed
    assert "SYSFS" not in listed

    job = run_mpi(NRANKS, ["-m", "cxlmpi", PROBE], env={"CXLMPI_THRESHHOLD": "1M"})
    warned = [line for line in job.stderr.splitlines() if "CXLMPI_THRESHHOLD" in line]
    assert len(warned) == 1 and "did you mean CXLMPI_THRESHOLD?" in warned[0], job.stderr
    assert len(tagged_json(job.stdout, "PROBE")) == NRANKS  # and the program ran
    quiet = run_mpi(NRANKS, ["-m", "cxlmpi", PROBE], env={"CXLMPI_SYSFS": "/sys"})
    assert "warning" not in quiet.stderr, quiet.stderr


BAD_CONFIG = {
    "info-env": (1, ["-m", "cxlmpi", "--info"], {"CXLMPI_POOL_SIZE": "abc"}),
    "run-env": (NRANKS, ["-m", "cxlmpi", PROBE], {"CXLMPI_POOL_SIZE": "abc"}),
    "run-option": (NRANKS, ["-m", "cxlmpi", "--pool-size", "abc", PROBE], {}),
    "stats-env": (NRANKS, ["-m", "cxlmpi", PROBE], {"CXLMPI_STATS": "maybe"}),
}


@pytest.mark.parametrize("case", list(BAD_CONFIG))
def test_malformed_variable_fails(case: str) -> None:
    """A malformed setting: exit status != 0 (no hang), the variable named."""
    nranks, args, env = BAD_CONFIG[case]
    job = launch_mpi(nranks, args, env=env, timeout=FAIL_TIMEOUT)
    assert not job.timed_out and job.returncode != 0, job.describe()
    var = "CXLMPI_STATS" if case == "stats-env" else "CXLMPI_POOL_SIZE"
    assert var in job.stderr, job.describe()
    assert "PROBE" not in job.stdout


@pytest.mark.parametrize("case", ["info-env", "run-option"])
def test_malformed_variable_clear_error(case: str) -> None:
    """...and says so in one line per rank, without a traceback."""
    nranks, args, env = BAD_CONFIG[case]
    job = launch_mpi(nranks, args, env=env, timeout=FAIL_TIMEOUT)
    assert job.returncode not in (0, None), job.describe()
    assert "Traceback" not in job.stderr, job.describe()
    assert "'abc'" in job.stderr, job.describe()
    lines = [line for line in job.stderr.splitlines() if "CXLMPI_POOL_SIZE" in line]
    assert 1 <= len(lines) <= nranks, job.describe()


# ------------------------------------------------------------------ 5. stats


@pytest.mark.parametrize("how", ["option", "env"])
def test_stats(how: str) -> None:
    """--stats / CXLMPI_STATS=1: every rank prints one table at exit with a
    row per collective, whose pool and pass-through counts match the calls
    made; cxlmpi.stats() has the same figures under lower-case names, and
    counts the calls that used pool-resident arrays in place."""
    if how == "option":
        proc = run_mpi(NRANKS, ["-m", "cxlmpi", "--stats", STATS_CALLS], env=ALL_POOL)
    else:
        proc = run_mpi(NRANKS, ["-m", "cxlmpi", STATS_CALLS],
                       env={"CXLMPI_STATS": "1", **ALL_POOL})
    figures = tagged_json(proc.stdout, "STATS")
    expect = tagged_json(proc.stdout, "EXPECT")
    for name, (pool, passthrough, nbytes, zerocopy) in expect.items():
        row = figures[name]
        assert set(row) == {"pool_calls", "passthrough_calls", "nbytes", "seconds",
                            "learning_calls", "zerocopy_calls"}, row
        assert row["learning_calls"] == 0, row  # the path is pinned: nothing to learn
        assert (row["pool_calls"], row["passthrough_calls"], row["nbytes"],
                row["zerocopy_calls"]) == (pool, passthrough, nbytes, zerocopy), (name, row)
        assert row["seconds"] > 0, (name, row)
    tables = stats_tables(proc.stderr)
    assert sorted(tables) == list(range(NRANKS)), proc.stderr
    for rank, table in tables.items():
        assert set(table) >= set(expect), (rank, table)
        for name, (pool, passthrough, nbytes, zerocopy) in expect.items():
            assert table[name][:2] == [pool, passthrough], (rank, name, table[name])
            assert table[name][3] == zerocopy, (rank, name, table[name])
            assert table[name][4] == pytest.approx(nbytes / 2**20, abs=0.06)  # shown to 0.1


@pytest.mark.parametrize("objects", ["1", "0"])
def test_stats_object_collectives(objects: str) -> None:
    """comm.bcast, comm.allreduce & co. show in cxlmpi.stats() and the exit
    table as "<method>(obj)", with as many calls as the program made: with
    CXLMPI_OBJECTS=1 the large pickles through the pool (with their bytes),
    the small ones passed through; without it, every call passed through."""
    proc = run_mpi(NRANKS, ["-m", "cxlmpi", "--stats", OBJECT_STATS],
                   env={"CXLMPI_OBJECTS": objects})
    figures = tagged_json(proc.stdout, "STATS")
    calls = tagged_json(proc.stdout, "CALLS")
    payload = int(tagged(proc.stdout, "PAYLOAD"))
    assert len(calls) == 7, calls
    # Bytes moved per pool call, at least: the large payload of every block.
    blocks = {"bcast": 1, "gather": NRANKS, "scatter": NRANKS, "allgather": NRANKS,
              "alltoall": NRANKS * NRANKS, "reduce": NRANKS, "allreduce": NRANKS + 1}
    tables = stats_tables(proc.stderr)
    assert sorted(tables) == list(range(NRANKS)), proc.stderr
    for name, (large, small) in calls.items():
        row = figures[f"{name}(obj)"]
        if objects == "1":
            assert (row["pool_calls"], row["passthrough_calls"]) == (large, small), (name, row)
            low = large * blocks[name] * payload
            assert low <= row["nbytes"] < low + large * blocks[name] * 4096, (name, row)
            assert row["seconds"] > 0
        else:
            assert (row["pool_calls"], row["passthrough_calls"], row["nbytes"]) == \
                (0, large + small, 0), (name, row)
        for rank, table in tables.items():
            assert table[f"{name}(obj)"][:2] == [row["pool_calls"], row["passthrough_calls"]], \
                (rank, name, table)
    # the buffer collectives' rows are apart: the objects' calls are not there
    assert figures["bcast"]["pool_calls"] == figures["bcast"]["passthrough_calls"] == 0


# ------------------------------------------- settings every rank must share

DISAGREE = "tests/scripts/disagree.py"


@pytest.mark.parametrize("var, value, how", [
    ("CXLMPI_OBJECTS", "1", "patch"),
    ("CXLMPI_OBJECTS", "1", "objects"),
    ("CXLMPI_OBJECTS", "1", "buffers"),
    ("CXLMPI_THRESHOLD", "2M", "patch"),
    ("CXLMPI_ALLOC", "1", "patch"),
    ("CXLMPI_DISABLE", "1", "world"),
    ("CXLMPI_THRESHOLD", "2M", "world"),
    ("CXLMPI_PROGRESS", "0", "buffers"),
    ("CXLMPI_ORDERING", "0", "buffers"),
])
def test_ranks_that_disagree_on_a_setting_fail_clearly(var: str, value: str, how: str) -> None:
    """One rank with another value of a setting that chooses the path:
    every rank raises CXLMPIConfigError naming the variable (when cxlmpi is
    patched in or wraps COMM_WORLD, at the first object collective, or when
    the pool is set up) instead of the ranks taking different paths and
    waiting forever.  Before, a rank that wrapped COMM_WORLD with
    CXLMPI_DISABLE=1 (or a higher threshold) sent its Allreduce to MPI while
    the other waited in the pool's set-up, and one with CXLMPI_PROGRESS=0
    skipped the set-up's Comm_dup: MPICH aborted ("Message truncated")."""
    job = launch_mpi(2, [DISAGREE, var, value, how], env={"CXLMPI_TIMEOUT": "20"},
                     timeout=FAIL_TIMEOUT)
    assert not job.timed_out and job.returncode != 0, job.describe()
    raised = [line for line in job.stdout.splitlines()
              if line.startswith("RAISED CXLMPIConfigError") and var in line]
    assert len(raised) == 2, job.describe()
    assert "FINISHED" not in job.stdout, job.describe()


def test_wrapping_comm_world_is_no_collective_step() -> None:
    """Ranks wrap COMM_WORLD at different points (one before a send and a
    plain broadcast, the other after them): the job completes and the
    wrapped Allreduce equals stock's.  The settings check that wrapping
    COMM_WORLD needs (above) runs at its first collective instead; run by
    wrap() itself, it made this job hang."""
    job = launch_mpi(2, ["tests/scripts/wrap_order.py"], env={"CXLMPI_TIMEOUT": "20"},
                     timeout=FAIL_TIMEOUT)
    assert not job.timed_out and job.returncode == 0, job.describe()
    [line] = [x for x in job.stdout.splitlines() if x.startswith("ORDER ")]
    assert json.loads(line[len("ORDER "):]) == [True, True], line
