"""Nonblocking and persistent collectives through the pool (issue: overlap).

Each test runs tests/scripts/nonblocking.py as a whole MPI job: every value
is compared with what stock MPI gives on the same data, and the job counts
the calls the pool took, so that a run in which the pool took none (every
call passed to MPI: nothing tested) fails where it must not.
"""

from __future__ import annotations

import json
import re

import pytest
from cxlmpi._shim import POSTED_TO_POOL, POSTED_UNDER_TUNING_POOL
from harness import launch_mpi, run_mpi

SCRIPT = "tests/scripts/nonblocking.py"
FORMS = "tests/scripts/posted_forms.py"
FIRST = "tests/scripts/posted_first.py"
RESERVE = "tests/scripts/init_reserve.py"
# Every size through the pool (CXLMPI_NONBLOCKING_THRESHOLD=0): the tests'
# messages are small, to stay quick.
ANY = {"CXLMPI_TIMEOUT": "60", "CXLMPI_CACHE": "off", "CXLMPI_NONBLOCKING_THRESHOLD": "0"}
POOL = {**ANY, "CXLMPI_TUNING": "pool"}


def result(env: dict[str, str], nranks: int, scenario: str, *args: str,
           script: str = SCRIPT) -> dict:
    proc = run_mpi(nranks, [script, scenario, *args], env=env, timeout=300)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    assert len(lines) == 1, proc.stdout + proc.stderr
    out = json.loads(lines[0][len("RESULT "):])
    # What the pool took is what the reference's pool table says it takes
    # (docs/reference/pool.md is generated from these lists).
    listed = POSTED_TO_POOL + (POSTED_UNDER_TUNING_POOL if env.get("CXLMPI_TUNING") == "pool"
                               else ())
    assert {f"i{k}" for k in out["by"]} <= {m.lower() for m in listed}, out["by"]
    return out


@pytest.mark.parametrize("nranks", [2, 3])
@pytest.mark.parametrize("scenario", ["each", "forms", "inflight", "persistent", "progress",
                                      "free"])
def test_posted_collectives_equal_stock(scenario: str, nranks: int) -> None:
    """Every nonblocking and persistent form the pool serves gives stock's
    values (in place, several sizes and roots; many calls in flight on one
    communicator with point-to-point and stock requests in the same
    Waitall, Waitany or Testall; persistent requests started many times,
    Startall over lists mixed with stock persistent requests; calls that
    progress while their ranks compute; a communicator freed with calls in
    flight), and the pool took them (before it, all went to MPI: posted 0)."""
    out = result(POOL, nranks, scenario)
    assert out["ok"], out["problems"]
    assert out["posted"] > 0, out


@pytest.mark.parametrize("nranks", [2, 3, 4])
def test_rooted_and_counted_forms_are_posted(nranks: int) -> None:
    """Igather, Iscatter, Iallgatherv and Ireduce_scatter, and their
    persistent forms, give stock's values (every root, in place, uneven
    counts), and the pool took each of them (before, MPI took them all)."""
    out = result(POOL, nranks, "rooted")
    assert out["ok"], out["problems"]
    assert {"gather", "scatter", "allgatherv", "reduce_scatter"} <= set(out["by"]), out


@pytest.mark.parametrize("nranks", [2, 3, 4])
def test_vector_forms_are_posted_whatever_their_size(nranks: int) -> None:
    """Igatherv, Iscatterv, Ialltoallv and their persistent forms give
    stock's values (every root, in place and None at the root, counts of
    zero, one and thousands of elements, a derived datatype at the root and
    arrays elsewhere), and the pool took each of them (before, MPI took them
    all: only some ranks hold the counts, so no size decides their path; the
    worker now learns the largest block first).  Without staging the root's
    send vector, or its receive vector of no elements, that root left the
    call for MPI alone: a mismatch, or a timeout."""
    out = result(POOL, nranks, "vectors")
    assert out["ok"], out["problems"]
    assert {"gatherv", "scatterv", "alltoallv"} <= set(out["by"]), out


