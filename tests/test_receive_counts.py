"""Receive buffers larger than the message (issue #38, item 7): mpi4py
infers a receive count from the buffer and MPICH takes a count above what
arrives, so real programs do it.  Every rank must decide the path from what
all ranks hold alike (what is sent), never sit in the pool's set-up while a
peer sits in the user's collective, and run such calls as stock MPI does.

Each job is bounded (tests/harness.py launch_mpi): a hang fails the test
with the job's output, it never hangs pytest."""

from __future__ import annotations

import json
import os

import pytest
from harness import SMALL_POOL_ENV, launch_mpi

RECV_LARGER = "tests/scripts/recv_larger.py"
BCAST_COUNTS = "tests/scripts/bcast_counts.py"


def no_stock_on_open_mpi(why: str) -> pytest.MarkDecorator:
    """Skip on Open MPI, where stock has no outcome to compare with (`why`)."""
    return pytest.mark.skipif(bool(os.environ.get("CXLMPI_TEST_OPENMPI")),
                              reason=f"stock Open MPI: {why}")


def tagged_json(stdout: str, tag: str) -> dict:
    """The JSON that rank 0 printed after `tag`."""
    return json.loads(stdout.split(tag + " ", 1)[1].splitlines()[0])


@no_stock_on_open_mpi("its Alltoall with larger receive counts raises MPI_ERR_TRUNCATE; "
                      "MPICH runs these calls")
@pytest.mark.parametrize("nranks", [2, 3])
@pytest.mark.parametrize("settings", ["small", "default"])
def test_receive_buffers_larger_than_the_message_run_as_stock(nranks: int,
                                                              settings: str) -> None:
    """Gather (the root's buffer twice the data; also IN_PLACE), Scatter
    (receive buffers twice the block; also IN_PLACE at the root),
    Allgather, Alltoall, Alltoallv (receive counts twice the send counts),
    Gatherv and Scatterv, 300 calls each on a fresh communicator, at a size
    whose sent bytes are below the pool's threshold and whose receive
    buffers are above it, and at one inside the windows: what arrives
    equals stock's, bit for bit.  Before, the Gather hung at its first call
    (the root in MPI_Gather, the others in the pool set-up's Allgather),
    the Scatter raised CXLMPIMismatchError at its 9th call and the
    Alltoallv at its first."""
    env = dict(SMALL_POOL_ENV if settings == "small" else {}, CXLMPI_TIMEOUT="20")
    job = launch_mpi(nranks, [RECV_LARGER, "300"], env=env, timeout=240)
    assert not job.timed_out, "the job hung: " + job.describe()
    assert job.returncode == 0, job.describe()
    checks = tagged_json(job.stdout, "RESULT")
    assert len(checks) == 18, job.describe()
    assert [name for name, ok in checks.items() if not ok] == [], job.describe()


@no_stock_on_open_mpi("it aborts the process (SIGABRT) on a Bcast whose receivers name "
                      "other bytes than its root; MPICH raises")
@pytest.mark.parametrize("nranks", [2, 3])
@pytest.mark.parametrize("settings", ["small", "default"])
def test_bcast_with_receive_buffers_of_another_size_runs_as_stock(nranks: int,
                                                                   settings: str) -> None:
    """Bcast whose receivers name twice (or half) the root's bytes, sizes
    straddling the pool's threshold and inside its windows, on a
    communicator whose pool exists and on a fresh one: every rank ends as stock
    MPI's does on the same data (it returns, or raises an MPI error of the
    same class: MPICH raises on such receivers), with the same bytes in its
    buffer, and the communicator still agrees with stock afterwards.
    Before, the calls inside the windows raised CXLMPIMismatchError on
    every rank, and those straddling the threshold on a fresh communicator
    hung (the receivers in the pool's set-up, the root in MPI_Bcast); so
    would a Bcast_init straddling the posted calls' threshold."""
    # (the pool path pinned: adaptive selection sends these sizes to MPI
    # on this machine, where the calls already ran as stock)
    env = dict(SMALL_POOL_ENV if settings == "small" else {}, CXLMPI_TIMEOUT="20",
               CXLMPI_TUNING="pool")
    job = launch_mpi(nranks, [BCAST_COUNTS], env=env, timeout=180)
    assert not job.timed_out, "the job hung: " + job.describe()
    assert job.returncode == 0, job.describe()
    cases = tagged_json(job.stdout, "RESULT")
    assert len(cases) == 10, job.describe()
    for case, ranks in cases.items():
        for rank, (wrapped, stock, same_data, after) in enumerate(ranks):
            assert wrapped == stock and same_data and after, (case, rank, ranks)
