"""Differential fuzzing of cxlmpi against stock MPI.

    mpiexec -n N python tools/fuzz.py [--ops 100000] [--seed S] [--max-count C]
                                      [--collectives Allreduce,Bcast,...]

Every rank draws the same seeded random program of collectives: which
collective, on which communicator (the wrapped COMM_WORLD, a wrapped dup of
it, a wrapped Dup of that, wrapped Split halves, a wrapped Split with the
ranks reversed), the element type, an op defined for it, the count (0 to
beyond a pool slot), the root, IN_PLACE or not, the message form, the
v-collectives' counts and displacements.  Each operation runs on the wrapped
communicator and on a plain one on the same MPI handle
(``MPI.Intracomm(wrapped)``), in a random order, on the same data, and the
results are compared: integers, bools, MAX/MIN and pure data movement
bit-identical, floating-point SUM/PROD within rounding; send buffers must
come back unchanged and the parts of a receive buffer MPI must not write
(displacement gaps, explicit-count tails) must keep their fill.

The parameters of operation i come from their own generator seeded with
(seed, i), so a program is the same on every rank whatever its
communicators' sizes, and ``--start I --ops 1`` replays operation I (after a
different history, though).  Rank 0 prints progress every ~10% and at the
end ``FUZZ ops=N mismatches=M seconds=T``; the exit status is 1 when an
operation mismatched on any rank (the first few are printed with their
parameters).  Set CXLMPI_* as usual; the test-sized pool of the test suite
is ``CXLMPI_POOL_SIZE=256K CXLMPI_CHUNK_SIZE=4K CXLMPI_THRESHOLD=64
CXLMPI_TUNING=pool``.
"""

from __future__ import annotations

import argparse
import math
import random
import sys
import time
import traceback
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

import numpy as np
from mpi4py import MPI

import cxlmpi
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


# ------------------------------------------------------------ the program


@dataclass
class Case:
    """One operation of the program, as seen by one rank."""

    index: int
    name: str
    comm_name: str
    size: int
    rank: int
    dtype: type
    op: Optional[MPI.Op]
    count: int
    root: int
    inplace: bool
    form: str
    vform: str
    stock_first: bool
    byte: bool
    u: int
    r: random.Random = field(repr=False)

    def describe(self) -> str:
        """The parameters, for a mismatch report."""
        op = "-" if self.op is None else OP_NAMES.get(self.op.handle, "?")
        return (f"op#{self.index} {self.name} comm={self.comm_name}(size {self.size}) "
                f"rank={self.rank} dtype={np.dtype(self.dtype).name} op={op} "
                f"count={self.count} root={self.root} in_place={self.inplace} "
                f"form={self.form!r} vform={self.vform!r} "
                f"{'stock' if self.stock_first else 'wrapped'} first")


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