@pytest.mark.parametrize("nranks", [2, 3])
def test_a_rank_that_sends_nothing_as_none_posts_with_its_peers(nranks: int) -> None:
    """A rank that sends or receives nothing as mpi4py lets it say so
    (``[None, MPI.INT]``, ``[None, None, MPI.INT]``, ``[None, counts,
    displs, MPI.INT]`` with zero counts) posts Iallgatherv, Igatherv,
    Iscatterv, Ialltoallv and Ibcast to the pool with its peers, on a
    communicator's first call and later, and every value is stock's.
    Before, that rank sent the call to MPI alone: its peers hung in the
    pool's set-up, or timed out in its step."""
    out = result({**POOL, "CXLMPI_THRESHOLD": "0"}, nranks, "empty", script=FORMS)
    assert out["ok"], out["problems"]
    assert {"allgatherv", "gatherv", "scatterv", "alltoallv"} <= set(out["by"]), out
    assert not out["passed"], out


@pytest.mark.parametrize("nranks", [2, 3])
def test_none_as_in_place_takes_the_pool_as_stock_takes_it(nranks: int) -> None:
    """None where mpi4py reads MPI.IN_PLACE (Allgather, Allreduce, Alltoall,
    Scan, Reduce_scatter_block; the root's buffer of Reduce, Gather and
    Scatter), posted and blocking, on a fresh communicator and again: the
    pool takes every one (but the blocking Scatter, which goes to MPI on
    every rank), with stock's values.  Before, the posted forms
    refused it as a message the pool cannot read, and every rank raised
    (mpi4py's own test_cco_nb_buf under CXLMPI_TUNING=pool)."""
    out = result(POOL, nranks, "none", script=FORMS)
    assert out["ok"], out["problems"]
    families = {"allgather", "allreduce", "alltoall", "scan", "reduce_scatter_block",
                "reduce", "gather", "scatter"}
    assert out["by"] == {k: 2 for k in families}, out
    # (a blocking Scatter whose root passes None goes to MPI: see Scatter)
    assert set(out["blocking"]) == families - {"scatter"}, out


@pytest.mark.parametrize("nranks", [2, 3])
def test_a_message_one_rank_cannot_post_fails_every_rank(nranks: int) -> None:
    """A root whose message the pool cannot take (its send buffer inside
    its receive vector's span; a negative count), on a first call and on a
    communicator with a pool: every rank raises CXLMPIMessageError, and
    none hangs.  Before, the root sent the call to MPI alone (or raised
    before the pool's set-up), and its peers waited for ever."""
    out = result(POOL, nranks, "refused", script=FORMS)
    assert out["ok"], out["problems"]


def test_adaptive_selection_posts_too() -> None:
    """Under the default adaptive selection the posted calls follow the
    classes' settled paths (an unsettled class: the pool) and still agree
    with stock."""
    out = result(ANY, 2, "each")
    assert out["ok"], out["problems"]
    assert out["posted"] > 0, out


@pytest.mark.parametrize("nranks", [2, 3])
def test_a_class_no_call_settled_takes_the_builtin_window(nranks: int) -> None:
    """Posted calls of classes that adaptive selection has settled none of
    (no blocking call of the class came first): the builtin windows decide
    (Ibcast of 1 MiB: MPI; Iallgather: the pool below 512 KiB, MPI above),
    a pool call runs the class's likeliest variant (also beside a blocking
    call's timed run of another variant), and the values equal stock's.
    Before, every such call took the pool's plain path: a program
    of Ibcasts alone ran at 0.35-0.77x of stock from 1 MiB (bench above)."""
    out = result(ANY, nranks, "-", script="tests/scripts/unsettled.py")
    assert out["ok"], out["problems"]
    assert out["by"] == {"allreduce": 2, "allgather": 1}, out
    assert out["passed"] == {"bcast": 1, "allgather": 1}, out


