"""Adaptive selection in a real job, under mpiexec: the ranks decide alike,
a tuning file pins the choice, pool arrays are noticed, settled Gather and
Scatter take no header step, their runs are timed end to end, small
messages learn in cheap runs, a first run times only its warm calls.  Without
timing, on made-up timings: tests/test_select.py."""

from __future__ import annotations

import json

import pytest
from harness import SMALL_POOL_ENV, run_mpi
from select_sim import BCAST, alone, fixed, realistic
from test_reliability import tagged_json

from cxlmpi.select import code_of

# ------------------------------------------------------------- in a real job

SELECTION = "tests/scripts/selection.py"
RESIDENT_HINT = "tests/scripts/resident_hint.py"
SETTLED_HEADER = "tests/scripts/settled_header.py"
FIRST_RUN = "tests/scripts/first_run.py"
HEADER_RUNS = "tests/scripts/header_runs.py"
ADAPTIVE_ENV = {**SMALL_POOL_ENV, "CXLMPI_TUNING": "adaptive", "CXLMPI_CACHE": "off"}


@pytest.mark.parametrize("nranks, seed, groups, ordering",
                         [(2, 1, 1, "1"), (3, 2, 1, "1"), (3, 4, 2, "0"), (4, 3, 2, "1")])
def test_a_job_decides_alike_on_every_rank(nranks: int, seed: int, groups: int,
                                           ordering: str) -> None:
    """Six collectives at three sizes, 600 calls in a random order, every
    rank's timings scrambled by its own factor of 0.1 to 10: every result
    equals stock MPI's, the ranks end with the same decisions, and both
    paths were used.  Also across pool groups, where the header steps agree
    through the groups' pools and the leaders' MPI (the builtin windows
    decided there before: nothing was learned).  (3 ranks in 2 groups with
    seed 4 took the pool for Barriers only, which CXLMPI_ORDERING sends to
    MPI: that case runs without it, so that both paths are still used.)"""
    env = {**ADAPTIVE_ENV, "CXLMPI_POOL_GROUPS": str(groups), "CXLMPI_ORDERING": ordering}
    proc = run_mpi(nranks, [SELECTION, str(seed)], env=env)
    result = tagged_json(proc.stdout, "RESULT")
    assert result["same"] and result["wrong"] == [], result
    assert result["settled"] > 0 and result["learning"] > 0 and result["pool"] > 0, result


def test_a_tuning_file_pins_the_choice(tmp_path) -> None:
    """A CXLMPI_TUNING file (and `pool`) pins the path: nothing is learned,
    and the file's windows are obeyed (bcast never through the pool)."""
    table = tmp_path / "tuning.json"
    table.write_text(json.dumps({"bcast": None}))
    for tuning in (str(table), "pool"):
        proc = run_mpi(2, [SELECTION], env={**ADAPTIVE_ENV, "CXLMPI_TUNING": tuning})
        result = tagged_json(proc.stdout, "RESULT")
        assert result["wrong"] == [] and result["learning"] == 0, (tuning, result)
        assert result["settled"] == 0 and result["pool"] > 0, (tuning, result)
        assert (result["bcast_pool"] == 0) == (tuning != "pool"), (tuning, result)


@pytest.mark.parametrize("nranks", [2, 3])
def test_pool_arrays_are_noticed_where_private_ones_settled_on_mpi(nranks: int,
                                                                  tmp_path) -> None:
    """The cache says: Allreduce of 1 MiB with private buffers, MPI.  The
    program's arrays are in the pool: the ranks agree in a header step that
    every rank's are and learn the zero-copy class, which tries the pool (in
    20 calls never, before: a settled MPI class never ran the pool, so it
    never saw where the buffers were; how many of the 20 then take the pool
    depends on which path is faster here); with private arrays again, at
    most one call tries the pool.  Every result equals stock's."""
    cache = str(tmp_path / "selection.json")
    env = {"CXLMPI_TUNING": "adaptive", "CXLMPI_CACHE": cache, "CXLMPI_TIMEOUT": "60"}
    proc = run_mpi(nranks, [RESIDENT_HINT, cache], env=env)
    result = tagged_json(proc.stdout, "RESULT")
    assert result["wrong"] == 0 and result["pool"] >= 1, result
    assert result["private_pool"] <= 1, result