class Fuzzer:
    """Runs the program on this rank and collects mismatches."""

    def __init__(self, seed: int, max_count: Optional[int],
                 collectives: tuple[str, ...], trace: bool = False) -> None:
        self.seed = seed
        self.trace = trace
        self.collectives = collectives
        world = MPI.COMM_WORLD
        self.wrank, self.wsize = world.Get_rank(), world.Get_size()
        wdup = cxlmpi.wrap(world.Dup())
        wrapped = {
            "world": cxlmpi.wrap(world),
            "wdup": wdup,
            "dup": wdup.Dup(),
            "half": wdup.Split(self.wrank % 2, self.wrank),
            "rev": wdup.Split(0, self.wsize - self.wrank),
        }
        self.owned = [c for k, c in wrapped.items() if k != "world"]
        for name, comm in wrapped.items():
            if not isinstance(comm, cxlmpi.CXLComm):
                raise SystemExit(f"fuzz: {name} is not wrapped: {type(comm)}")
        self.comms = [(name, comm, MPI.Intracomm(comm)) for name, comm in wrapped.items()]
        self.sizes = Sizes(self.wsize, max_count)
        self.source = Source(self.sizes.source_nbytes(), seed, self.wrank)
        self.mismatched: set[int] = set()
        self.reports: list[str] = []

    # -------------------------------------------------------------- drawing

    def case(self, index: int) -> tuple[Case, Any, Any]:
        """Draw operation `index` (every rank draws the same values)."""
        r = random.Random(self.seed * 1_000_003 + index)
        name = METHODS[r.randrange(len(METHODS))]
        comm_name, comm, plain = self.comms[r.randrange(len(self.comms))]
        dtype = DTYPES[r.randrange(len(DTYPES))]
        ops = ops_for(dtype)
        op = ops[r.randrange(len(ops))] if name in REDUCTIONS else None
        count = self.sizes.count(r, dtype)
        root = r.randrange(1 << 30)  # reduced modulo the size below: same draws
        inplace = r.random() < 0.3
        form = FORMS[r.randrange(len(FORMS))]
        vform = VFORMS[r.randrange(len(VFORMS))]
        stock_first = r.random() < 0.5
        byte = r.random() < 0.5
        u = r.getrandbits(48)
        size, rank = comm.Get_size(), comm.Get_rank()
        case = Case(index, name, comm_name, size, rank, dtype, op, count, root % size,
                    inplace, form, vform, stock_first, byte, u, r)
        return case, comm, plain

    # ------------------------------------------------------------- running

    def run(self, index: int) -> None:
        """Run operation `index` on both communicators and compare."""
        case, comm, plain = self.case(index)
        if case.name not in self.collectives:
            return
        if self.trace:
            sys.stderr.write(f"fuzz: world rank {self.wrank}: {case.describe()}\n")
            sys.stderr.flush()
        body: Callable[[Case, MPI.Intracomm, Cache], list[tuple[str, np.ndarray]]] = \
            getattr(self, "_" + case.name.lower())
        cache = Cache(self, case)
        outcome = {}
        order = [("stock", plain), ("wrapped", comm)]
        if not case.stock_first:
            order.reverse()
        for label, target in order:
            try:
                outcome[label] = body(case, target, cache)
            except FuzzerError:
                raise
            except Exception as exc:  # a mismatch to report, not the end of the run
                outcome[label] = exc
        self._compare(case, outcome["wrapped"], outcome["stock"])

    def _compare(self, case: Case, got: Any, want: Any) -> None:
        problems = []
        if isinstance(want, Exception):
            problems.append(f"stock raised {type(want).__name__}: {want}")
        if isinstance(got, Exception):
            problems.append(f"wrapped raised {type(got).__name__}: {got}")
        if not problems:
            for (label, g), (_, w) in zip(got, want):
                if not same(g, w, case.op):
                    problems.append(f"{label}: {difference(g, w)}")
        if problems:
            self.mismatched.add(case.index)
            if len(self.reports) < 5:
                self.reports.append(f"{case.describe()}\n    " + "\n    ".join(problems))

    # ------------------------------------------------------- message forms

    def msg(self, case: Case, arr: np.ndarray, blocks: int = 1) -> Any:
        """`arr` in the case's message form; `blocks`: the number of equal
        blocks it holds (a receive buffer of Allgather, say), whose explicit
        count is that of one block."""
        if case.form == "buf":
            return arr
        if case.form == "memoryview":
            return memoryview(arr)
        dtype = mpi_type(case.dtype, case.byte)
        if case.form == "buf,type":
            return [arr, dtype]
        if case.form == "buf,count,type":
            return [arr, arr.size // blocks, dtype]
        return [arr, (arr.size // blocks, 0), dtype]

    def framed(self, case: Case, cache: Cache, key: str, n: int,
               content: Optional[np.ndarray] = None) -> tuple[np.ndarray, Any]:
        """A message of `n` elements (`content`, else the fill) and the whole
        array it lies in: in the explicit-count forms, between a head (the
        displacement of ``[buf, (count, displ), type]``) and a tail of up to
        two elements that MPI must leave alone."""
        def frame() -> tuple[int, int]:
            explicit = case.form in ("buf,count,type", "buf,(count,displ),type")
            head = case.r.randrange(3) if case.form == "buf,(count,displ),type" else 0
            return head, case.r.randrange(3) if explicit else 0

        head, tail = cache.get(key, frame)
        whole = filled(case.dtype, head + n + tail)
        if content is not None:
            whole[head:head + n] = content
        if head == tail == 0:
            return whole, self.msg(case, whole)
        dtype = mpi_type(case.dtype, case.byte)
        if case.form == "buf,count,type":
            return whole, [whole, n, dtype]
        return whole, [whole, (n, head), dtype]

    def vmsg(self, case: Case, arr: np.ndarray, counts: list[int],
             displs: Optional[list[int]]) -> Any:
        """A v-collective message: `displs` None means contiguous blocks."""
        if displs is None:
            return [arr, counts]
        if case.vform == "buf,counts,displs,type":
            return [arr, counts, displs, mpi_type(case.dtype, case.byte)]
        return [arr, (counts, displs)]

    def layout(self, case: Case, counts: list[int]) -> tuple[Optional[list[int]], int]:
        """Displacements for `counts` (None: contiguous, in the [buf, counts]
        form) and the buffer length: blocks in a random order with gaps."""
        if case.vform == "buf,counts":
            return None, sum(counts)
        order = list(range(len(counts)))
        case.r.shuffle(order)
        displs = [0] * len(counts)
        pos = 0
        for q in order:
            pos += case.r.randrange(3)
            displs[q] = pos
            pos += counts[q]
        return displs, pos + case.r.randrange(3)

    def vcounts(self, case: Case, block: int) -> list[int]:
        """A count per rank, each up to twice `block`, some zero."""
        return [0 if case.r.random() < 0.15 else case.r.randrange(2 * block + 1)
                for _ in range(case.size)]

    # --------------------------------------------------------- collectives

    def _barrier(self, case: Case, comm: MPI.Intracomm, cache: Cache) -> list:
        comm.Barrier()
        return []

    def _bcast(self, case: Case, comm: MPI.Intracomm, cache: Cache) -> list:
        x = cache.data("x", case.count) if case.rank == case.root else None
        buf, msg = self.framed(case, cache, "buf", case.count, x)
        comm.Bcast(msg, case.root)
        return [("buf", buf)]

    def _allreduce(self, case: Case, comm: MPI.Intracomm, cache: Cache) -> list:
        x = cache.data("x", case.count)
        if case.inplace:
            recv, rmsg = self.framed(case, cache, "recv", case.count, x)
            comm.Allreduce(MPI.IN_PLACE, rmsg, case.op)
            return [("recv", recv)]
        send, smsg = self.framed(case, cache, "send", case.count, x)
        recv, rmsg = self.framed(case, cache, "recv", case.count)
        comm.Allreduce(smsg, rmsg, case.op)
        return [("recv", recv), ("send", send)]

    def _reduce(self, case: Case, comm: MPI.Intracomm, cache: Cache) -> list:
        x = cache.data("x", case.count)
        if case.rank != case.root:
            send = x.copy()
            comm.Reduce(self.msg(case, send), None, case.op, case.root)
            return [("send", send)]
        if case.inplace:
            recv = x.copy()
            comm.Reduce(MPI.IN_PLACE, self.msg(case, recv), case.op, case.root)
            return [("recv", recv)]
        send, recv = x.copy(), filled(case.dtype, case.count)
        comm.Reduce(self.msg(case, send), self.msg(case, recv), case.op, case.root)
        return [("recv", recv), ("send", send)]

    def _scan(self, case: Case, comm: MPI.Intracomm, cache: Cache,
              exclusive: bool = False) -> list:
        x = cache.data("x", case.count)
        call = comm.Exscan if exclusive else comm.Scan
        defined = not exclusive or case.rank > 0  # Exscan: rank 0's result undefined
        if case.inplace:
            recv = x.copy()
            call(MPI.IN_PLACE, self.msg(case, recv), case.op)
            return [("recv", recv)] if defined else []
        send, recv = x.copy(), filled(case.dtype, case.count)
        call(self.msg(case, send), self.msg(case, recv), case.op)
        return ([("recv", recv)] if defined else []) + [("send", send)]

    def _exscan(self, case: Case, comm: MPI.Intracomm, cache: Cache) -> list:
        return self._scan(case, comm, cache, exclusive=True)

    def _allgather(self, case: Case, comm: MPI.Intracomm, cache: Cache) -> list:
        block = case.count // case.size
        x = cache.data("x", block)
        recv = filled(case.dtype, block * case.size)
        if case.inplace:
            recv[case.rank * block:(case.rank + 1) * block] = x
            comm.Allgather(MPI.IN_PLACE, self.msg(case, recv, blocks=case.size))
            return [("recv", recv)]
        send = x.copy()
        comm.Allgather(self.msg(case, send), self.msg(case, recv, blocks=case.size))
        return [("recv", recv), ("send", send)]

    def _gather(self, case: Case, comm: MPI.Intracomm, cache: Cache) -> list:
        block = case.count // case.size
        x = cache.data("x", block)
        if case.rank != case.root:
            send = x.copy()
            comm.Gather(self.msg(case, send), None, case.root)
            return [("send", send)]
        recv = filled(case.dtype, block * case.size)
        if case.inplace:
            recv[case.rank * block:(case.rank + 1) * block] = x
            comm.Gather(MPI.IN_PLACE, self.msg(case, recv, blocks=case.size), case.root)
            return [("recv", recv)]
        send = x.copy()
        comm.Gather(self.msg(case, send), self.msg(case, recv, blocks=case.size),
                    case.root)
        return [("recv", recv), ("send", send)]

    def _allgatherv(self, case: Case, comm: MPI.Intracomm, cache: Cache) -> list:
        counts = cache.get("counts", lambda: self.vcounts(case, case.count // (2 * case.size)))
        displs, length = cache.get("layout", lambda: self.layout(case, counts))
        mine = counts[case.rank]
        x = cache.data("x", mine)
        recv = filled(case.dtype, length)
        if case.inplace:
            at = sum(counts[:case.rank]) if displs is None else displs[case.rank]
            recv[at:at + mine] = x
            comm.Allgatherv(MPI.IN_PLACE, self.vmsg(case, recv, counts, displs))
            return [("recv", recv)]
        send = x.copy()
        comm.Allgatherv(self.msg(case, send), self.vmsg(case, recv, counts, displs))
        return [("recv", recv), ("send", send)]

    def _gatherv(self, case: Case, comm: MPI.Intracomm, cache: Cache) -> list:
        counts = cache.get("counts", lambda: self.vcounts(case, case.count // (2 * case.size)))
        displs, length = cache.get("layout", lambda: self.layout(case, counts))
        mine = counts[case.rank]
        x = cache.data("x", mine)
        if case.rank != case.root:
            send = x.copy()
            comm.Gatherv(self.msg(case, send), None, case.root)
            return [("send", send)]
        recv = filled(case.dtype, length)
        if case.inplace:
            at = sum(counts[:case.rank]) if displs is None else displs[case.rank]
            recv[at:at + mine] = x
            comm.Gatherv(MPI.IN_PLACE, self.vmsg(case, recv, counts, displs), case.root)
            return [("recv", recv)]
        send = x.copy()
        comm.Gatherv(self.msg(case, send), self.vmsg(case, recv, counts, displs), case.root)
        return [("recv", recv), ("send", send)]

    def _scatter(self, case: Case, comm: MPI.Intracomm, cache: Cache) -> list:
        block = case.count // case.size
        recv = filled(case.dtype, block)
        if case.rank != case.root:
            comm.Scatter(None, self.msg(case, recv), case.root)
            return [("recv", recv)]
        send = cache.data("x", block * case.size).copy()
        if case.inplace:
            comm.Scatter(self.msg(case, send, blocks=case.size), MPI.IN_PLACE, case.root)
            return [("send", send)]
        comm.Scatter(self.msg(case, send, blocks=case.size), self.msg(case, recv),
                     case.root)
        return [("recv", recv), ("send", send)]

    def _scatterv(self, case: Case, comm: MPI.Intracomm, cache: Cache) -> list:
        counts = cache.get("counts", lambda: self.vcounts(case, case.count // (2 * case.size)))
        displs, length = cache.get("layout", lambda: self.layout(case, counts))
        recv = filled(case.dtype, counts[case.rank])
        if case.rank != case.root:
            comm.Scatterv(None, self.msg(case, recv), case.root)
            return [("recv", recv)]
        send = cache.data("x", length).copy()
        if case.inplace:
            comm.Scatterv(self.vmsg(case, send, counts, displs), MPI.IN_PLACE, case.root)
            return [("send", send)]
        comm.Scatterv(self.vmsg(case, send, counts, displs), self.msg(case, recv), case.root)
        return [("recv", recv), ("send", send)]

    def _alltoall(self, case: Case, comm: MPI.Intracomm, cache: Cache) -> list:
        block = case.count // case.size // case.size
        x = cache.data("x", block * case.size)
        if case.inplace:
            recv = x.copy()
            comm.Alltoall(MPI.IN_PLACE, self.msg(case, recv, blocks=case.size))
            return [("recv", recv)]
        send, recv = x.copy(), filled(case.dtype, block * case.size)
        comm.Alltoall(self.msg(case, send, blocks=case.size),
                      self.msg(case, recv, blocks=case.size))
        return [("recv", recv), ("send", send)]

    def _alltoallv(self, case: Case, comm: MPI.Intracomm, cache: Cache) -> list:
        def matrix() -> list[list[int]]:
            # m[s][d]: elements rank s sends to rank d (symmetric in place:
            # then every rank sends and receives the same counts).
            cap = 2 * case.count // (case.size * case.size)
            m = [[case.r.randrange(cap + 1) for _ in range(case.size)]
                 for _ in range(case.size)]
            if case.inplace:
                m = [[m[min(s, d)][max(s, d)] for d in range(case.size)]
                     for s in range(case.size)]
            return m

        m = cache.get("matrix", matrix)
        scounts = m[case.rank]
        rcounts = [m[s][case.rank] for s in range(case.size)]
        rdispls, rlength = cache.get("rlayout", lambda: self.layout(case, rcounts))
        recv = filled(case.dtype, rlength)
        if case.inplace:
            recv[:] = cache.data("x", rlength)
            comm.Alltoallv(MPI.IN_PLACE, self.vmsg(case, recv, rcounts, rdispls))
            return [("recv", recv)]
        sdispls, slength = cache.get("slayout", lambda: self.layout(case, scounts))
        send = cache.data("x", slength).copy()
        comm.Alltoallv(self.vmsg(case, send, scounts, sdispls),
                       self.vmsg(case, recv, rcounts, rdispls))
        return [("recv", recv), ("send", send)]

    def _reduce_scatter_block(self, case: Case, comm: MPI.Intracomm, cache: Cache) -> list:
        block = case.count // case.size
        x = cache.data("x", block * case.size)
        if case.inplace:
            recv = x.copy()
            comm.Reduce_scatter_block(MPI.IN_PLACE, self.msg(case, recv, blocks=case.size),
                                      case.op)
            return [("recv", recv[:block])]  # the rest of recvbuf is undefined
        send, recv = x.copy(), filled(case.dtype, block)
        comm.Reduce_scatter_block(self.msg(case, send, blocks=case.size),
                                  self.msg(case, recv), case.op)
        return [("recv", recv), ("send", send)]

    def _reduce_scatter(self, case: Case, comm: MPI.Intracomm, cache: Cache) -> list:
        def draw_counts() -> list[int]:
            counts = self.vcounts(case, case.count // (2 * case.size))
            if case.inplace:
                # Stock MPICH 5.0.2 aborts ("memcpy argument memory ranges
                # overlap", its large-message in-place path) when some rank's
                # count exceeds its displacement, the sum of the counts
                # before it: the largest count goes first.
                top = counts.index(max(counts))
                counts[0], counts[top] = counts[top], counts[0]
            return counts

        counts = cache.get("counts", draw_counts)
        given = cache.get("given", lambda: case.inplace or case.r.random() < 0.85)
        total, mine = sum(counts), counts[case.rank]
        x = cache.data("x", total)
        if case.inplace:
            recv = x.copy()
            comm.Reduce_scatter(MPI.IN_PLACE, self.msg(case, recv), counts, case.op)
            return [("recv", recv[:mine])]  # the rest of recvbuf is undefined
        send, recv = x.copy(), filled(case.dtype, mine)
        comm.Reduce_scatter(self.msg(case, send), self.msg(case, recv),
                            counts if given else None, case.op)
        return [("recv", recv), ("send", send)]

    # ------------------------------------------------------------- summary

    def free(self) -> None:
        """Free the communicators this fuzzer created."""
        for comm in reversed(self.owned):
            comm.Free()


class Cache:
    """What both runs of one operation must share: drawn extras (drawn once,
    on the first run) and this rank's data."""

    def __init__(self, fuzzer: Fuzzer, case: Case) -> None:
        self.fuzzer = fuzzer
        self.case = case
        self.values: dict[str, Any] = {}

    def get(self, key: str, make: Callable[[], Any]) -> Any:
        """The value under `key`, made on first use."""
        if key not in self.values:
            self.values[key] = make()
        return self.values[key]

    def data(self, key: str, n: int) -> np.ndarray:
        """`n` elements of this rank's data for this operation (read-only:
        copy before handing it to MPI)."""
        case, f = self.case, self.fuzzer
        arr = self.get(key, lambda: f.source.values(case.dtype, case.op, n,
                                                    case.u + 7919 * f.wrank, f.wsize))
        arr.flags.writeable = False
        return arr


def main(argv: Optional[list[str]] = None) -> int:
    """Run the program; returns the exit status (1 on any mismatch)."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ops", type=int, default=100000, help="operations (default 100000)")
    ap.add_argument("--seed", type=int, default=0, help="program seed (default 0)")
    ap.add_argument("--start", type=int, default=0,
                    help="index of the first operation (default 0)")
    ap.add_argument("--max-count", type=int, default=None,
                    help="largest element count (default: up to 1.25 pool slots)")
    ap.add_argument("--collectives", default=",".join(METHODS),
                    help="comma-separated subset to run (the others are drawn, not run)")
    ap.add_argument("--trace", action="store_true",
                    help="every rank prints each operation before running it (stderr)")
    opts = ap.parse_args(argv)
    chosen = tuple(c for c in opts.collectives.split(",") if c)
    unknown = sorted(set(chosen) - set(METHODS))
    if unknown:
        ap.error(f"unknown collectives {unknown}")
    if opts.max_count is not None and opts.max_count < 0:
        ap.error("--max-count must be >= 0")

    world = MPI.COMM_WORLD
    fuzzer = Fuzzer(opts.seed, opts.max_count, chosen, opts.trace)
    rank = fuzzer.wrank
    if rank == 0:
        cfg = config.get()
        print(f"fuzz: {fuzzer.wsize} ranks, seed {opts.seed}, ops {opts.ops}, "
              f"pool {cfg.pool_size} B, chunk {cfg.chunk_size} B, threshold "
              f"{cfg.threshold} B, tuning {cfg.tuning}, slot {fuzzer.sizes.slot} B, "
              f"largest message {fuzzer.sizes.max_nbytes} B", flush=True)
    world.Barrier()
    t0 = time.perf_counter()
    step = max(1, opts.ops // 10)
    for k in range(opts.ops):
        try:
            fuzzer.run(opts.start + k)
        except FuzzerError:
            traceback.print_exc()
            sys.stderr.flush()
            world.Abort(2)
        done = k + 1
        if done % step == 0 and done < opts.ops:
            bad = set().union(*world.allgather(fuzzer.mismatched))
            if rank == 0:
                print(f"fuzz: {100 * done // opts.ops}% ops={done} mismatches={len(bad)} "
                      f"seconds={time.perf_counter() - t0:.1f}", flush=True)
    world.Barrier()
    seconds = time.perf_counter() - t0
    fuzzer.free()
    if rank == 0:
        calls = {name: row["pool_calls"] for name, row in cxlmpi.stats().items()
                 if isinstance(row, dict) and row.get("pool_calls")}
        print("fuzz: rank 0's pool calls: "
              + (", ".join(f"{k}={v}" for k, v in calls.items()) or "none"), flush=True)
    everyone = world.allgather((fuzzer.mismatched, fuzzer.reports))
    bad = set().union(*(m for m, _ in everyone))
    if rank == 0:
        shown = 0
        for other, (_, reports) in enumerate(everyone):
            for report in reports[:3]:
                if shown < 8:
                    print(f"MISMATCH (world rank {other}) {report}", flush=True)
                    shown += 1
        print(f"FUZZ ops={opts.ops} mismatches={len(bad)} seconds={seconds:.1f}", flush=True)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
