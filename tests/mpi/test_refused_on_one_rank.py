"""A message cxlmpi refuses on one rank only (a count, or a block, outside
that rank's buffer: stock MPI would read or write past it).  Stock runs the
call on and corrupts memory; cxlmpi must not, and must not leave a peer
waiting either: where the call takes the pool, every rank raises (the rank
that refused it at once, its peers at this call or their next one on the
communicator); where it goes to MPI, it runs there on a scratch copy of the
refused message, which reaches as far as its counts say (the part inside
the buffer copied back), as stock runs it but for the bytes past the
buffer.  Before, the rank that refused raised alone, and its peers
waited for its step -- then followed its next call's pass into MPI and
hung there (the audit's S10 and S11).

The memory past each short buffer is the test's own (a view of a larger
array), so that stock's writes past it land somewhere harmless."""

from __future__ import annotations

import numpy as np
import pytest
from common import PLAIN, RANK, SIZE, agree
from mpi4py import MPI

import cxlmpi
from cxlmpi.errors import CXLMPIError

N = 8192   # doubles: 64 KiB, the pool's under every test configuration
SHORT = 16


def _bcast(c: MPI.Intracomm, whole: np.ndarray) -> int:
    """Rank 1's Bcast names N doubles of a view SHORT doubles shorter."""
    if RANK == 0:
        whole[:N] = np.arange(N) + 7
    c.Bcast([whole[:N - (SHORT if RANK == 1 else 0)], N, MPI.DOUBLE], 0)
    return N - SHORT


def _allgatherv(c: MPI.Intracomm, whole: np.ndarray) -> int:
    """Rank 1's receive buffer is SHORT doubles shorter than the counts say."""
    count = N // SIZE
    view = whole[:count * SIZE - (SHORT if RANK == 1 else 0)]
    c.Allgatherv(np.full(count, float(RANK + 1)),
                 [view, [count] * SIZE, [count * q for q in range(SIZE)], MPI.DOUBLE])
    return count * SIZE - SHORT


def _barrier(c: MPI.Intracomm, whole: np.ndarray) -> int:
    c.Barrier()
    return len(whole)


@pytest.mark.parametrize("first", [False, True], ids=["set-up", "first-call"])
def test_a_message_refused_on_one_rank_fails_no_peer(first: bool) -> None:
    """Bcast, then Allgatherv, each refused on rank 1 only, then a Barrier
    (first-call: the Bcast is the communicator's first call, which sets its
    pool up).  Every rank reaches the end; a call that returned gave stock's
    values inside the buffers; nothing was written past rank 1's; once a
    rank raised, every rank raised by the Barrier, and raised the refusal
    (CXLMPIMessageError) -- not a timeout, nor a pool closed under it:
    across pool groups too, where the other groups' leaders learn of it
    from the refusing group's leader.  (Before they did not: the other
    groups raised CXLMPITimeoutError or CXLMPIPoolError after
    CXLMPI_TIMEOUT.)"""
    if SIZE < 2:
        pytest.skip("needs a peer")
    wrapped = cxlmpi.wrap(PLAIN.Dup())
    plain = PLAIN.Dup()
    if not first:
        wrapped.Allreduce(np.ones(N), np.empty(N))
    outcomes, problems = [], []
    for name, stage in (("Bcast", _bcast), ("Allgatherv", _allgatherv),
                        ("Barrier", _barrier)):
        got, want = np.zeros(N + 64), np.zeros(N + 64)
        try:
            stage(wrapped, got)
            outcomes.append("returned")
        except (CXLMPIError, ValueError) as exc:   # (a CXLMPIMessageError is both)
            outcomes.append(type(exc).__name__)
        end = stage(plain, want)   # (stock, on every rank: the same call as given)
        end = end if RANK == 1 else len(got)
        if outcomes[-1] == "returned" and not np.array_equal(got[:end], want[:end]):
            problems.append(f"{name} returned values other than stock's")
        if np.any(got[end:]):
            problems.append(f"{name} wrote past rank 1's buffer")
    wrapped.Free()
    plain.Free()
    everyone = PLAIN.allgather(outcomes)
    if any(o != "returned" for row in everyone for o in row):
        problems += [f"rank {q} raised nothing while another raised: {everyone}"
                     for q, row in enumerate(everyone) if all(o == "returned" for o in row)]
    problems += [f"rank {RANK} raised {o}, not the refusal"
                 for o in outcomes if o not in ("returned", "CXLMPIMessageError")]
    agree(not problems, f"rank {RANK}: {problems}")