@pytest.mark.parametrize("env", [{"MPI4PY_RC_THREAD_LEVEL": "serialized"},
                                 {"CXLMPI_NONBLOCKING": "0"},
                                 {"CXLMPI_NONBLOCKING_THRESHOLD": "2M"}],
                         ids=["serialized", "off", "below-threshold"])
def test_without_a_worker_every_call_goes_to_mpi(env: dict[str, str]) -> None:
    """Where MPI was started below MPI_THREAD_MULTIPLE (the worker thread
    could not complete requests), with CXLMPI_NONBLOCKING=0, or for calls
    below CXLMPI_NONBLOCKING_THRESHOLD (2 MiB here, above every message of
    the scenario), every posted call passes to MPI, with stock's values."""
    out = result({**POOL, **env}, 2, "each")
    assert out["ok"], out["problems"]
    assert out["posted"] == 0 and out["passed"] > 0, out


@pytest.mark.parametrize("nranks, how", [(2, "wait"), (3, "wait"), (2, "waitall"),
                                          (3, "counts")])
def test_mismatched_posted_calls_raise_on_every_rank(nranks: int, how: str) -> None:
    """Rank 0 posts an Iallreduce, the others an Ibcast of the same bytes
    (or: an Igatherv whose root names one element more than the last rank
    sends): every rank's Wait (or MPI's Waitall) raises; none hangs."""
    out = result(POOL, nranks, "mismatch", how)
    assert out["ok"], out["problems"]


@pytest.mark.parametrize("nranks", [1, 4])
def test_one_and_four_ranks(nranks: int) -> None:
    """The same on one rank (the pool of one) and on four (oversubscribed)."""
    out = result(POOL, nranks, "each")
    assert out["ok"], out["problems"]


def test_a_persistent_collective_started_many_times() -> None:
    """300 starts of each persistent request, data changing, against stock."""
    out = result(POOL, 2, "persistent", "300")
    assert out["ok"], out["problems"]


def test_a_call_no_peer_posts_times_out() -> None:
    """Only rank 0 posts an Iallreduce: its Wait raises a timeout error
    (CXLMPI_TIMEOUT), as a blocking call's would, instead of hanging."""
    out = result({**POOL, "CXLMPI_TIMEOUT": "3"}, 2, "timeout")
    assert out["ok"], out["problems"]


def test_posted_calls_run_the_variant_their_class_settled_on() -> None:
    """A class settled on a pool variant (pinned here, every variant in
    turn) posts its calls with that variant, and they agree with stock."""
    out = result(ANY, 2, "variants")
    assert out["ok"], out["problems"]
    assert out["posted"] > 0, out


@pytest.mark.parametrize("nranks", [2, 3])
@pytest.mark.parametrize("how", ["explicit", "implicit"])
def test_calls_in_flight_at_finalize_end_before_mpi_does(nranks: int, how: str) -> None:
    """Iallreduce calls never waited when the program calls MPI_Finalize
    (or ends, and mpi4py calls it): they end, with stock's values, before
    MPI finalizes, and the program is told once; no MPI routine runs after
    it (the worker used to progress MPI and complete their requests after
    MPI_Finalize), nor inside it (there MPICH aborted 1-4 % of these jobs:
    a mutex of its own busy as it destroyed it)."""
    proc = run_mpi(nranks, ["tests/scripts/finalize_in_flight.py",
                            *(["implicit"] if how == "implicit" else [])], env=POOL,
                   timeout=120)
    # (each rank prints its own line: after MPI_Finalize nothing gathers)
    results = [json.loads(m) for m in re.findall(r"RESULT (\{[^}]*\})", proc.stdout)]
    assert sorted(r["rank"] for r in results) == list(range(nranks)), proc.stdout
    assert all(r["same"] for r in results) or how == "implicit", results
    assert "after finalizing" not in proc.stderr + proc.stdout, proc.stderr
    assert "still in flight at MPI_Finalize" in proc.stderr, proc.stderr


