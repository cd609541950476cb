"""The data of tools/fuzz.py: the collectives, element types, ops and
message forms it draws from, the message sizes that matter under the
settings in force, each rank's random values, and how results compare
(bit-identical, or within rounding for floating-point SUM/PROD)."""

from __future__ import annotations

import math
import random
from typing import Optional

import numpy as np
from mpi4py import MPI

from cxlmpi import _pool, config

METHODS = ("Allreduce", "Reduce", "Bcast", "Allgather", "Allgatherv", "Gather",
               "Gatherv", "Scatter", "Scatterv", "Alltoall", "Alltoallv",
               "Reduce_scatter_block", "Reduce_scatter", "Scan", "Exscan", "Barrier")
REDUCTIONS = frozenset({"Allreduce", "Reduce", "Reduce_scatter_block", "Reduce_scatter",
                        "Scan", "Exscan"})

INT_TYPES = (np.int8, np.int16, np.int32, np.int64,
             np.uint8, np.uint16, np.uint32, np.uint64)
FLOAT_TYPES = (np.float32, np.float64)
COMPLEX_TYPES = (np.complex64, np.complex128)
DTYPES = (*INT_TYPES, *FLOAT_TYPES, *COMPLEX_TYPES, np.bool_)

ARITH_OPS = (MPI.SUM, MPI.PROD)
ORDER_OPS = (MPI.MAX, MPI.MIN)
LOGICAL_OPS = (MPI.LAND, MPI.LOR, MPI.LXOR)
BITWISE_OPS = (MPI.BAND, MPI.BOR, MPI.BXOR)
OP_NAMES = {op.handle: name for op, name in [
    (MPI.SUM, "SUM"), (MPI.PROD, "PROD"), (MPI.MAX, "MAX"), (MPI.MIN, "MIN"),
    (MPI.LAND, "LAND"), (MPI.LOR, "LOR"), (MPI.LXOR, "LXOR"),
    (MPI.BAND, "BAND"), (MPI.BOR, "BOR"), (MPI.BXOR, "BXOR")]}

# Message forms (mpi4py's): the buffer alone, [buf, type], [buf, count, type]
# (with a tail MPI must not touch), [buf, (count, 0), type], a memoryview.
FORMS = ("buf", "buf,type", "buf,count,type", "buf,(count,displ),type", "memoryview")
# v-collective forms: [buf, counts] (contiguous), [buf, (counts, displs)],
# [buf, counts, displs, type].
VFORMS = ("buf,counts", "buf,(counts,displs)", "buf,counts,displs,type")

FILL = 0xA5  # fill byte of receive buffers (a finite value for every float type)


def ops_for(dtype: type) -> tuple[MPI.Op, ...]:
    """The predefined ops MPI defines on `dtype` (numpy uint8 is MPI.BYTE to
    mpi4py: bitwise ops only; bool: logical ops; complex: SUM and PROD)."""
    if dtype is np.bool_:
        return LOGICAL_OPS
    if dtype is np.uint8:
        return BITWISE_OPS
    if dtype in INT_TYPES:
        return ARITH_OPS + ORDER_OPS + LOGICAL_OPS + BITWISE_OPS
    if dtype in FLOAT_TYPES:
        return ARITH_OPS + ORDER_OPS
    return ARITH_OPS


def mpi_type(dtype: type, byte: bool) -> MPI.Datatype:
    """The MPI datatype of `dtype` for an explicit-type message form (numpy
    uint8: MPI.BYTE when `byte`, else MPI.UNSIGNED_CHAR)."""
    if dtype is np.uint8 and byte:
        return MPI.BYTE
    return MPI.Datatype.fromcode(np.dtype(dtype).char)


# ---------------------------------------------------------------- the data


class FuzzerError(RuntimeError):
    """A bug of the fuzzer itself (not a mismatch): the job is aborted, since
    the ranks may no longer run the same program."""


