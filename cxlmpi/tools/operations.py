"""The collectives the benchmark measures (cxlmpi.tools.bench): how each is
called and with which buffers, and the check that cxlmpi's result is stock
MPI's (--validate)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np
from mpi4py import MPI

import cxlmpi

__all__ = ["BENCHMARKS", "DEFAULT_OPS", "BUFFER_KINDS", "ROOT", "Collective", "Buffers",
           "BenchError", "allocate", "make_buffers", "fill_pattern", "cases_to_measure",
           "describe_mismatch", "problems_at_root", "validate"]

ROOT = 0


@dataclass
class Buffers:
    """The message buffers of one rank for one collective.  For Bcast `send`
    is the broadcast buffer and `recv` is None."""

    send: np.ndarray | None
    recv: np.ndarray | None

    def output(self) -> np.ndarray | None:
        """The buffer holding the collective's result."""
        return self.recv if self.recv is not None else self.send


Binder = Callable[[MPI.Intracomm, Buffers], tuple[Callable[..., Any], tuple[Any, ...]]]


@dataclass(frozen=True)
class Collective:
    """How to benchmark one collective.

    `counts(n, nranks)` gives the element counts of the send and receive
    buffers (0: none) for a message of `n` elements; `bind(comm, buffers)`
    gives the method and arguments of one call; `defined(rank, nranks)`
    says whether the result on `rank` is defined (compared by --validate)."""

    name: str
    dtype: str  # numpy dtype: "f8" for reductions, "u1" (MPI.BYTE) for data movement
    counts: Callable[[int, int], tuple[int, int]]
    bind: Binder
    defined: Callable[[int, int], bool]
    block_divides: bool = False  # the message must split into nranks equal blocks

    @property
    def itemsize(self) -> int:
        return np.dtype(self.dtype).itemsize

    @property
    def stat_key(self) -> str:
        """Name of the collective in cxlmpi.stats()."""
        return self.name.lower()

    def message_size(self, requested: int, nranks: int) -> int:
        """The size actually measured for `requested` bytes: whole elements
        (and whole blocks per rank where the collective needs that), at
        least one of each."""
        if self.name == "Barrier":
            return 0
        unit = self.itemsize * (nranks if self.block_divides else 1)
        return max(unit, requested // unit * unit)


def _everywhere(rank: int, nranks: int) -> bool:
    return True


def _at_root(rank: int, nranks: int) -> bool:
    return rank == ROOT


def _not_first(rank: int, nranks: int) -> bool:
    return rank > 0


def _same(n: int, p: int) -> tuple[int, int]:
    return n, n


def _sum(op: str) -> Binder:
    def bind(comm: MPI.Intracomm, b: Buffers) -> tuple[Callable[..., Any], tuple[Any, ...]]:
        method = getattr(comm, op)
        if op == "Reduce":
            return method, (b.send, b.recv, MPI.SUM, ROOT)
        return method, (b.send, b.recv, MPI.SUM)
    return bind


def _pair(op: str, rooted: bool = False) -> Binder:
    def bind(comm: MPI.Intracomm, b: Buffers) -> tuple[Callable[..., Any], tuple[Any, ...]]:
        method = getattr(comm, op)
        return method, ((b.send, b.recv, ROOT) if rooted else (b.send, b.recv))
    return bind


def _bind_bcast(comm: MPI.Intracomm, b: Buffers) -> tuple[Callable[..., Any], tuple[Any, ...]]:
    return comm.Bcast, (b.send, ROOT)


def _bind_bcast_view(comm: MPI.Intracomm, b: Buffers
                     ) -> tuple[Callable[..., Any], tuple[Any, ...]]:
    """cxlmpi's broadcast by reference against stock's Bcast of the same
    buffer (the views are checked in the test suite, not here)."""
    if isinstance(comm, cxlmpi.CXLComm):
        return comm.Bcast_view, (b.send, ROOT)
    return comm.Bcast, (b.send, ROOT)


def _bind_barrier(comm: MPI.Intracomm, b: Buffers) -> tuple[Callable[..., Any], tuple[Any, ...]]:
    return comm.Barrier, ()


# The collectives this tool measures, by mpi4py method name (`--ops`).
BENCHMARKS: dict[str, Collective] = {c.name: c for c in (
    Collective("Allreduce", "f8", _same, _sum("Allreduce"), _everywhere),
    Collective("Reduce", "f8", _same, _sum("Reduce"), _at_root),
    Collective("Bcast", "u1", lambda n, p: (n, 0), _bind_bcast, _everywhere),
    Collective("Allgather", "u1", lambda n, p: (n, n * p), _pair("Allgather"), _everywhere),
    Collective("Gather", "u1", lambda n, p: (n, n * p), _pair("Gather", True), _at_root),
    Collective("Scatter", "u1", lambda n, p: (n * p, n), _pair("Scatter", True), _everywhere),
    Collective("Alltoall", "u1", lambda n, p: (n * p, n * p), _pair("Alltoall"), _everywhere),
    Collective("Reduce_scatter_block", "f8", lambda n, p: (n, n // p),
               _sum("Reduce_scatter_block"), _everywhere, block_divides=True),
    Collective("Scan", "f8", _same, _sum("Scan"), _everywhere),
    Collective("Exscan", "f8", _same, _sum("Exscan"), _not_first),
    Collective("Barrier", "u1", lambda n, p: (0, 0), _bind_barrier, _everywhere),
    Collective("Bcast_view", "u1", lambda n, p: (n, 0), _bind_bcast_view, _at_root),
)}

DEFAULT_OPS = ("Allreduce", "Bcast")

# ---------------------------------------------------------------- buffers

BUFFER_KINDS = ("private", "pool")


class BenchError(Exception):
    """A problem with the request, found alike on every rank (exit status 2)."""


def allocate(kind: str, count: int, dtype: str, comm: MPI.Intracomm) -> np.ndarray:
    """One message buffer of `count` elements of `dtype`, of buffer `kind`:
    "private" (a numpy array of this process) or "pool" (an array resident in
    the pool of `comm`: collective, every rank allocates alike)."""
    if kind == "private":
        return np.empty(count, dtype)
    if kind == "pool":
        return cxlmpi.empty(count, dtype, comm=comm)
    raise BenchError(f"unknown buffer kind {kind!r} (use one of {', '.join(BUFFER_KINDS)})")


def make_buffers(op: Collective, count: int, kind: str, comm: MPI.Intracomm) -> Buffers:
    """The buffers of `op` for a message of `count` elements, filled with this
    rank's pattern (which also touches every page before timing)."""
    nsend, nrecv = op.counts(count, comm.Get_size())
    send = allocate(kind, nsend, op.dtype, comm) if nsend else None
    recv = allocate(kind, nrecv, op.dtype, comm) if nrecv else None
    for buf in (send, recv):
        if buf is not None:
            fill_pattern(buf, comm.Get_rank())
    return Buffers(send, recv)


def fill_pattern(buf: np.ndarray, rank: int) -> None:
    """Rank- and position-dependent small integers (exact in float64, so
    every sum is exact whatever the order)."""
    index = np.arange(buf.size)
    if buf.dtype.kind == "f":
        buf[...] = index % 13 + rank + 1
    else:
        buf[...] = (index * 7 + rank * 31 + 1) % 251


SENTINEL = {"f": -7.0, "u": 0xEE}



def cases_to_measure(ops: Sequence[Collective], sizes: Sequence[int], nranks: int
           ) -> list[tuple[Collective, int]]:
    """(collective, requested size) to measure: Barrier once, and each
    collective's sizes after rounding without repeats."""
    cases = []
    for op in ops:
        seen: set[int] = set()
        for size in sizes[:1] if op.name == "Barrier" else sizes:
            actual = op.message_size(size, nranks)
            if actual not in seen:
                seen.add(actual)
                cases.append((op, size))
    return cases



def describe_mismatch(expected: np.ndarray, got: np.ndarray) -> str | None:
    """None when the arrays are equal (np.array_equal), else what differs."""
    if np.array_equal(expected, got):
        return None
    if expected.shape != got.shape:
        return f"shapes differ: {expected.shape} vs {got.shape}"
    bad = np.flatnonzero(expected != got)
    i = int(bad[0])
    return (f"{bad.size} of {expected.size} elements differ, first at [{i}]: "
            f"stock {expected[i].item()!r}, cxlmpi {got[i].item()!r}")


def validate(op: Collective, count: int, kind: str, stock: MPI.Intracomm,
             wrapped: MPI.Intracomm) -> list[str] | None:
    """Run `op` once on each communicator with the same data and compare
    the results where defined.  On rank 0: the problems found, one line per
    rank ([] when none); None on the other ranks."""
    rank, nranks = stock.Get_rank(), stock.Get_size()
    outputs = []
    for comm in (stock, wrapped):
        bufs = make_buffers(op, count, kind, wrapped)
        sentinel = SENTINEL[np.dtype(op.dtype).kind]
        if bufs.recv is not None:
            bufs.recv[...] = sentinel
        elif bufs.send is not None and rank != ROOT:  # Bcast: the others receive
            bufs.send[...] = sentinel
        fn, args = op.bind(comm, bufs)
        fn(*args)
        outputs.append(bufs.output())
    problem = None
    if op.defined(rank, nranks) and outputs[0] is not None and outputs[1] is not None:
        problem = describe_mismatch(outputs[0], outputs[1])
    return problems_at_root(stock, problem)


def problems_at_root(comm: MPI.Intracomm, problem: str | None) -> list[str] | None:
    """Collective: every rank's `problem` (None: none) gathered on rank 0,
    one line per rank that has one; None on the other ranks."""
    found = comm.gather(problem, root=0)
    if found is None:
        return None
    return [f"rank {r}: {text}" for r, text in enumerate(found) if text is not None]

