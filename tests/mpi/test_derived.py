"""Some ranks describe their messages with a derived datatype, the others
pass plain arrays: MPI matches type signatures, not layouts, so the call is
legal, and stock MPI's result is the reference.

Each collective runs on a communicator of its own, so its first call is the
one that sets the pool up -- a collective step every rank must take alike
(before, the ranks with a derived datatype went to MPI alone and the others
waited in the set-up for ever).  Further calls follow it: with adaptive
selection they learn and then settle; across pool groups a settled call has
no header step in which a rank could tell the others that it went to MPI
(before: the other groups' leaders waited in the leaders' MPI step).  At 4
ranks the derived ranks are 2 (a group leader at CXLMPI_POOL_GROUPS=2) and
3; rooted collectives run at a plain root and at a derived one.

Not the reductions: MPICH and Open MPI refuse a predefined op on any
derived datatype, so a rank that uses one raises, as under stock MPI.

The derived datatype puts a double every 16 bytes: `[b, n, SPACED]` holds
the n doubles of b[::2], and the odd elements must stay as they were.
"""

from __future__ import annotations

import numpy as np
import pytest
from common import CFG, RANK, SIZE, fresh_against_stock, make_data
from mpi4py import MPI

SPACED = MPI.DOUBLE.Create_resized(0, 16).Commit()   # one double in 16 bytes
DERIVED = RANK in {SIZE - 1, SIZE // 2}
CALLS = 6
# doubles per rank: above the pool's window, several chunks
N = max(2 * CFG.threshold, 3 * CFG.chunk_size + 24) // 8
ROOTS = sorted({0, SIZE - 1})
UNTOUCHED = -7.0   # the gaps between a derived message's doubles
# The same doubles, as one element of a vector type described from a view
# of the array's first two elements only: the type reaches past that view,
# within the array (as [A[0, 1:], 1, column] for a column of a C matrix);
# legal, and mpi4py does not check it.
STRIDED = MPI.DOUBLE.Create_vector(N, 1, 2).Commit()


class Buf:
    """The message a rank passes for `n` doubles (`blocks` of them), plain
    or spaced, and what it holds."""

    def __init__(self, data: np.ndarray, derived: bool, blocks: int = 1) -> None:
        self.derived = derived
        if derived:
            self.raw = np.full(2 * data.size, UNTOUCHED)
            self.raw[::2] = data
            self.msg = [self.raw, data.size // blocks, SPACED]
        else:
            self.raw = data.copy()
            self.msg = self.raw

    def values(self) -> np.ndarray:
        return self.raw[::2].copy() if self.derived else self.raw.copy()

    def gaps_kept(self) -> bool:
        return not self.derived or bool(np.all(self.raw[1::2] == UNTOUCHED))


def vector(data: np.ndarray, counts: list[int], derived: bool) -> tuple[list, Buf]:
    """An Allgatherv receive message of blocks `counts`, in rank order with
    one element of room between blocks."""
    displs = [sum(counts[:i]) + i for i in range(SIZE)]
    room = np.full(sum(counts) + SIZE, UNTOUCHED)
    for i in range(SIZE):
        room[displs[i]:displs[i] + counts[i]] = data[sum(counts[:i]):sum(counts[:i + 1])]
    buf = Buf(room, derived)
    return [buf.raw, counts, displs, SPACED if derived else MPI.DOUBLE], buf


def run(name: str, call, pool_name: str | None = None) -> None:
    """`call(comm, seed)` -> (values, gaps kept) on fresh communicators,
    against the plain one (see fresh_against_stock)."""
    def differs(got, want):
        (values, kept), (expected, _) = got, want
        ok = kept and values.shape == expected.shape and np.allclose(values, expected, 1e-12)
        return "" if ok else f"gaps kept {kept}"
    fresh_against_stock(f"{name} with a derived datatype on ranks "
                        f"{sorted({SIZE - 1, SIZE // 2})}", call, differs, CALLS,
                        pool_name or name.lower())


@pytest.mark.parametrize("root", ROOTS)
@pytest.mark.parametrize("past", [False, True])
def test_bcast(root: int, past: bool) -> None:
    """`past`: the derived ranks' datatype reaches past the buffer object
    they pass (STRIDED).  Before, such a rank sent the call to MPI alone
    while the others set the pool up on the fresh communicator: they waited
    for ever, or took its message for their set-up's."""
    def call(c, seed):
        b = Buf(make_data(np.float64, N, seed) if RANK == root else np.zeros(N), DERIVED)
        c.Bcast([b.raw[:2], 1, STRIDED] if past and DERIVED else b.msg, root)
        return b.values(), b.gaps_kept()
    run("Bcast", call)


def test_allgather() -> None:
    def call(c, seed):
        s = Buf(make_data(np.float64, N, seed), DERIVED)
        r = Buf(np.zeros(N * SIZE), not DERIVED, SIZE)
        c.Allgather(s.msg, r.msg)
        return r.values(), r.gaps_kept()
    run("Allgather", call)


@pytest.mark.parametrize("mix", ["send", "every receive", "some receive, a stride",
                                 "some receive, counts inferred"])
def test_allgatherv(mix: str) -> None:
    """Derived send buffers on some ranks, or derived receive vectors --
    on every rank (MPICH's own ring algorithm truncates a large Allgatherv
    whose receive datatypes differ between ranks), or on some ranks with a
    smaller message: displacements as one int (the stride between
    blocks), counts inferred from the buffer (split evenly)."""
    some = mix.startswith("some")
    n = max(CFG.threshold, 16 << 10) // 8 if some else N
    counts = [n] * SIZE if some else [n + 3 * q for q in range(SIZE)]

    def call(c, seed):
        s = Buf(make_data(np.float64, counts[RANK], seed), DERIVED and mix == "send")
        if some:
            stride = n + 2 if "stride" in mix else n
            room = np.full(stride * SIZE, UNTOUCHED)
            r = Buf(room, DERIVED)
            dt = SPACED if DERIVED else MPI.DOUBLE
            msg = [r.raw, counts, stride, dt] if "stride" in mix else [r.raw, dt]
        else:
            msg, r = vector(np.zeros(sum(counts)), counts, mix == "every receive")
        c.Allgatherv(s.msg, msg)
        return r.values(), r.gaps_kept()
    run("Allgatherv", call)


def test_bcast_zero_extent() -> None:
    """The root sends one double N times (a datatype of extent 0), the
    others receive N doubles."""
    zero = MPI.DOUBLE.Create_resized(0, 0).Commit()
    root = SIZE - 1

    def call(c, seed):
        if RANK == root:
            one = make_data(np.float64, 1, seed)
            c.Bcast([one, N, zero], root)
            return np.full(N, one[0]), True
        b = np.zeros(N)
        c.Bcast(b, root)
        return b, True
    try:
        run("Bcast", call)
    finally:
        zero.Free()


@pytest.mark.parametrize("root", ROOTS)
def test_gather(root: int) -> None:
    def call(c, seed):
        s = Buf(make_data(np.float64, N, seed), DERIVED)
        r = Buf(np.zeros(N * SIZE), DERIVED, SIZE)
        c.Gather(s.msg, r.msg, root)
        return (r.values() if RANK == root else np.zeros(0)), r.gaps_kept()
    run("Gather", call)


@pytest.mark.parametrize("root", ROOTS)
def test_scatter(root: int) -> None:
    def call(c, seed):
        s = Buf(make_data(np.float64, N * SIZE, seed), DERIVED, SIZE)
        r = Buf(np.zeros(N), not DERIVED)
        c.Scatter(s.msg, r.msg, root)
        return r.values(), r.gaps_kept()
    run("Scatter", call)


def test_alltoall() -> None:
    def call(c, seed):
        s = Buf(make_data(np.float64, N * SIZE, seed), DERIVED, SIZE)
        r = Buf(np.zeros(N * SIZE), not DERIVED, SIZE)
        c.Alltoall(s.msg, r.msg)
        return r.values(), r.gaps_kept()
    run("Alltoall", call)
