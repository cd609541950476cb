"""Message forms that some ranks use and their peers do not: predefined
datatypes the pool has no kernel for (MPI.PACKED, long double), moved as
their bytes, and messages at MPI.BOTTOM (a datatype of absolute
addresses), staged.  MPI matches type signatures (MPI.PACKED matches any),
not forms, so each call is legal, and stock MPI's result is the reference.

Before, a rank with such a message sent the call to MPI alone: on a fresh
communicator its peers waited in the pool's set-up for ever (at 2 ranks
too), and across pool groups a settled call has no header step at which
the others could follow.  Each test runs on fresh communicators.  At 4
ranks the odd ranks are 2 (a group leader at CXLMPI_POOL_GROUPS=2) and 3,
and the roots 0 and 3.
"""

from __future__ import annotations

import numpy as np
import pytest
from common import CFG, RANK, SIZE, fresh_against_stock, make_data
from mpi4py import MPI

ODD = RANK in {SIZE - 1, SIZE // 2}
ROOTS = sorted({0, SIZE - 1})
CALLS = 6
# elements per rank: above the pool's window, several chunks
N = max(2 * CFG.threshold, 3 * CFG.chunk_size + 24) // 8
# one long double every two: a derived datatype of a type the pool did not know
LD = np.dtype(np.longdouble)
SPACED_LD = MPI.LONG_DOUBLE.Create_resized(0, 2 * LD.itemsize).Commit()


def packed(data: np.ndarray, comm: MPI.Comm) -> np.ndarray:
    """`data` (doubles) packed by MPI: the bytes a PACKED message holds."""
    out = np.zeros(MPI.DOUBLE.Pack_size(data.size, comm), np.uint8)
    MPI.DOUBLE.Pack(data, out, 0, comm)
    return out


def unpacked(raw: np.ndarray, count: int, comm: MPI.Comm) -> np.ndarray:
    out = np.zeros(count)
    MPI.DOUBLE.Unpack(raw, 0, out, comm)
    return out


def differs(got: np.ndarray, want: np.ndarray) -> str:
    return "" if got.shape == want.shape and np.array_equal(got, want) else "values"


@pytest.mark.parametrize("root", ROOTS)
def test_bcast_of_packed_bytes(root: int) -> None:
    """The root sends packed bytes, the others receive doubles."""
    def call(c, seed):
        data = make_data(np.float64, N, seed, rank=root)
        if RANK == root:
            c.Bcast([packed(data, c), MPI.PACKED], root)
            return data
        out = np.zeros(N)
        c.Bcast(out, root)
        return out
    fresh_against_stock(f"Bcast from a PACKED root {root}", call, differs, CALLS, "bcast")


@pytest.mark.parametrize("root", ROOTS)
def test_gather_into_packed_bytes(root: int) -> None:
    """The root receives every rank's doubles as packed bytes."""
    def call(c, seed):
        mine = make_data(np.float64, N, seed)
        if RANK != root:
            c.Gather(mine, None, root)
            return np.zeros(0)
        raw = np.zeros(SIZE * MPI.DOUBLE.Pack_size(N, c), np.uint8)
        c.Gather(mine, [raw, MPI.PACKED], root)
        return unpacked(raw, SIZE * N, c)
    fresh_against_stock(f"Gather into PACKED at root {root}", call, differs, CALLS, "gather")


def test_allgather_of_long_doubles() -> None:
    """Long doubles, bare on some ranks and one every two (a derived
    datatype of them) on the odd ones; the gaps stay as they were."""
    def call(c, seed):
        data = make_data(np.float64, N, seed).astype(LD)
        if ODD:
            raw = np.full(2 * N, -7.0, LD)
            raw[::2] = data
            msg = [raw, N, SPACED_LD]
        else:
            msg = data
        out = np.zeros(N * SIZE, LD)
        c.Allgather(msg, out)
        kept = not ODD or bool(np.all(raw[1::2] == -7.0))
        return np.append(out, LD.type(kept))
    fresh_against_stock("Allgather of long doubles, derived on some ranks", call, differs,
                        CALLS, "allgather")


def at_bottom(arr: np.ndarray) -> tuple[list, MPI.Datatype]:
    """A message of `arr`'s doubles at MPI.BOTTOM: one struct of their
    absolute address (the datatype, to free)."""
    t = MPI.Datatype.Create_struct([arr.size], [MPI.Get_address(arr)], [MPI.DOUBLE]).Commit()
    return [MPI.BOTTOM, 1, t], t


@pytest.mark.parametrize("root", ROOTS)
def test_bcast_from_bottom(root: int) -> None:
    """The root sends from MPI.BOTTOM, the others receive plain arrays."""
    def call(c, seed):
        data = make_data(np.float64, N, seed, rank=root) if RANK == root else np.zeros(N)
        if RANK != root:
            c.Bcast(data, root)
            return data
        msg, t = at_bottom(data)
        try:
            c.Bcast(msg, root)
        finally:
            t.Free()
        return data
    fresh_against_stock(f"Bcast from MPI.BOTTOM at root {root}", call, differs, CALLS, "bcast")


def test_allgather_into_bottom() -> None:
    """The odd ranks receive at MPI.BOTTOM (one block a struct of N
    doubles, the next one extent on), the others into plain arrays; around
    the receive array nothing changes."""
    def call(c, seed):
        whole = np.full(N * SIZE + 2, -7.0)
        out = whole[1:-1]
        if ODD:
            t = MPI.Datatype.Create_struct([N], [MPI.Get_address(out)], [MPI.DOUBLE]).Commit()
            try:
                c.Allgather(make_data(np.float64, N, seed), [MPI.BOTTOM, 1, t])
            finally:
                t.Free()
        else:
            c.Allgather(make_data(np.float64, N, seed), out)
        return whole
    fresh_against_stock("Allgather into MPI.BOTTOM on some ranks", call, differs, CALLS,
                        "allgather")


# a double and an int, 16 bytes apart: MPI.DOUBLE_INT's layout, as a
# struct of the user's and as NumPy's aligned record
PAIR = np.dtype([("v", "f8"), ("i", "i4")], align=True)
USER_PAIR = MPI.Datatype.Create_struct([1, 1], [0, 8], [MPI.DOUBLE, MPI.INT]) \
    .Create_resized(0, PAIR.itemsize).Commit()


@pytest.mark.parametrize("root", ROOTS)
def test_bcast_of_pairs(root: int) -> None:
    """MPI.DOUBLE_INT pairs (a predefined type with a gap) on the even
    ranks, a struct of the same layout on the odd ones: each rank's
    padding stays as it was."""
    def call(c, seed):
        pairs = np.zeros(N, PAIR)
        raw = pairs.view(np.uint8).reshape(N, PAIR.itemsize)
        raw[:, 12:] = 0xA5     # the padding
        if RANK == root:
            pairs["v"] = make_data(np.float64, N, seed)
            pairs["i"] = np.arange(N)
        c.Bcast([pairs, N, USER_PAIR if ODD else MPI.DOUBLE_INT], root)
        return raw.copy()
    fresh_against_stock(f"Bcast of DOUBLE_INT pairs from root {root}", call, differs, CALLS,
                        "bcast")


def test_allgatherv_into_bottom() -> None:
    """The odd ranks receive blocks at MPI.BOTTOM, one element a struct of
    one double at the receive array's address, blocks a displacement
    apart (mpi4py refuses a displacement into MPI.BOTTOM's no bytes: the
    staging copies took it there once); around the blocks nothing changes."""
    counts = [N + 3 * q for q in range(SIZE)]
    displs = [sum(counts[:q]) + q for q in range(SIZE)]   # one element of room between

    def call(c, seed):
        whole = np.full(displs[-1] + counts[-1] + 2, -7.0)
        out = whole[1:-1]
        mine = make_data(np.float64, counts[RANK], seed)
        if ODD:
            t = MPI.Datatype.Create_struct([1], [MPI.Get_address(out)], [MPI.DOUBLE]).Commit()
            try:
                c.Allgatherv(mine, [MPI.BOTTOM, (counts, displs), t])
            finally:
                t.Free()
        else:
            c.Allgatherv(mine, [out, (counts, displs), MPI.DOUBLE])
        return whole
    fresh_against_stock("Allgatherv into MPI.BOTTOM on some ranks", call, differs, CALLS,
                        "allgatherv")


def test_pairs_without_gaps() -> None:
    """MPI.FLOAT_INT (a pair without a gap: moved as bytes) on every rank;
    MPICH's handle of it is beyond a Py_ssize_t (its first sight raised
    OverflowError)."""
    pair = np.dtype([("v", "f4"), ("i", "i4")])

    def call(c, seed):
        mine = np.zeros(N, pair)
        mine["v"] = make_data(np.float32, N, seed)
        mine["i"] = RANK
        out = np.zeros(N * SIZE, pair)
        c.Allgather([mine, MPI.FLOAT_INT], [out, MPI.FLOAT_INT])
        return out.view(np.uint8)
    fresh_against_stock("Allgather of FLOAT_INT pairs", call, differs, CALLS, "allgather")


def test_allgatherv_from_a_rank_that_sends_nothing() -> None:
    """The last rank sends no elements as ``[MPI.BOTTOM, 0, MPI.DOUBLE]``
    (or ``[None, 0, ...]``), the others plain arrays."""
    counts = [N] * (SIZE - 1) + [0]

    def call(c, seed):
        out = np.zeros(sum(counts))
        if RANK == SIZE - 1:
            c.Allgatherv([MPI.BOTTOM if seed % 2 else None, 0, MPI.DOUBLE], [out, counts])
        else:
            c.Allgatherv(make_data(np.float64, N, seed), [out, counts])
        return out
    fresh_against_stock("Allgatherv with nothing from the last rank", call, differs, CALLS,
                        "allgatherv")


def test_allgather_into_bottom_around_the_send_buffer() -> None:
    """The odd ranks receive at MPI.BOTTOM into two parts of one array (a
    struct of two runs, resized to a half block per rank) on either side
    of their send buffer, which shares no byte with them.  Judged by its
    reach's hull the message had overlapped the send buffer, and such a
    rank went to MPI alone (MPICH: Message truncated on its peers)."""
    half = N // 2

    def call(c, seed):
        whole = np.full(2 * half * SIZE + 2 * half + 2, -7.0)
        lo, send = whole[1:1 + half * SIZE], whole[1 + half * SIZE:1 + half * SIZE + 2 * half]
        hi = whole[1 + half * SIZE + 2 * half:-1]
        send[:] = make_data(np.float64, 2 * half, seed)
        if ODD:
            parts = MPI.Datatype.Create_struct([half] * 2, [MPI.Get_address(lo),
                                                            MPI.Get_address(hi)],
                                               [MPI.DOUBLE] * 2)
            t = parts.Create_resized(MPI.Get_address(lo), half * 8).Commit()
            parts.Free()
            try:
                c.Allgather(send, [MPI.BOTTOM, 1, t])
            finally:
                t.Free()
            got = np.concatenate([np.concatenate([lo[q * half:(q + 1) * half],
                                                  hi[q * half:(q + 1) * half]])
                                  for q in range(SIZE)])
        else:
            got = np.zeros(2 * half * SIZE)
            c.Allgather(send, got)
        return np.concatenate([got, whole[:1], whole[-1:]])
    fresh_against_stock("Allgather into MPI.BOTTOM around the send buffer", call, differs,
                        CALLS, "allgather")
