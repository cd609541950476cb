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
    """Rank 1's Bcast names N doubles of a view SHORT doubles shorter (returns
    where rank 1's buffer ends, in bytes, as every stage)."""
    if RANK == 0:
        whole[:N] = np.arange(N) + 7
    c.Bcast([whole[:N - (SHORT if RANK == 1 else 0)], N, MPI.DOUBLE], 0)
    return (N - SHORT) * 8


def _allgatherv(c: MPI.Intracomm, whole: np.ndarray) -> int:
    """Rank 1's receive buffer is SHORT doubles shorter than the counts say."""
    count = N // SIZE
    view = whole[:count * SIZE - (SHORT if RANK == 1 else 0)]
    c.Allgatherv(np.full(count, float(RANK + 1)),
                 [view, [count] * SIZE, [count * q for q in range(SIZE)], MPI.DOUBLE])
    return (count * SIZE - SHORT) * 8


def _barrier(c: MPI.Intracomm, whole: np.ndarray) -> int:
    c.Barrier()
    return whole.nbytes


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
    _check_stages((("Bcast", _bcast), ("Allgatherv", _allgatherv), ("Barrier", _barrier)),
                  first)


def _vectors(blocks: list[int], cut: int, item: int) -> tuple:
    """The v-collectives whose counts only some ranks know, each with rank
    1's own message `cut` elements shorter than its counts (`blocks[q]`
    elements of rank q's, of `item` bytes: MPI.BYTE or MPI.DOUBLE;
    Alltoallv only where all are alike)."""
    dtype, mpitype = (np.uint8, MPI.BYTE) if item == 1 else (np.float64, MPI.DOUBLE)
    short = cut if RANK == 1 else 0
    mine, most = blocks[RANK], max(blocks)
    counts, displs = blocks, [sum(blocks[:q]) for q in range(SIZE)]

    def as_whole(mem: np.ndarray) -> np.ndarray:
        return mem.view(dtype)

    def gatherv(c: MPI.Intracomm, mem: np.ndarray) -> int:
        whole = as_whole(mem)   # (the root receives past its own block)
        whole[:mine - short] = RANK + 1
        c.Gatherv([whole[:mine - short], mine, mpitype],
                  [whole[most:most + sum(blocks)], counts, displs, mpitype] if RANK == 0
                  else None, 0)
        return (mine - cut) * item

    def scatterv(c: MPI.Intracomm, mem: np.ndarray) -> int:
        whole = as_whole(mem)
        send = np.arange(sum(blocks), dtype=dtype) + 3
        c.Scatterv([send, counts, displs, mpitype] if RANK == 0 else None,
                   [whole[:mine - short], mine, mpitype], 0)
        return (mine - cut) * item

    def alltoallv(c: MPI.Intracomm, mem: np.ndarray) -> int:
        whole = as_whole(mem)
        send = np.arange(sum(blocks), dtype=dtype) + 5 * RANK
        c.Alltoallv([send, counts, displs, mpitype],
                    [whole[:sum(blocks) - short], counts, displs, mpitype])
        return (sum(blocks) - cut) * item

    stages = [("Gatherv", gatherv), ("Scatterv", scatterv)]
    if len(set(blocks)) == 1:
        stages.append(("Alltoallv", alltoallv))
    return (*stages, ("Barrier", _barrier))


@pytest.mark.parametrize("small, large, cut, item",
                         [(4, 4, 2, 1), (N // 2, N // 2, SHORT, 8), (1, N // 2, SHORT, 8)],
                         ids=["small", "large", "mixed"])
def test_a_vector_refused_on_one_rank_fails_no_peer(small: int, large: int, cut: int,
                                                    item: int) -> None:
    """Gatherv, Scatterv and Alltoallv, each with rank 1's own message
    running past its buffer, as the test above.  Small ones (4 bytes a
    rank) go to MPI on the ranks whose own counts are small without a
    header step; rank 1 must follow them there, on its scratch copy.
    (Before, it took the header step, found the pass and raised alone,
    while its peers waited in MPI for ever.)  Mixed: rank 1's block is
    large, the others' one double, so that at 3 and 4 ranks the root and
    rank 1 meet in the header step while the others pass (rank 1 follows
    them to MPI from there)."""
    blocks = [small] * SIZE
    if SIZE > 1:
        blocks[1] = large
    _check_stages(_vectors(blocks, cut, item), False)


def _check_stages(stages: tuple, first: bool) -> None:
    """Run `stages` on a wrapped and a plain duplicate of the world (the
    wrapped one's first call: the first stage where `first`), and agree
    on the outcomes the tests above describe."""
    if SIZE < 2:
        pytest.skip("needs a peer")
    wrapped = cxlmpi.wrap(PLAIN.Dup())
    plain = PLAIN.Dup()
    if not first:
        wrapped.Allreduce(np.ones(N), np.empty(N))
    outcomes, problems = [], []
    for name, stage in stages:
        got, want = np.zeros(3 * N + 64), np.zeros(3 * N + 64)
        try:
            stage(wrapped, got)
            outcomes.append("returned")
        except (CXLMPIError, ValueError) as exc:   # (a CXLMPIMessageError is both)
            outcomes.append(type(exc).__name__)
        end = stage(plain, want)   # (stock, on every rank: the same call as given)
        end = end if RANK == 1 else got.nbytes   # (bytes)
        mine, stocks = got.view(np.uint8), want.view(np.uint8)
        if outcomes[-1] == "returned" and not np.array_equal(mine[:end], stocks[:end]):
            problems.append(f"{name} returned values other than stock's")
        if np.any(mine[end:]):
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