@pytest.mark.parametrize("nranks", [2, 3])
def test_a_posted_call_never_waits_for_its_peers(nranks: int) -> None:
    """Rank 0 posts Iallreduce, Ibcast, Ibarrier and Iallgatherv (or starts
    their persistent forms), then sends to each peer, which receives before
    it posts them (legal: stock runs it): stock's values on a wrapped
    COMM_WORLD, a fresh communicator, one whose pool is set up, and ones
    whose pool a Barrier, an object collective or the *_init made ready
    for posted calls -- where the pool must take them.  Before, the posted
    calls waited for their peers in the settings check, the pool's set-up
    or the reserving of its data halves while the peers waited in
    MPI_Recv: the job hung."""
    out = result(POOL, nranks, "", script=FIRST)
    assert out["ok"], out["problems"]
    taken = out["states"]
    assert all(taken[s] > 0 for s in ("ready by a barrier", "ready by an object call",
                                      "persistent")), out


@pytest.mark.parametrize("nranks", [2, 3])
def test_an_init_reserves_the_pools_memory_only_where_a_plan_wants_it(nranks: int) -> None:
    """On a fresh communicator, a Barrier_init (MPI's, always) and an
    Allreduce_init below CXLMPI_NONBLOCKING_THRESHOLD reserve none of the
    pool's data memory; an Allreduce_init above it reserves it once, and
    the pool takes its runs -- stock's values every run, the same counts
    on every rank.  Before, every *_init reserved the data halves (64 MiB
    of /dev/shm by default), whatever its size."""
    out = result({"CXLMPI_TIMEOUT": "60", "CXLMPI_CACHE": "off", "CXLMPI_TUNING": "pool",
                  "CXLMPI_ORDERING": "0"}, nranks, "", script=RESERVE)
    assert out["ok"], out["problems"]
    assert out["steps"] == {"Barrier_init": 0, "small Allreduce_init": 0,
                            "large Allreduce_init": 1}, out
    assert out["taken"] == {"Barrier_init": 0, "small Allreduce_init": 0,
                            "large Allreduce_init": 3}, out


@pytest.mark.parametrize("nranks", [2, 3])
def test_a_posted_calls_status_is_a_stock_generalized_requests(nranks: int) -> None:
    """The status of a pool request (completed by Wait, Test, Waitall
    beside stock point-to-point requests, Get_status), marked beforehand,
    is what a stock generalized request completed the same way gives: an
    Iallreduce's (its end runs no Python), a staged Ibcast's (its end
    copies back through Python) and an Allreduce_init's; every result
    equals stock's.  The shim fills the status in C at offsets found
    through mpi4py: one field left unset (the tag) fails it."""
    proc = run_mpi(nranks, ["tests/scripts/posted_status.py"], env=POOL, timeout=120)
    [line] = [x for x in proc.stdout.splitlines() if x.startswith("STATUS ")]
    for rank in json.loads(line[len("STATUS "):]):
        assert rank["failures"] == [], rank
        assert rank["pool"] == {"iallreduce": 17, "ibcast": 8}, rank


@pytest.mark.parametrize("nranks", [2, 3])
def test_posted_calls_completed_by_mpi_back_to_back_never_deadlock(nranks: int) -> None:
    """3,000 posted calls, each completed by MPI.Request.Waitall, stock's
    values every one.  MPI may free such a request inside the worker's
    MPI_Grequest_complete, whose free function takes the GIL; the next post
    started its request holding the GIL, and waited for MPI's lock the
    worker held: 3 of 5 such jobs hung (a CPU-bound process beside them)."""
    job = launch_mpi(nranks, ["tests/scripts/posted_waitall_race.py", "3000"],
                     env={**POOL, "CXLMPI_TIMEOUT": "20"}, timeout=120)
    assert not job.timed_out and job.returncode == 0, job.describe()
    [line] = [x for x in job.stdout.splitlines() if x.startswith("RACE ")]
    assert json.loads(line[len("RACE "):]) == [{"wrong": 0, "pool": 3000}] * nranks, line