class Source:
    """This rank's random bytes; every operation's data is a cheap function
    of a slice of them at a drawn offset (so ranks hold different data and
    operations differ from one another)."""

    def __init__(self, nbytes: int, seed: int, rank: int) -> None:
        rng = np.random.default_rng([seed, rank, 0x5EED])
        self.raw = rng.integers(0, 256, nbytes + 16, dtype=np.uint8)

    def _take(self, nbytes: int, u: int) -> np.ndarray:
        room = self.raw.size - nbytes
        if room < 8:
            raise FuzzerError(f"data source too small for {nbytes} bytes")
        off = (u % (room - 7)) & ~7
        return self.raw[off:off + nbytes]

    def values(self, dtype: type, op: Optional[MPI.Op], n: int, u: int,
               wsize: int) -> np.ndarray:
        """`n` elements of `dtype` that no op of this job overflows: sums of
        `wsize` integers stay in range, products of floats near 1, and so on."""
        dt = np.dtype(dtype)
        if dtype is np.bool_:
            return (self._take(n, u) & 1).astype(np.bool_)
        if dt.kind in "iu":
            if op is None or op in ORDER_OPS or op in BITWISE_OPS:
                return self._take(n * dt.itemsize, u).view(dt).copy()  # any bits
            raw = self._take(n, u)
            if op is MPI.SUM:
                lim = min(100, int(np.iinfo(dt).max) // max(wsize, 1))
                if dt.kind == "i":
                    return (raw.astype(np.int16) % (2 * lim + 1) - lim).astype(dt)
                return (raw % (lim + 1)).astype(dt)
            if op is MPI.PROD:
                table = [1, 1, 1, 2] if wsize <= 6 else [1, 1, 1]
                if dt.kind == "i":
                    table.append(-1)
                return np.array(table, dt)[raw % len(table)]
            return (raw % 3).astype(dt)  # logical ops: zeros, ones and others
        if dt.kind == "f":
            u16 = self._take(2 * n, u).view(np.uint16).astype(dt)
            if op is MPI.PROD:
                return 1 + (u16 - 32767.5) * (1 / 2 ** 18)
            return (u16 - 32767.5) * (1 / 8192)
        part = dt.type(0).real.dtype
        u16 = self._take(4 * n, u).view(np.uint16).astype(part)
        scale = 1 / 2 ** 18 if op is MPI.PROD else 1 / 8192
        vals = ((u16[:n] - 32767.5) * scale + (u16[n:] - 32767.5) * scale * 1j).astype(dt)
        return vals + 1 if op is MPI.PROD else vals


def filled(dtype: type, n: int) -> np.ndarray:
    """A receive buffer of `n` elements holding the fill pattern."""
    arr = np.empty(n, dtype)
    if dtype is np.bool_:
        arr[:] = True
    else:
        arr.view(np.uint8)[:] = FILL
    return arr


def same(got: np.ndarray, want: np.ndarray, op: Optional[MPI.Op]) -> bool:
    """Bit-identical, except floating-point SUM/PROD: within rounding."""
    if got.shape != want.shape or got.dtype != want.dtype:
        return False
    if got.dtype.kind in "fc" and op in ARITH_OPS:
        tol = 1e-4 if got.dtype in (np.float32, np.complex64) else 1e-10
        return bool(np.allclose(got, want, rtol=tol, atol=tol))
    return bool(np.array_equal(got, want))


def difference(got: np.ndarray, want: np.ndarray) -> str:
    """Where two same-shaped arrays first differ, for a report."""
    if got.shape != want.shape or got.dtype != want.dtype:
        return f"shape/dtype {got.shape}/{got.dtype} != {want.shape}/{want.dtype}"
    if got.dtype.kind in "fc":
        differs = ~np.isclose(got, want, rtol=1e-10, atol=1e-10)
    else:
        differs = got != want
    where = np.flatnonzero(differs)
    if where.size == 0:
        return "equal within 1e-10, not within the type's tolerance"
    i = int(where[0])
    return (f"{where.size} of {got.size} elements differ, first at [{i}]: "
            f"got {got[i]!r} want {want[i]!r}")


class Sizes:
    """Message sizes that matter under the settings in force: zero and
    tiny, around the threshold and the window edges, one to a few chunks,
    log-uniform up to the largest, and around a pool slot."""

    def __init__(self, wsize: int, max_count: Optional[int]) -> None:
        cfg = config.get()
        self.threshold = cfg.threshold
        self.chunk = cfg.chunk_size
        self.slot = _pool.Pool.layout(max(wsize, 2), cfg.pool_size)[1]
        edges = {cfg.threshold}
        for window in cfg.windows().values():
            if window is not None:
                edges.update(e for e in window if e is not None)
        self.edges = sorted(edges)
        self.max_count = max_count
        # Beyond a slot (and its pipelining), within reason for the default pool.
        self.max_nbytes = self.slot + self.slot // 4 + 4096 if max_count is None \
            else 16 * max_count

    def nbytes(self, r: random.Random) -> int:
        """A message size in bytes (the same on every rank), at most
        `max_nbytes`."""
        x = r.random()
        if x < 0.05:
            n = 0
        elif x < 0.20:
            n = r.randrange(1, 128)
        elif x < 0.40:
            n = r.randrange(self.threshold // 2, 2 * self.threshold + 64)
        elif x < 0.64:
            n = r.randrange(self.chunk // 2, 3 * self.chunk + 64)
        elif x < 0.82:
            n = int(math.exp(r.uniform(math.log(64), math.log(max(self.max_nbytes, 64)))))
        elif x < 0.99:
            n = max(0, r.choice(self.edges) + r.randrange(-64, 65))
        else:
            n = r.randrange(min(max(0, self.slot - self.chunk), self.max_nbytes),
                            self.max_nbytes + 1)
        return min(n, self.max_nbytes)

    def count(self, r: random.Random, dtype: type) -> int:
        """An element count of `dtype` for the drawn size."""
        n = self.nbytes(r) // np.dtype(dtype).itemsize
        return n if self.max_count is None else min(n, self.max_count)

    def source_nbytes(self) -> int:
        """Bytes of random data every draw fits in (vector totals reach
        twice the count)."""
        return 2 * self.max_nbytes + (1 << 16)
