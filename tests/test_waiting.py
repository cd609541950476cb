"""Ranks that wait in the pool get out of the way of the rank they wait for
(issue 12, item 4): on one host they sleep on the peer's control word and
the peer wakes them; where no futex can reach (another host) they back off.

Each test launches whole MPI jobs (tests/scripts/waiting.py) in which
every futex sleep is bounded by an hour, so that a lost wake-up hangs the
job (and fails the test) instead of costing a millisecond; results are
compared with stock MPI's on the same data.  Nothing here measures time.
"""

from __future__ import annotations

import json
import os

import pytest
from harness import SMALL_POOL_ENV, launch_mpi

WAITING = "tests/scripts/waiting.py"


def run(nranks: int, scenario: str) -> list[dict]:
    """Every rank's verdict and wait counters from one job of waiting.py."""
    # (the waits are a pool Barrier's: CXLMPI_ORDERING would send it to MPI)
    job = launch_mpi(nranks, [WAITING, scenario],
                     env=dict(SMALL_POOL_ENV, CXLMPI_TIMEOUT="60", CXLMPI_ORDERING="0"),
                     timeout=120)
    assert job.returncode == 0, job.describe()
    found = [line[len("RESULT "):] for line in job.stdout.splitlines()
             if line.startswith("RESULT ")]
    assert len(found) == 1, job.describe()
    every = json.loads(found[0])
    assert [r["ok"] for r in every] == [True] * nranks, every
    return every


@pytest.mark.parametrize("nranks", [2, 3, 4])
def test_a_sleeping_waiter_is_woken(nranks: int) -> None:
    """Rank 0 computes while its peers wait for it in a pool Barrier: they
    fall asleep on rank 0's control word (at 3 and 4 ranks, more than this
    machine's cores, after yielding to it for a while), and rank 0's
    arrival wakes them (no sleep ends by its one-hour bound: without the
    wake-up the job hangs)."""
    every = run(nranks, "woken")
    assert every[0]["futex_wakes"] >= 1, every
    for counts in every[1:]:
        assert counts["futex_sleeps"] >= 1 and counts["futex_timeouts"] == 0, every


def test_a_peer_on_another_host_is_not_slept_on() -> None:
    """The last rank looks as if on another host: it never sleeps on a
    futex, nor does anyone sleep on its word (it backs off instead), while
    the ranks of one host still sleep on rank 0 and are woken."""
    every = run(3, "other-host")
    assert every[2]["futex_sleeps"] == 0 and every[2]["backoff_rounds"] > 0, every
    assert every[1]["futex_sleeps"] >= 1 and every[0]["futex_wakes"] >= 1, every


@pytest.mark.parametrize("nranks", [3, 4])
def test_more_ranks_than_cores_match_stock(nranks: int) -> None:
    """Collectives of every family with ranks arriving at different times
    (more ranks than this machine's cores in the suite's usual setting):
    every result equals stock MPI's; waiters got out of the way (yielded
    to the ranks sharing their CPU, or slept), and no sleep ended by its
    one-hour bound (a lost wake-up hangs the job)."""
    every = run(nranks, "loop")
    assert sum(r["hand_overs"] + r["futex_sleeps"] for r in every) > 0, every
    assert sum(r["futex_timeouts"] for r in every) == 0, every


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two CPUs")
def test_ranks_bound_to_a_core_each_busy_poll() -> None:
    """Two ranks bound to a CPU each (as `mpiexec -bind-to core` does) have
    a core per rank: their waiters busy-poll before sleeping.  Decided from
    the union of the node's affinity masks, not one rank's own mask (one
    CPU: the ranks took turns and slept, as if oversubscribed)."""
    assert [r["spin"] for r in run(2, "apart")] == [True, True]


def test_ranks_bound_to_one_cpu_take_turns() -> None:
    """Two ranks bound to the same CPU: no busy-polling on either."""
    assert [r["spin"] for r in run(2, "together")] == [False, False]


def test_the_words_peers_read_on_every_call_stay_in_their_readers_caches() -> None:
    """After every step and every call it passes to MPI, a rank reads each
    peer's `asleep` word (whether to wake it).  That word and `cpu` are
    written only when a rank falls asleep, wakes or moves, so they must not
    share a 64-byte line with `seq` or `passed`, which their rank writes at
    every step and pass: each read would then fetch the line from the
    writer's cache (measured 0.1-0.2 us per passed 8-byte call at 2 ranks,
    when `asleep` sat beside `passed`)."""
    from cxlmpi._pool import LAYOUT

    line = LAYOUT["line_nbytes"]
    busy = {LAYOUT["ctrl_seq"] // line, LAYOUT["ctrl_passed"] // line}
    quiet = {LAYOUT["ctrl_asleep"] // line, LAYOUT["ctrl_cpu"] // line}
    assert not busy & quiet, LAYOUT
    # adjacent-line prefetch works on pairs of lines: ranks' lines never pair
    assert LAYOUT["ctrl_nbytes"] % (2 * line) == 0, LAYOUT
