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
import random
import sys
import time
import traceback
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

import numpy as np
from fuzz_data import (
    DTYPES,
    FORMS,
    METHODS,
    OP_NAMES,
    REDUCTIONS,
    VFORMS,
    FuzzerError,
    Sizes,
    Source,
    difference,
    filled,
    mpi_type,
    ops_for,
    same,
)
from mpi4py import MPI

import cxlmpi
from cxlmpi import config

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