@pytest.mark.parametrize("nranks", [2, 3])
def test_gather_and_scatter_settled_on_mpi_take_no_header_step(nranks: int,
                                                               tmp_path) -> None:
    """The cache says: Gather and Scatter of 512 KiB a rank, private
    buffers, MPI.  Their 40 calls (every root) go to MPI at once, as a
    settled class of the other collectives does: no pool step (40 before,
    one header step each), and every result is stock's.  Then a Gather and
    a Scatter per root whose message on rank 1 runs past its buffer: rank 1
    goes to MPI with its peers, on a scratch copy, and gets stock's values
    inside its buffer, nothing past it (the job hung when it raised alone
    while its peers, settled on MPI, waited there)."""
    cache = str(tmp_path / "selection.json")
    env = {"CXLMPI_TUNING": "adaptive", "CXLMPI_CACHE": cache, "CXLMPI_TIMEOUT": "60"}
    proc = run_mpi(nranks, [SETTLED_HEADER, cache], env=env)
    result = tagged_json(proc.stdout, "RESULT")
    assert result == {"steps": 0, "pool": 0, "wrong": 0}, result


def test_small_messages_learn_in_runs_that_stay_cheap() -> None:
    """1 MiB: a try is a run of 4 calls (one header step for all of them),
    but a candidate's first look is a single call, so a far slower one
    (4-5x here) costs one call (and one more at a re-check); the first
    2000 calls stay within 3 %."""
    table = {"mpi": 100e-6, "pool+stream": 500e-6, "pool": 80e-6, "pool+bigchunk": 120e-6,
             "pool+stream+bigchunk": 400e-6}
    job = realistic()
    for call in range(2000):
        job.call(BCAST, 1 << 20, fixed(table), call)
    assert job.time <= 1.03 * alone(80e-6, 2000, 1 << 20), (job.time, job.learning)
    learner = job.selectors[0].learners[(BCAST, 20, 0)]
    assert learner.best == code_of("pool") and learner.run_len == 4
    assert len(learner.samples[code_of("pool+stream")]) <= 2


def test_a_first_run_times_only_its_warm_calls() -> None:
    """A class's first run opens on MPI with its cold first call, which
    ranks leave apart (a 1 MiB Scatter's root 0.4-0.6 ms after the other
    rank, which waited that long in its next call, under MPICH), and MPI
    warms up over the next few (a 64 KiB Alltoall, 4 ranks: 80-250 us
    before 35-40 us): of a first run of 8 calls, neither that call nor the
    next three are timed, the other four are."""
    proc = run_mpi(2, [FIRST_RUN], env=ADAPTIVE_ENV)
    result = tagged_json(proc.stdout, "RESULT")
    assert result == {"timed": [0, 0, 0, 0, 1, 2, 3, 4], "same": True}, result


@pytest.mark.parametrize("nranks", [2, 3])
def test_runs_of_collectives_with_a_header_step_each_call_are_timed_end_to_end(
        nranks: int) -> None:
    """Scatter, Gather and their v-forms open every call with a header
    step, which ended the run in flight: their tries were single calls,
    timed alone, and a path that lets the root write and go looked faster
    than back to back (a 256 KiB Scatter's streaming path 16 us against
    25, MPI's 30 against 19: the class kept a path at 0.7x of stock).  A
    run's own header steps leave it going now: a pool run of Scatter and
    an MPI run of Gatherv time every call after the opening one, a call
    of another size ends the run on every rank -- and no rank keeps its
    report pending from a header step a peer's pass cut short (that rank
    alone carried it into the next step: a mismatch on every rank) --
    and every result is stock's."""
    proc = run_mpi(nranks, [HEADER_RUNS], env=ADAPTIVE_ENV)
    result = tagged_json(proc.stdout, "RESULT")
    assert result["same"], result
    assert result["scatter"] == result["gatherv"] == list(range(7)), result
    assert result["other_size"][:2] == [result["class"]] * 2, result
    assert result["other_size"][2] != result["class"], result
    assert result["stale_report"] is False, result
